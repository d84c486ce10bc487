"""Where an upstream's requests go and how a connection to it is opened: `Origin`, the one seam
for TCP, TLS and (to come) environment proxies, TLS options and Unix sockets."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}
_P = TypeVar("_P", bound=asyncio.BaseProtocol)


@dataclass(frozen=True, slots=True)
class Origin:
    """Where the requests go: scheme, host, port, and the TLS context for https."""

    scheme: str
    host: str
    port: int
    tls: ssl.SSLContext | None

    @classmethod
    def of(cls, url: str) -> Origin:
        """The origin of an absolute http(s) URL. Raises ValueError for any other."""
        parts = urlsplit(url)
        if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or _DEFAULT_PORTS[parts.scheme]
        tls = ssl.create_default_context() if parts.scheme == "https" else None
        return cls(parts.scheme, parts.hostname, port, tls)

    async def connect(self, loop: asyncio.AbstractEventLoop, protocol: Callable[[], _P]) -> _P:
        """Open a connection to this origin, `protocol()` reading it: the one place that says
        how the upstream is reached (TCP, TLS over it for https). Environment proxies (a CONNECT
        tunnel first), TLS options (the context `of` makes) and Unix sockets
        (`loop.create_unix_connection`) belong here and in `of`; nothing above `Pool` changes.
        Raises OSError (refused, unreachable, TLS) as the socket does."""
        _, connection = await loop.create_connection(
            protocol,
            self.host,
            self.port,
            ssl=self.tls,
            server_hostname=self.host if self.tls else None,
        )
        return connection

    @property
    def host_header(self) -> str:
        """The `host` header's value: the port only when it is not the scheme's default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == _DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"
