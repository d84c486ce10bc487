"""Where an upstream's requests go: an origin read from its base URL, its TLS settings and the
environment's forward proxies."""

from __future__ import annotations

import base64
import os
import urllib.request
from pathlib import Path

import pytest

from proxy.config_upstream import UpstreamConfig, UpstreamTLS
from proxy.errors import ConfigError
from proxy.upstream_origin import ForwardProxy, Origin, bypassed, environment_proxies, origin_for


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
    ],
)
def test_the_host_header_names_the_port_only_when_it_is_not_the_schemes_default(
    url: str, host: str
) -> None:
    assert Origin.of(url).host_header == host


@pytest.mark.parametrize("url", ["ftp://h/v1", "unix:///run/vllm.sock", "/v1", "http:///v1"])
def test_anything_but_an_absolute_http_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
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
