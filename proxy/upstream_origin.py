"""Where an upstream's requests go and how a connection to it is opened: `BaseURL`, an upstream's
base URL read once (its origin, the path and query every request starts with, its credentials),
and `Origin`, the one seam for TCP, TLS (its options are `proxy.tls`'s), Unix sockets and
environment proxies.

A base URL is `http(s)://[user:password@]host[:port][/path][?query]`, or
`unix:///path/to/socket[:/base/path][?query]` for a server on a Unix socket (nginx's `unix:` form:
the base path follows the socket's after a colon, `/v1` when none is given).

Whether an origin goes through a forward proxy is decided once, when it is made (`Origin.of`),
from the `*_proxy` variables read by the standard library's rules (`environment_proxies`,
`bypassed`): a plain http origin's requests go to the proxy in absolute form (`Origin.forward`),
an https origin's connections through a `CONNECT` tunnel with TLS over it. A direct origin opens
its connections as before (a name's addresses raced, Happy Eyeballs), and nothing of this runs
per request.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import ipaddress
import itertools
import socket
import ssl
from asyncio.staggered import staggered_race
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import SplitResult, unquote, unquote_plus, urlsplit

# Public in the standard library for decades, missing from typeshed's stubs.
from urllib.request import proxy_bypass_environment  # type: ignore[attr-defined]

from yarl import URL

from proxy.config_upstream import UpstreamConfig, base_url_parts
from proxy.errors import ConfigError
from proxy.tls import client_context
from proxy.upstream_errors import ProxyRefused

_DEFAULT_PORTS = {"http": 80, "https": 443}
_P = TypeVar("_P", bound=asyncio.BaseProtocol)
# A proxy's answer to CONNECT is a status line and a few headers; more is not a proxy talking.
_MAX_TUNNEL_ANSWER = 64 * 1024

UNIX_BASE_PATH = "/v1"
"""A Unix socket upstream's base path when its URL names none: the OpenAI API's, as vLLM serves it."""

HAPPY_EYEBALLS_DELAY = 0.25
"""Seconds a connection attempt to one of a name's addresses has before the next address is tried
beside it (RFC 8305's recommended connection attempt delay): a black-holed first address costs
this, not the whole connect timeout."""

Address = tuple[int, tuple[Any, ...]]
"""One resolved address: its family (`socket.AF_INET`, `AF_INET6`) and its socket address."""

Resolver = Callable[[str, int], Awaitable[Sequence[Address]]]
"""What turns a host name and port into the addresses to try, in order (the system's resolver,
`loop.getaddrinfo`, unless an origin is given another)."""


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
    proxy they go through (None: straight there); for a Unix socket upstream (scheme `unix`), the
    socket's path, its host `localhost`. `resolve`: the resolver a host name goes through (None:
    the system's)."""

    scheme: str
    host: str
    port: int
    tls: ssl.SSLContext | None
    socket_path: str | None = None
    resolve: Resolver | None = None
    named: bool = False  # the host is a name to resolve, not an address
    proxy: ForwardProxy | None = None

    @classmethod
    def of(
        cls,
        url: str,
        *,
        tls: ssl.SSLContext | None = None,
        proxies: Mapping[str, str] | None = None,
        resolve: Resolver | None = None,
    ) -> Origin:
        """The origin of an absolute http(s) or unix URL: `tls` for https (the system's defaults
        when None), through the proxy `proxies` (`environment_proxies`) names for its scheme (or
        `all`) unless their `no` entry exempts it. Raises ValueError for any other URL, and for a
        proxy that is not an http URL."""
        parts = base_url_parts(url)
        if parts.scheme == "unix":
            return cls("unix", "localhost", 0, None, _unix_parts(parts)[0])
        assert parts.hostname is not None  # base_url_parts says so
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
        named = resolve is not None or not _is_address(parts.hostname)
        return cls(parts.scheme, parts.hostname, port, tls, None, resolve, named, proxy)

    async def connect(self, loop: asyncio.AbstractEventLoop, protocol: Callable[[], _P]) -> _P:
        """Open a connection to this origin, `protocol()` reading it: the one place that says
        how the upstream is reached (TCP, TLS over it for https, a Unix socket; through a
        forward proxy, a plain connection to it, or a `CONNECT` tunnel with TLS over it). An
        address is connected to as it is; a name is resolved and its addresses tried in turn,
        each given `HAPPY_EYEBALLS_DELAY` before the next is tried beside it (the first to
        connect wins). Raises OSError (refused, unreachable, not resolved, TLS) as the socket
        does, and ProxyRefused when the proxy cannot be reached or refuses the tunnel."""
        if self.socket_path is not None:
            _, connection = await loop.create_unix_connection(protocol, self.socket_path)
            return connection
        proxy = self.proxy
        if proxy is not None:
            if self.tls is None:  # the proxy forwards each request (`forward` says how)
                _, connection = await _to_proxy(loop, protocol, proxy)
                return connection
            return await self._tunnel(loop, protocol, proxy, self.tls)
        server_hostname = self.host if self.tls else None
        if not self.named:
            _, connection = await loop.create_connection(
                protocol, self.host, self.port, ssl=self.tls, server_hostname=server_hostname
            )
            return connection
        resolve = self.resolve or functools.partial(_system_resolver, loop)
        sock = await _first_connected(
            loop, self.host, _interleaved(await resolve(self.host, self.port))
        )
        try:
            _, connection = await loop.create_connection(
                protocol, sock=sock, ssl=self.tls, server_hostname=server_hostname
            )
        except BaseException:
            sock.close()
            raise
        return connection

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
        if self.socket_path is not None:
            return self.host
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == _DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class BaseURL:
    """An upstream's base URL read once: where its connections go (`origin`), the path and the
    query every request's target starts with, the `authorization` its userinfo stands for (HTTP
    basic), and the root its requests' URLs are shown under (no credentials)."""

    origin: Origin
    path: str
    query: str
    authorization: str | None
    shown_root: str

    @classmethod
    def of(
        cls,
        url: str,
        *,
        tls: ssl.SSLContext | None = None,
        proxies: Mapping[str, str] | None = None,
        resolve: Resolver | None = None,
    ) -> BaseURL:
        """`url` read (see the module doc for its forms), its origin made as `Origin.of` makes
        it. Raises ValueError for a URL that is none of them."""
        origin = Origin.of(url, tls=tls, proxies=proxies, resolve=resolve)
        parts = urlsplit(url)
        if origin.socket_path is not None:
            path = _unix_parts(parts)[1]
            root = f"unix://{origin.socket_path}:"
        else:
            path = parts.path
            root = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
        authorization = None
        if userinfo := parts.netloc.rpartition("@")[0]:
            user, _, password = userinfo.partition(":")
            pair = f"{unquote(user)}:{unquote(password)}".encode()
            authorization = f"Basic {base64.b64encode(pair).decode('ascii')}"
        return cls(origin, path.rstrip("/"), parts.query, authorization, root)

    def target(self, path: str) -> tuple[str, str]:
        """The URL shown for a request to `path` (in errors and traces: no credentials) and its
        request target (path and query, quoted). `path` is relative to the base path, or with a
        leading slash to the server's root (the base path less a final `/v1`: /tokenize,
        /health). A query of `path`'s own follows the base URL's, less any parameter the base
        URL sets: the upstream's URL comes from configuration."""
        path, _, query = path.partition("?")
        if path.startswith("/"):
            base = self.path
            text = (base[: -len("/v1")] if base.endswith("/v1") else base) + path
        else:
            text = f"{self.path}/{path}"
        query = _merged_query(self.query, query)
        target = URL(f"http://localhost{text}" + (f"?{query}" if query else "")).raw_path_qs
        return self.shown_root + target, target


def base_for(config: UpstreamConfig, proxies: Mapping[str, str] | None = None) -> BaseURL:
    """`config`'s base URL read (`BaseURL`): an https one with a TLS context made from its `tls`
    settings, through the forward proxy `proxies` (`environment_proxies`) name for it. Raises
    ConfigError, naming the upstream, for TLS files that cannot be used or a proxy URL that is
    not http."""
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
        return BaseURL.of(config.base_url, tls=tls, proxies=proxies)
    except ValueError as exc:
        raise ConfigError(f"upstream '{config.name}': {exc}") from None


def origin_for(config: UpstreamConfig, proxies: Mapping[str, str] | None = None) -> Origin:
    """Where `config`'s requests go: `base_for`'s origin (the same errors)."""
    return base_for(config, proxies).origin


def _merged_query(base: str, own: str) -> str:
    if not own or not base:
        return base or own
    names = {unquote_plus(p.partition("=")[0]) for p in base.split("&")}
    kept = [p for p in own.split("&") if p and unquote_plus(p.partition("=")[0]) not in names]
    return "&".join([base, *kept])


def _unix_parts(parts: SplitResult) -> tuple[str, str]:
    """A unix URL's socket path and base path (`UNIX_BASE_PATH` when it names none)."""
    socket_path, colon, path = parts.path.partition(":")
    return unquote(socket_path), path if colon else UNIX_BASE_PATH


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def _system_resolver(loop: asyncio.AbstractEventLoop, host: str, port: int) -> list[Address]:
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    return [(family, address) for family, _, _, _, address in infos]


def _interleaved(addresses: Sequence[Address]) -> list[Address]:
    """The addresses with their families alternating, the first's first (RFC 8305 §4): a family
    that does not route costs one attempt delay, not one per address."""
    families: dict[int, list[Address]] = {}
    for address in addresses:
        families.setdefault(address[0], []).append(address)
    rounds = itertools.zip_longest(*families.values())
    return [address for round_ in rounds for address in round_ if address is not None]


async def _first_connected(
    loop: asyncio.AbstractEventLoop, host: str, addresses: Sequence[Address]
) -> socket.socket:
    """A socket connected to the first of `addresses` to answer, each tried
    `HAPPY_EYEBALLS_DELAY` after the one before it (or as soon as that one fails) while the
    earlier ones go on: the standard library's staggered race, which asyncio's own Happy Eyeballs
    runs (uvloop has none). Raises OSError when none connects: the one error, or one naming them all."""
    if not addresses:
        raise OSError(f"{host!r} resolved to no address")

    async def attempt(family: int, address: tuple[Any, ...]) -> socket.socket:
        # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on a socket whose proto says TCP.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
        except BaseException:  # a loser cancelled, or a failure: the socket is closed either way
            sock.close()
            raise
        return sock

    attempts = [functools.partial(attempt, *address) for address in addresses]
    sock, _, errors = await staggered_race(attempts, HAPPY_EYEBALLS_DELAY)
    if sock is not None:
        return sock  # type: ignore[no-any-return]
    failures = [(a, e) for a, e in zip(addresses, errors, strict=False) if e is not None]
    if len(failures) == 1:
        raise failures[0][1]
    # One error naming every address, of their class when they share one (refused: unreachable).
    kinds = {type(e) for _, e in failures}
    kind = kinds.pop() if len(kinds) == 1 else OSError
    if not issubclass(kind, OSError):
        kind = OSError
    tried = "; ".join(f"{a[1][0]}: {e}" for a, e in failures)
    raise kind(f"no address of {host!r} could be connected to ({tried})")


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
