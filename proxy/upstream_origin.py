"""Where an upstream's requests go and how a connection to it is opened: `Origin`, the one seam
for TCP, TLS (its options are `proxy.tls`'s), environment proxies and (to come) Unix sockets.

Whether an origin goes through a forward proxy is decided once, when it is made (`Origin.of`),
from the `*_proxy` variables read by the standard library's rules (`environment_proxies`,
`bypassed`): a plain http origin's requests go to the proxy in absolute form (`Origin.forward`),
an https origin's connections through a `CONNECT` tunnel with TLS over it. A direct origin opens
its connections as before, and nothing of this runs per request.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import unquote, urlsplit

# Public in the standard library for decades, missing from typeshed's stubs.
from urllib.request import proxy_bypass_environment  # type: ignore[attr-defined]

from proxy.config_upstream import UpstreamConfig
from proxy.errors import ConfigError
from proxy.tls import client_context
from proxy.upstream_errors import ProxyRefused

_DEFAULT_PORTS = {"http": 80, "https": 443}
_P = TypeVar("_P", bound=asyncio.BaseProtocol)
# A proxy's answer to CONNECT is a status line and a few headers; more is not a proxy talking.
_MAX_TUNNEL_ANSWER = 64 * 1024


def environment_proxies(environ: Mapping[str, str]) -> dict[str, str]:
    """The `<scheme>_proxy` variables of `environ` by scheme (`http`, `https`, `all`, `no`, …),
    by the rules of the standard library's `urllib.request.getproxies_environment` (which reads
    only `os.environ`; a test keeps the two equal): a lower-case name beats its upper-case one,
    an empty value unsets it, and `HTTP_PROXY` is ignored when `REQUEST_METHOD` is set (a CGI
    request may set it from a client's `Proxy:` header)."""
    proxies: dict[str, str] = {}
    for name, value in environ.items():
        if value and name[-6:].lower() == "_proxy":
            proxies[name[:-6].lower()] = value
    if "REQUEST_METHOD" in environ:
        proxies.pop("http", None)
    for name, value in environ.items():
        if name[-6:] == "_proxy":
            if value:
                proxies[name[:-6].lower()] = value
            else:
                proxies.pop(name[:-6].lower(), None)
    return proxies


def bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Whether `no_proxy` (NO_PROXY's value) exempts `host:port` from the proxy: the standard
    library's rules (`urllib.request.proxy_bypass_environment`: `*`, a name, or a domain suffix
    with or without its leading dot, each with a port or not) and, which the standard library
    does not read, an IP address inside an entry's address or CIDR block (`10.0.0.0/8`, `::1`)."""
    if not no_proxy.strip():
        return False
    named = f"[{host}]" if ":" in host else host
    if proxy_bypass_environment(f"{named}:{port}", {"no": no_proxy}):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    for entry in no_proxy.split(","):
        try:
            network = ipaddress.ip_network(entry.strip().strip("[]"), strict=False)
        except ValueError:
            continue
        if address in network:
            return True
    return False


def origin_for(config: UpstreamConfig, proxies: Mapping[str, str] | None = None) -> Origin:
    """Where `config`'s requests go (`Origin`): an https base URL with a TLS context made from
    its `tls` settings, through the forward proxy `proxies` (`environment_proxies`) name for it.
    Raises ConfigError, naming the upstream, for TLS files that cannot be used or a proxy URL
    that is not http."""
    tls = None
    if config.base_url.startswith("https://"):
        settings = config.tls
        try:
            tls = client_context(
                ca_file=settings.ca_file,
                client_cert=settings.client_cert,
                client_key=settings.client_key,
                verify=settings.verify,
            )
        except OSError as exc:  # ssl.SSLError is one
            files = [settings.ca_file, settings.client_cert, settings.client_key]
            raise ConfigError(
                f"upstream '{config.name}': its tls files ({', '.join(f for f in files if f)}) "
                f"cannot be used: {exc}"
            ) from None
    try:
        return Origin.of(config.base_url, tls=tls, proxies=proxies)
    except ValueError as exc:
        raise ConfigError(f"upstream '{config.name}': {exc}") from None


@dataclass(frozen=True, slots=True)
class ForwardProxy:
    """An HTTP proxy an origin's connections go through: where it is, and the
    `proxy-authorization` (Basic) its URL's user and password make, None without them."""

    host: str
    port: int
    authorization: str | None

    @classmethod
    def of(cls, url: str) -> ForwardProxy:
        """The proxy a `*_proxy` variable names: an http URL, or a bare `host:port` (read as
        http://, as curl does). Raises ValueError for any other scheme (https and socks proxies
        are not spoken here), never repeating the URL's password."""
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname:
            shown = f"{parts.scheme}://{parts.hostname or ''}"
            raise ValueError(f"only http:// forward proxies are supported, not {shown}")
        authorization = None
        if parts.username is not None:
            secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            authorization = "Basic " + base64.b64encode(secret.encode()).decode("ascii")
        return cls(parts.hostname, parts.port or 80, authorization)

    def __str__(self) -> str:
        # What messages name: never the credentials.
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Origin:
    """Where the requests go: scheme, host, port, the TLS context for https, and the forward
    proxy they go through (None: straight there)."""

    scheme: str
    host: str
    port: int
    tls: ssl.SSLContext | None
    proxy: ForwardProxy | None = None

    @classmethod
    def of(
        cls,
        url: str,
        *,
        tls: ssl.SSLContext | None = None,
        proxies: Mapping[str, str] | None = None,
    ) -> Origin:
        """The origin of an absolute http(s) URL: `tls` for https (the system's defaults when
        None), through the proxy `proxies` (`environment_proxies`) names for its scheme (or
        `all`) unless their `no` entry exempts it. Raises ValueError for any other URL, and for a
        proxy that is not an http URL."""
        parts = urlsplit(url)
        if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or _DEFAULT_PORTS[parts.scheme]
        if parts.scheme != "https":
            tls = None
        elif tls is None:
            tls = client_context()
        proxy = None
        if proxies:
            proxy_url = proxies.get(parts.scheme) or proxies.get("all")
            if proxy_url and not bypassed(parts.hostname, port, proxies.get("no", "")):
                proxy = ForwardProxy.of(proxy_url)
        return cls(parts.scheme, parts.hostname, port, tls, proxy)

    async def connect(self, loop: asyncio.AbstractEventLoop, protocol: Callable[[], _P]) -> _P:
        """Open a connection to this origin, `protocol()` reading it: the one place that says
        how the upstream is reached (TCP, TLS over it for https; through a forward proxy, a
        plain connection to it, or a `CONNECT` tunnel with TLS over it). Unix sockets
        (`loop.create_unix_connection`) belong here and in `of`; nothing above `Pool` changes.
        Raises OSError (refused, unreachable, TLS) as the socket does, and ProxyRefused when
        the proxy cannot be reached or refuses the tunnel."""
        proxy = self.proxy
        if proxy is None:
            _, connection = await loop.create_connection(
                protocol,
                self.host,
                self.port,
                ssl=self.tls,
                server_hostname=self.host if self.tls else None,
            )
            return connection
        if self.tls is None:  # the proxy forwards each request (`forward` says how it is sent)
            _, connection = await _to_proxy(loop, protocol, proxy)
            return connection
        return await self._tunnel(loop, protocol, proxy, self.tls)

    async def _tunnel(
        self,
        loop: asyncio.AbstractEventLoop,
        protocol: Callable[[], _P],
        proxy: ForwardProxy,
        tls: ssl.SSLContext,
    ) -> _P:
        """A connection to `proxy`, a `CONNECT` to this origin on it, then TLS with the origin
        over the tunnel, `protocol()` reading it. Raises ProxyRefused for any answer but 2xx."""
        authority = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        transport, answer = await _to_proxy(loop, lambda: _TunnelAnswer(loop, proxy), proxy)
        try:
            head = f"CONNECT {authority} HTTP/1.1\r\nhost: {authority}\r\n"
            if proxy.authorization:
                head += f"proxy-authorization: {proxy.authorization}\r\n"
            transport.write(f"{head}\r\n".encode())
            status, reason = await answer.status
            if not 200 <= status < 300:
                raise ProxyRefused(
                    f"the proxy {proxy} answered CONNECT {authority} with {status} {reason}".strip()
                )
            connection = protocol()
            secure = await loop.start_tls(transport, connection, tls, server_hostname=self.host)
        except BaseException:
            transport.close()
            raise
        if secure is None:  # the transport closed as the handshake ended
            raise ProxyRefused(f"the proxy {proxy} closed the tunnel to {authority}")
        connection.connection_made(secure)
        return connection

    @property
    def forward(self) -> tuple[str, dict[str, str]]:
        """What a request's head carries for the forward proxy of a plain http origin: the
        prefix of its target (absolute form, `POST http://host:port/v1/… HTTP/1.1`) and the
        proxy's credentials; ("", {}) for a direct origin or a tunnelled one."""
        if self.proxy is None or self.tls is not None:
            return "", {}
        credentials = self.proxy.authorization
        return f"http://{self.host_header}", (
            {"proxy-authorization": credentials} if credentials else {}
        )

    @property
    def host_header(self) -> str:
        """The `host` header's value: the port only when it is not the scheme's default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == _DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


async def _to_proxy(
    loop: asyncio.AbstractEventLoop, protocol: Callable[[], _P], proxy: ForwardProxy
) -> tuple[asyncio.Transport, _P]:
    """A TCP connection to `proxy`. Raises ProxyRefused, naming the proxy, when there is none
    (a timeout goes up as it is: it is the connect timeout's)."""
    try:
        transport, connection = await loop.create_connection(protocol, proxy.host, proxy.port)
    except TimeoutError:
        raise
    except OSError as exc:
        raise ProxyRefused(f"the proxy {proxy} cannot be reached: {exc}") from exc
    return transport, connection


class _TunnelAnswer(asyncio.Protocol):
    """Reads a proxy's answer to `CONNECT` up to the blank line after its head: `status` is
    its status code and reason once read. Raises (through `status`) ProxyRefused when the proxy
    closes first or sends what is not an HTTP answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, proxy: ForwardProxy) -> None:
        self.status: asyncio.Future[tuple[int, str]] = loop.create_future()
        self._proxy = proxy
        self._head = bytearray()

    def data_received(self, data: bytes) -> None:
        if self.status.done():
            return
        self._head += data
        if b"\r\n\r\n" not in self._head:
            if len(self._head) > _MAX_TUNNEL_ANSWER:
                self._refuse("sent an answer to CONNECT without an end to its head")
            return
        line = bytes(self._head.split(b"\r\n", 1)[0]).decode("latin-1")
        version, _, rest = line.partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit() or len(code) != 3:
            self._refuse(f"sent an answer to CONNECT that is not HTTP: {line[:80]!r}")
            return
        self.status.set_result((int(code), reason.strip()))

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._refuse("closed the connection before answering CONNECT")

    def _refuse(self, message: str) -> None:
        if not self.status.done():
            self.status.set_exception(ProxyRefused(f"the proxy {self._proxy} {message}"))
