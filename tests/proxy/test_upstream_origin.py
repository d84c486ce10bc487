"""Where an upstream's requests go: an origin and a base URL read from the upstream's URL, its TLS
settings and the environment's forward proxies, and connections opened to them against real
sockets (a name's addresses raced, a Unix socket)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime
import os
import socket
import ssl
import tempfile
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import cast

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from proxy.config_upstream import UpstreamConfig, UpstreamTLS
from proxy.errors import ConfigError
from proxy.upstream_origin import (
    Address,
    BaseURL,
    ForwardProxy,
    Origin,
    Resolver,
    bypassed,
    environment_proxies,
    origin_for,
)


def test_an_origin_takes_the_schemes_default_port_and_a_tls_context_only_for_https() -> None:
    plain = Origin.of("http://vllm.internal/v1")
    secure = Origin.of("https://vllm.internal:8443/v1")
    assert (plain.scheme, plain.host, plain.port, plain.tls) == ("http", "vllm.internal", 80, None)
    assert (secure.host, secure.port) == ("vllm.internal", 8443)
    assert secure.tls is not None


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://h/v1", "h"),
        ("http://h:80/v1", "h"),
        ("https://h:443/v1", "h"),
        ("http://h:8000/v1", "h:8000"),
        ("http://[::1]:8000/v1", "[::1]:8000"),
        ("https://[::1]/v1", "[::1]"),
        ("http://user:pw@h:8000/v1", "h:8000"),
        ("unix:///run/vllm.sock", "localhost"),
    ],
)
def test_the_host_header_names_the_port_only_when_it_is_not_the_schemes_default(
    url: str, host: str
) -> None:
    assert Origin.of(url).host_header == host


@pytest.mark.parametrize(
    "url",
    [
        "ftp://h/v1",
        "/v1",
        "http:///v1",
        "unix://run/vllm.sock",  # a host, not an absolute path
        "unix:relative.sock",
        "unix:///run/vllm.sock:v1",  # a base path must be absolute
    ],
)
def test_anything_but_an_absolute_http_or_unix_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match=r"not an http|not a unix"):
        Origin.of(url)


# -- the environment's forward proxies ------------------------------------------------------------

_ENVIRONMENTS = [
    {},
    {"HTTP_PROXY": "http://a:3128", "HTTPS_PROXY": "http://b:3128", "NO_PROXY": "x"},
    {"HTTP_PROXY": "http://upper:1", "http_proxy": "http://lower:2"},
    {"HTTPS_PROXY": "http://upper:1", "https_proxy": ""},  # empty lower case unsets
    {"HTTP_PROXY": "http://cgi:1", "REQUEST_METHOD": "GET"},  # a CGI client's Proxy: header
    {"http_proxy": "http://kept:1", "REQUEST_METHOD": "GET", "ALL_PROXY": "http://all:1"},
    {"no_proxy": "*", "NO_PROXY": "ignored", "PATH": "/bin"},
]


@pytest.mark.parametrize("environ", _ENVIRONMENTS)
def test_environment_proxies_read_a_mapping_as_the_standard_library_reads_the_environment(
    environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.lower().endswith("_proxy") or name == "REQUEST_METHOD":
            monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert environment_proxies(environ) == urllib.request.getproxies_environment()


@pytest.mark.parametrize(
    ("host", "port", "no_proxy", "exempt"),
    [
        ("vllm.internal", 8000, "vllm.internal", True),
        ("vllm.internal", 8000, "VLLM.Internal", True),
        ("gpu1.vllm.internal", 8000, ".vllm.internal", True),  # a suffix, dot or not
        ("gpu1.vllm.internal", 8000, "vllm.internal", True),
        ("notvllm.internal", 8000, "vllm.internal", False),
        ("vllm.internal", 8000, "vllm.internal:8000", True),  # a port: that port only
        ("vllm.internal", 8001, "vllm.internal:8000", False),
        ("vllm.internal", 8000, "*", True),
        ("vllm.internal", 8000, "other, vllm.internal ", True),
        ("10.1.2.3", 8000, "10.0.0.0/8", True),  # CIDR blocks and addresses
        ("11.1.2.3", 8000, "10.0.0.0/8", False),
        ("::1", 8000, "::1", True),
        ("::1", 8000, "[::1]", True),
        ("fd00::5", 8000, "fd00::/8", True),
        ("vllm.internal", 8000, "", False),
        ("vllm.internal", 8000, "10.0.0.0/8", False),
    ],
)
def test_no_proxy_exempts_names_suffixes_ports_and_address_blocks(
    host: str, port: int, no_proxy: str, exempt: bool
) -> None:
    assert bypassed(host, port, no_proxy) is exempt


def test_an_origin_goes_through_the_proxy_its_scheme_names_unless_exempt() -> None:
    proxies = {"http": "http://plain:3128", "https": "http://tunnel:3128", "no": "direct.lan"}
    assert Origin.of("http://vllm/v1", proxies=proxies).proxy == ForwardProxy("plain", 3128, None)
    assert Origin.of("https://vllm/v1", proxies=proxies).proxy == ForwardProxy("tunnel", 3128, None)
    assert Origin.of("http://direct.lan/v1", proxies=proxies).proxy is None
    assert Origin.of("http://vllm/v1", proxies={"all": "proxy:8080"}).proxy == ForwardProxy(
        "proxy", 8080, None
    )
    assert Origin.of("http://vllm/v1", proxies={"https": "http://tunnel:1"}).proxy is None
    assert Origin.of("http://vllm/v1").proxy is None


def test_only_a_plain_origin_behind_a_proxy_sends_absolute_form_and_the_credentials() -> None:
    proxies = {"http": "http://u%40corp:p%3Aw@proxy:3128", "https": "http://u:p@proxy:3128"}
    plain = Origin.of("http://vllm:8000/v1", proxies=proxies)
    prefix, headers = plain.forward
    assert prefix == "http://vllm:8000"
    # The userinfo, percent-decoded, as Basic credentials.
    assert headers == {"proxy-authorization": "Basic " + base64.b64encode(b"u@corp:p:w").decode()}
    assert Origin.of("https://vllm/v1", proxies=proxies).forward == ("", {})  # in the tunnel
    assert Origin.of("http://vllm/v1").forward == ("", {})


def test_a_proxy_is_named_without_its_credentials_and_only_http_proxies_are_spoken() -> None:
    assert str(ForwardProxy.of("http://alice:s3cret@proxy:3128")) == "http://proxy:3128"
    assert str(ForwardProxy.of("proxy")) == "http://proxy:80"
    with pytest.raises(ValueError, match="only http://") as refused:
        ForwardProxy.of("socks5://alice:s3cret@proxy:1080")
    assert "s3cret" not in str(refused.value)


def test_unusable_tls_files_and_proxies_are_configuration_errors_naming_the_upstream(
    tmp_path: Path,
) -> None:
    missing = str(tmp_path / "missing.pem")
    config = UpstreamConfig(
        name="gpu", base_url="https://vllm/v1", tls=UpstreamTLS(ca_file=missing)
    )
    with pytest.raises(ConfigError, match=f"upstream 'gpu': its tls files \\({missing}\\)"):
        origin_for(config)
    plain = UpstreamConfig(name="cpu", base_url="http://vllm/v1")
    with pytest.raises(ConfigError, match="upstream 'cpu': only http:// forward proxies"):
        origin_for(plain, {"http": "socks5://proxy:1080"})


def test_only_a_host_name_is_resolved_an_address_is_connected_to_as_it_is() -> None:
    assert Origin.of("http://vllm.internal:8000/v1").named
    assert not Origin.of("http://127.0.0.1:8000/v1").named
    assert not Origin.of("http://[::1]:8000/v1").named


@pytest.mark.parametrize(
    ("url", "socket_path", "target"),
    [
        ("unix:///run/vllm.sock", "/run/vllm.sock", "/v1/chat/completions"),
        ("unix:///run/vllm.sock:/openai/v1", "/run/vllm.sock", "/openai/v1/chat/completions"),
        ("unix:///run/my%20vllm.sock:/", "/run/my vllm.sock", "/chat/completions"),
    ],
)
def test_a_unix_url_names_the_socket_and_a_base_path_v1_unless_it_gives_one(
    url: str, socket_path: str, target: str
) -> None:
    base = BaseURL.of(url)
    assert base.origin.socket_path == socket_path
    assert base.target("chat/completions")[1] == target


@pytest.mark.parametrize(
    ("base_url", "path", "target"),
    [
        ("http://h/v1", "chat/completions", "/v1/chat/completions"),
        ("http://h/v1", "/tokenize", "/tokenize"),
        ("http://h/v1", "models?limit=5", "/v1/models?limit=5"),
        (
            "https://h/openai/v1?api-version=2024-10-21",
            "chat/completions",
            "/openai/v1/chat/completions?api-version=2024-10-21",
        ),
        ("http://h/v1?api-version=1", "models", "/v1/models?api-version=1"),
        ("http://h/v1?api-version=1", "models?limit=5", "/v1/models?api-version=1&limit=5"),
        # The configured parameter wins over the request's own of the same name.
        ("http://h/v1?api-version=1", "models?api-version=2&x=y", "/v1/models?api-version=1&x=y"),
        ("http://h/v1?api-version=1", "/health", "/health?api-version=1"),
        ("http://h/v1", "files/a b", "/v1/files/a%20b"),
        ("http://h/my%20vllm/v1", "models", "/my%20vllm/v1/models"),
        ("unix:///run/v.sock?api-version=1", "models?x=2", "/v1/models?api-version=1&x=2"),
        ("unix:///run/v.sock:/openai/v1?api-version=1", "/health", "/openai/health?api-version=1"),
    ],
)
def test_a_requests_target_is_the_base_path_then_its_own_with_the_base_urls_query_kept(
    base_url: str, path: str, target: str
) -> None:
    assert BaseURL.of(base_url).target(path)[1] == target


def test_userinfo_is_basic_auth_and_never_part_of_a_shown_url() -> None:
    base = BaseURL.of("http://al%40ice:p%3Ass@h:8000/v1")
    assert base.authorization == "Basic " + base64.b64encode(b"al@ice:p:ss").decode()
    assert base.target("models") == ("http://h:8000/v1/models", "/v1/models")
    assert BaseURL.of("http://h/v1").authorization is None
    assert BaseURL.of("http://@h/v1").authorization is None
    assert BaseURL.of("unix:///run/v.sock").target("models")[0] == "unix:///run/v.sock:/v1/models"


# -- connections, on real sockets


@contextlib.contextmanager
def black_hole(host: str) -> Iterator[int]:
    """A port on `host` where a connection is never answered: a listener with a backlog of none,
    filled by one connection, so the kernel drops every later SYN (as a firewall that drops
    packets does). Yields the port."""
    with socket.socket() as listener, socket.socket() as filler:
        listener.bind((host, 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        filler.connect((host, port))
        yield port


class Recorder(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one, not a subclass


def resolving_to(*hosts: str) -> Resolver:
    async def resolve(name: str, port: int) -> Sequence[Address]:
        assert name == "upstream.test"
        return [(socket.AF_INET, (host, port)) for host in hosts]

    return resolve


async def test_a_name_whose_first_address_is_black_holed_connects_to_the_next_in_time() -> None:
    loop = asyncio.get_running_loop()
    with black_hole("127.0.0.2") as port:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)
        async with server:
            origin = Origin.of(
                f"http://upstream.test:{port}/v1",
                resolve=resolving_to("127.0.0.2", "127.0.0.1"),
            )
            # Far below the time a black-holed SYN waits; without the race it would be spent.
            async with asyncio.timeout(5):
                connection = await origin.connect(loop, Recorder)
            assert connection.transport is not None
            assert connection.transport.get_extra_info("peername") == ("127.0.0.1", port)
            connection.transport.close()


async def test_a_name_none_of_whose_addresses_connects_fails_naming_each() -> None:
    with socket.socket() as one, socket.socket() as two:  # bound, not listening: refused
        one.bind(("127.0.0.1", 0))
        port = one.getsockname()[1]
        two.bind(("127.0.0.3", port))
        origin = Origin.of(
            f"http://upstream.test:{port}/v1",
            resolve=resolving_to("127.0.0.1", "127.0.0.3"),
        )
        with pytest.raises(ConnectionRefusedError, match=r"127\.0\.0\.1: .*; 127\.0\.0\.3: "):
            await origin.connect(asyncio.get_running_loop(), Recorder)


async def test_a_name_that_resolves_to_nothing_fails_as_the_socket_does() -> None:
    async def nothing(name: str, port: int) -> Sequence[Address]:
        return []

    origin = Origin.of("http://upstream.test:1/v1", resolve=nothing)
    with pytest.raises(OSError, match=r"'upstream\.test' resolved to no address"):
        await origin.connect(asyncio.get_running_loop(), Recorder)


def tls_contexts(name: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server's context with a self-signed certificate for `name`, and a client's trusting it."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    with tempfile.TemporaryDirectory() as folder:
        cert_file, key_file = Path(folder, "cert.pem"), Path(folder, "key.pem")
        cert_file.write_bytes(pem)
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(cert_file, key_file)
    client = ssl.create_default_context(cadata=pem.decode())
    return server, client


async def test_tls_to_a_resolved_name_verifies_the_name_not_the_address() -> None:
    loop = asyncio.get_running_loop()
    for certified, connects in (("upstream.test", True), ("other.test", False)):
        server_context, client_context = tls_contexts(certified)
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0, ssl=server_context)
        async with server:
            port = server.sockets[0].getsockname()[1]
            named = Origin.of(f"https://upstream.test:{port}/v1", resolve=resolving_to("127.0.0.1"))
            origin = dataclasses.replace(named, tls=client_context)
            if connects:
                connection = await origin.connect(loop, Recorder)
                assert connection.transport is not None
                assert connection.transport.get_extra_info("ssl_object").server_hostname == (
                    "upstream.test"
                )
                connection.transport.close()
            else:
                with pytest.raises(ssl.SSLCertVerificationError, match=r"upstream\.test"):
                    await origin.connect(loop, Recorder)
