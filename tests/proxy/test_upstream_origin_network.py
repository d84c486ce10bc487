"""How the upstream client reaches its upstream, against real components: Debian's tinyproxy as
the environment's forward proxy (plain requests in absolute form, `CONNECT` tunnels, Basic
credentials, NO_PROXY), and TLS servers with a private CA, a required client certificate, or a
self-signed certificate (`tls` settings of an upstream)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp.web
import openai
import pytest

from proxy.config_upstream import UpstreamConfig, UpstreamTLS
from proxy.errors import UpstreamConnectError
from proxy.testing import completion, free_port
from proxy.upstream import HttpUpstream
from proxy.upstream_origin import environment_proxies
from tests.processes import port_options, reported_port, stop_process, tail
from tests.proxy.builders import make_request
from tests.proxy.certificates import Certificates, issue, self_signed
from tests.proxy.conftest import RunningUpstream
from tests.proxy.forward_proxy import BINARY, MISSING, Tinyproxy, tinyproxy
from tests.require import needs

needs_tinyproxy = needs("tinyproxy", MISSING if BINARY is None else None)
OPENSSL = shutil.which("openssl")
OPENSSL_MISSING = (
    "openssl is not installed: install Debian's package openssl (apt-get install openssl) to "
    "run the mutual TLS test"
)
PATH = "chat/completions"


@dataclass
class Recording:
    """An upstream on loopback that answers every request `{"ok": 1}` and keeps what it saw."""

    url: str
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    @property
    def vias(self) -> list[str | None]:
        """Each request's `via` header: tinyproxy adds its own to what it forwards."""
        return [headers.get("via") for _, _, headers in self.seen]


@asynccontextmanager
async def recording(context: ssl.SSLContext | None = None) -> AsyncIterator[Recording]:
    """A `Recording` upstream on a free loopback port, over TLS with `context` when given."""

    async def answer(request: aiohttp.web.Request) -> aiohttp.web.Response:
        await request.read()
        headers = {name.lower(): value for name, value in request.headers.items()}
        upstream.seen.append((request.method, request.path, headers))
        return aiohttp.web.json_response({"ok": 1})

    app = aiohttp.web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = aiohttp.web.AppRunner(app, access_log=None)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    scheme = "http" if context is None else "https"
    upstream = Recording(f"{scheme}://127.0.0.1:{runner.addresses[0][1]}")
    try:
        yield upstream
    finally:
        await runner.cleanup()


def server_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    """A server's TLS context; with `client_ca`, a client certificate it signed is required."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(client_ca)
    return context


@asynccontextmanager
async def client(
    base_url: str, proxies: dict[str, str] | None = None, **tls: object
) -> AsyncIterator[HttpUpstream]:
    """An HttpUpstream named 'u' for `base_url`, with `tls` settings, through `proxies`."""
    config = UpstreamConfig(name="u", base_url=base_url, tls=UpstreamTLS.model_validate(tls))
    upstream = HttpUpstream(config, api_key=None, retries=0, proxies=proxies)
    try:
        yield upstream
    finally:
        await upstream.close()


async def ask(upstream: HttpUpstream) -> object:
    answer = await upstream.request("POST", PATH, body=b"{}", headers={})
    assert answer.status == 200, answer.body
    return answer.json()


@pytest.fixture
def certificates(tmp_path: Path) -> Certificates:
    return issue(tmp_path)


@pytest.fixture
def forward_proxy(tmp_path: Path) -> Iterator[Tinyproxy]:
    if BINARY is None:
        pytest.skip(MISSING)  # the mark below fails it instead under CI
    with tinyproxy(tmp_path) as running:
        yield running


@pytest.fixture
def guarded_proxy(tmp_path: Path) -> Iterator[Tinyproxy]:
    """A tinyproxy that asks for Basic credentials (alice, s3cret)."""
    if BINARY is None:
        pytest.skip(MISSING)
    with tinyproxy(tmp_path, ("alice", "s3cret")) as running:
        yield running


# -- the environment's forward proxy --------------------------------------------------------------


@needs_tinyproxy
async def test_a_plain_upstream_is_reached_through_the_http_proxy_with_absolute_form_requests(
    forward_proxy: Tinyproxy,
) -> None:
    proxies = environment_proxies({"HTTP_PROXY": forward_proxy.url})
    async with recording() as upstream, client(f"{upstream.url}/v1", proxies) as through:
        assert await ask(through) == {"ok": 1}
        assert await ask(through) == {"ok": 1}
    assert [path for _, path, _ in upstream.seen] == ["/v1/chat/completions"] * 2
    assert all(via and "tinyproxy" in via for via in upstream.vias)
    # What tinyproxy was sent: the whole URL on the request line.
    assert f"POST {upstream.url}/v1/chat/completions HTTP/1.1" in forward_proxy.log()


@needs_tinyproxy
@pytest.mark.parametrize(
    ("host", "entry"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.0.0.1", "127.0.0.0/8"),  # a CIDR block
        ("localhost", ".internal, LOCALHOST"),  # a name, among others
        ("localhost", "localhost:{port}"),  # a name with its port
    ],
)
async def test_no_proxy_sends_a_matching_upstream_straight_there(
    forward_proxy: Tinyproxy, host: str, entry: str
) -> None:
    async with recording() as upstream:
        port = upstream.url.rsplit(":", 1)[1]
        base_url = f"http://{host}:{port}/v1"
        environ = {"HTTP_PROXY": forward_proxy.url, "NO_PROXY": entry.format(port=port)}
        async with client(base_url, environment_proxies(environ)) as direct:
            assert await ask(direct) == {"ok": 1}
        # An entry for another port exempts that port only: this one goes through the proxy.
        environ["NO_PROXY"] = f"{host}:1"
        async with client(base_url, environment_proxies(environ)) as through:
            assert await ask(through) == {"ok": 1}
    assert upstream.vias[0] is None
    assert upstream.vias[1] is not None
    assert "tinyproxy" in upstream.vias[1]
    assert forward_proxy.log().count("Request (file descriptor") == 1


@needs_tinyproxy
async def test_an_https_upstream_is_reached_through_a_connect_tunnel_and_checked_with_its_ca_file(
    forward_proxy: Tinyproxy, certificates: Certificates
) -> None:
    context = server_context(certificates.server_cert, certificates.server_key)
    proxies = environment_proxies({"HTTPS_PROXY": forward_proxy.url})
    async with recording(context) as upstream:
        async with client(f"{upstream.url}/v1", proxies, ca_file=str(certificates.ca)) as tls:
            assert await ask(tls) == {"ok": 1}
            assert await ask(tls) == {"ok": 1}  # on the same tunnel, kept alive
        # Without the CA the server's certificate is refused, tunnel or not.
        async with client(f"{upstream.url}/v1", proxies) as untrusting:
            with pytest.raises(UpstreamConnectError, match="certificate verify failed"):
                await ask(untrusting)
    assert len(upstream.seen) == 2
    assert upstream.vias == [None, None]  # inside the tunnel the proxy sees only bytes
    port = upstream.url.rsplit(":", 1)[1]
    assert forward_proxy.log().count(f"CONNECT 127.0.0.1:{port} HTTP/1.1") == 2


@needs_tinyproxy
async def test_proxy_credentials_from_the_proxy_url_are_sent_and_a_refusal_names_the_proxy(
    guarded_proxy: Tinyproxy, certificates: Certificates
) -> None:
    context = server_context(certificates.server_cert, certificates.server_key)
    tls = {"ca_file": str(certificates.ca)}
    wrong = guarded_proxy.url.replace("s3cret", "guessed")
    async with recording() as plain, recording(context) as secure:
        async with client(f"{plain.url}/v1", {"http": guarded_proxy.url}) as allowed:
            assert await ask(allowed) == {"ok": 1}
        async with client(f"{secure.url}/v1", {"https": guarded_proxy.url}, **tls) as allowed:
            assert await ask(allowed) == {"ok": 1}
        # Without credentials: 407, a plain request's answer or CONNECT's. Wrong ones: tinyproxy
        # answers 401, which only CONNECT's answer can tell from the upstream's own 401.
        connect = f"answered CONNECT {secure.url.removeprefix('https://')} with"
        refusals = [
            (plain, {}, {"http": guarded_proxy.bare_url}, "answered 407"),
            (secure, tls, {"https": guarded_proxy.bare_url}, f"{connect} 407 Proxy Authentication"),
            (secure, tls, {"https": wrong}, f"{connect} 401"),
        ]
        for upstream, settings, proxies, answer in refusals:
            async with client(f"{upstream.url}/v1", proxies, **settings) as refused:
                with pytest.raises(UpstreamConnectError) as refusal:
                    await ask(refused)
            message = str(refusal.value)
            assert f"through the proxy ({upstream.url}/v1/{PATH}): ProxyRefused" in message
            assert f"the proxy {guarded_proxy.bare_url} {answer}" in message, message
            assert "guessed" not in message
    assert len(plain.seen) == len(secure.seen) == 1


async def test_an_unreachable_proxy_is_a_connect_error_that_names_it(refused_port: int) -> None:
    proxy = f"http://alice:s3cret@127.0.0.1:{refused_port}"
    async with client("http://upstream.invalid/v1", {"http": proxy}) as through:
        with pytest.raises(UpstreamConnectError) as failure:
            await ask(through)
    message = str(failure.value)
    assert f"the proxy http://127.0.0.1:{refused_port} cannot be reached" in message, message
    assert "s3cret" not in message


# -- TLS settings of an upstream ------------------------------------------------------------------


@contextmanager
def openssl_server(certificates: Certificates) -> Iterator[str]:
    """`openssl s_server` on a free loopback port, requiring a client certificate the CA signed
    (an answer to any GET: its status page); its base URL. A refused handshake ends with the TLS
    alert that says why, which OpenSSL's own server always sends."""
    assert OPENSSL is not None
    port = free_port()
    command = [OPENSSL, "s_server", "-quiet", "-www", "-accept", f"127.0.0.1:{port}"]
    command += ["-cert", str(certificates.server_cert), "-key", str(certificates.server_key)]
    command += ["-CAfile", str(certificates.ca), "-Verify", "1", "-verify_return_error"]
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60  # a safety net: a busy machine starts it late
        while process.poll() is None and time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.02)
        assert process.poll() is None, f"openssl s_server exited with {process.returncode}"
        yield f"https://127.0.0.1:{port}/v1"
    finally:
        stop_process(process, timeout=10)


@needs("openssl", OPENSSL_MISSING if OPENSSL is None else None)
async def test_mutual_tls_shows_the_client_certificate_and_without_one_is_refused_clearly(
    certificates: Certificates,
) -> None:
    ca = str(certificates.ca)
    mine = {
        "client_cert": str(certificates.client_cert),
        "client_key": str(certificates.client_key),
    }
    with openssl_server(certificates) as url:
        async with client(url, ca_file=ca, **mine) as shown:
            answer = await shown.request("GET", "models", body=None, headers={})
        async with client(url, ca_file=ca) as anonymous:
            with pytest.raises(UpstreamConnectError) as refusal:
                await anonymous.request("GET", "models", body=None, headers={})
    assert answer.status == 200
    assert b"s_server" in answer.body  # its status page: the request went through
    message = str(refusal.value)
    assert "upstream 'u'" in message
    assert "alert certificate required" in message, message


async def test_verify_false_trusts_a_self_signed_certificate_that_is_refused_otherwise(
    tmp_path: Path,
) -> None:
    context = server_context(*self_signed(tmp_path))
    async with recording(context) as upstream:
        async with client(f"{upstream.url}/v1", verify=False) as trusting:
            assert await ask(trusting) == {"ok": 1}
        async with client(f"{upstream.url}/v1") as checking:
            with pytest.raises(UpstreamConnectError, match="certificate verify failed"):
                await ask(checking)
    assert len(upstream.seen) == 1


# -- the real command ------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


@needs_tinyproxy
def test_serve_sends_upstream_requests_through_the_environments_proxy_and_warns_of_verify_false(
    forward_proxy: Tinyproxy, upstream: RunningUpstream, tmp_path: Path
) -> None:
    # `toolsentry serve` with HTTP_PROXY in its environment, as behind a corporate egress
    # proxy: the chat completion goes through tinyproxy. An upstream whose certificate is not
    # checked is named in a warning at start.
    config = tmp_path / "toolsentry.yaml"
    config.write_text(
        "upstreams:\n"
        f"  - {{name: behind, base_url: '{upstream.base_url}'}}\n"
        "  - {name: unchecked, base_url: 'https://127.0.0.1:9/v1', models: [other],"
        " tls: {verify: false}}\n"
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TOOLSENTRY_")}
    environ.update(HTTP_PROXY=forward_proxy.url, NO_PROXY="")
    port_file, log_path = tmp_path / "serve.port", tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config),
             *port_options(port_file)],
            cwd=REPO, env=environ, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            port = reported_port(process, port_file, tail(log_path))
            upstream.script.push(completion("through the egress proxy"))
            with openai.OpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, timeout=60
            ) as client:
                answer = client.chat.completions.create(**make_request())
        finally:
            stop_process(process, timeout=20)
    assert answer.choices[0].message.content == "through the egress proxy"
    assert f"POST {upstream.base_url}/chat/completions HTTP/1.1" in forward_proxy.log()
    warnings = [
        json.loads(line)
        for line in log_path.read_text().splitlines()
        if '"upstream_tls_unverified"' in line
    ]
    assert [w["upstream"] for w in warnings] == ["unchecked"]


async def test_a_proxys_407_read_whole_at_once_is_still_the_proxys_refusal() -> None:
    # tinyproxy's answer comes in pieces; a proxy that writes its 407 in one piece, and keeps
    # the connection open, must be refused the same way (not passed on as the upstream's 407).
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 407 Proxy Authentication Required\r\n"
            b"proxy-authenticate: Basic\r\ncontent-length: 0\r\n\r\n"
        )
        await writer.drain()
        await reader.read()
        writer.close()

    listening = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    try:
        async with client("http://vllm.internal/v1", {"http": f"127.0.0.1:{port}"}) as through:
            with pytest.raises(UpstreamConnectError, match=f"127.0.0.1:{port} answered 407"):
                await ask(through)
            with pytest.raises(UpstreamConnectError, match=f"127.0.0.1:{port} answered 407"):
                async with through.stream(PATH, body=b"{}", headers={}):
                    pass
    finally:
        listening.close()
        await listening.wait_closed()
