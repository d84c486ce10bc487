"""Where an upstream's requests go and how a connection to it is opened: `BaseURL`, an upstream's
base URL read once (its origin, the path and query every request starts with, its credentials),
and `Origin`, the one seam for TCP, TLS, Unix sockets and (to come) environment proxies and TLS
options.

A base URL is `http(s)://[user:password@]host[:port][/path][?query]`, or
`unix:///path/to/socket[:/base/path][?query]` for a server on a Unix socket (nginx's `unix:` form:
the base path follows the socket's after a colon, `/v1` when none is given)."""

from __future__ import annotations

import asyncio
import base64
import functools
import ipaddress
import itertools
import socket
import ssl
from asyncio.staggered import staggered_race
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import SplitResult, unquote, unquote_plus, urlsplit

from yarl import URL

_DEFAULT_PORTS = {"http": 80, "https": 443}
_P = TypeVar("_P", bound=asyncio.BaseProtocol)

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


@dataclass(frozen=True, slots=True)
class Origin:
    """Where the requests go: scheme, host, port, and the TLS context for https; for a Unix socket
    upstream (scheme `unix`), the socket's path, its host `localhost`. `resolve`: the resolver a
    host name goes through (None: the system's)."""

    scheme: str
    host: str
    port: int
    tls: ssl.SSLContext | None
    socket_path: str | None = None
    resolve: Resolver | None = None
    named: bool = False  # the host is a name to resolve, not an address

    @classmethod
    def of(cls, url: str, *, resolve: Resolver | None = None) -> Origin:
        """The origin of an absolute http(s) or unix URL. Raises ValueError for any other."""
        parts = base_url_parts(url)
        if parts.scheme == "unix":
            return cls("unix", "localhost", 0, None, _unix_parts(parts)[0])
        assert parts.hostname is not None  # base_url_parts says so
        port = parts.port or _DEFAULT_PORTS[parts.scheme]
        tls = ssl.create_default_context() if parts.scheme == "https" else None
        named = resolve is not None or not _is_address(parts.hostname)
        return cls(parts.scheme, parts.hostname, port, tls, None, resolve, named)

    async def connect(self, loop: asyncio.AbstractEventLoop, protocol: Callable[[], _P]) -> _P:
        """Open a connection to this origin, `protocol()` reading it: the one place that says
        how the upstream is reached (TCP, TLS over it for https, a Unix socket). An address is
        connected to as it is; a name is resolved and its addresses tried in turn, each given
        `HAPPY_EYEBALLS_DELAY` before the next is tried beside it (the first to connect wins).
        Environment proxies (a CONNECT tunnel first) and TLS options (the context `of` makes)
        belong here and in `of`; nothing above `Pool` changes.
        Raises OSError (refused, unreachable, not resolved, TLS) as the socket does."""
        if self.socket_path is not None:
            _, connection = await loop.create_unix_connection(protocol, self.socket_path)
            return connection
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
    def of(cls, url: str, *, resolve: Resolver | None = None) -> BaseURL:
        """`url` read (see the module doc for its forms). Raises ValueError for a URL that is
        none of them."""
        origin = Origin.of(url, resolve=resolve)
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


def _merged_query(base: str, own: str) -> str:
    if not own or not base:
        return base or own
    names = {unquote_plus(p.partition("=")[0]) for p in base.split("&")}
    kept = [p for p in own.split("&") if p and unquote_plus(p.partition("=")[0]) not in names]
    return "&".join([base, *kept])


def base_url_parts(url: str) -> SplitResult:
    """`url` split, once it is known to be one of the forms of a base URL (the module doc's).
    Raises ValueError, naming the URL without its userinfo, for any other."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        socket_path, _, path = parts.path.partition(":")
        if parts.netloc or not socket_path.startswith("/") or (path and not path.startswith("/")):
            raise ValueError(f"not a unix:///path/to/socket[:/base/path] URL: {url!r}")
        return parts
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        raise ValueError(f"not an http(s) or unix URL: {shown!r}")
    parts.port  # noqa: B018 (raises ValueError for a port that is not one)
    return parts


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
