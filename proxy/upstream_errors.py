"""The upstream client's own failures, below the proxy's, and their one translation into the
proxy's `Upstream*` errors (`proxy.errors`).

What the HTTP/1.1 connections (`proxy.upstream_http1`, `proxy.upstream_pool`) and the sockets
under them raise:

    OSError (refused, reset, unreachable, TLS), TimeoutError (connect or read timeout)
    ├── ClosedEarly      the connection closed before the response's first byte
    └── ProxyRefused     the forward proxy could not be reached, or refused the request
    PoolExhausted        every pooled connection stayed busy past the pool's timeout
    ResponseError
    ├── BrokenOff        the connection ended, or failed, in the middle of the response
    ├── InvalidResponse  bytes that are not an HTTP/1.1 response (or an encoding not asked for)
    ├── TooLarge         a body over its cap in bytes
    ├── TooLong          a stream past its cap in seconds
    └── Overdue          a try past its overall deadline, plain or streamed

`translate` turns each of them into its `Upstream*` error at the client's one boundary
(`proxy.upstream`'s `_Try`); what it does not name is raised as it is.
"""

from __future__ import annotations

import socket

from proxy.errors import (
    UpstreamBusyError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeoutError,
)


class ClosedEarly(ConnectionError):
    """The server closed the connection before the first byte of its response."""


class ProxyRefused(ConnectionError):
    """The forward proxy (`HTTP(S)_PROXY`) could not be reached, refused a `CONNECT` tunnel
    (407, 403, 502, …) or answered a plain request 407; the message names the proxy, never its
    credentials."""


class PoolExhausted(Exception):
    """Every connection the pool may open stayed busy for as long as a request may wait for one."""


class ResponseError(Exception):
    """The server's response could not be read to its end."""


class BrokenOff(ResponseError):
    """The connection ended, or failed, in the middle of the response."""


class InvalidResponse(ResponseError):
    """What the server sent is not an HTTP/1.1 response this client reads."""


class TooLarge(ResponseError):
    """The body went over its cap in bytes (decoded)."""


class TooLong(ResponseError):
    """The streamed body went on past its cap in seconds."""


class Overdue(ResponseError):
    """The try went on past its overall deadline (`total_timeout`), however lively the server."""


ERRORS: tuple[type[Exception], ...] = (
    ClosedEarly,
    ProxyRefused,
    PoolExhausted,
    BrokenOff,
    InvalidResponse,
    TooLarge,
    TooLong,
    Overdue,
)
"""Every exception class of this module's own that `Pool.send` (`proxy.upstream_pool`) and a
response raise; they raise OSError and TimeoutError besides."""


# Most specific first: a timeout (504) differs from a refused connection (502), and a body that
# breaks off differs from both. `error_class_for` walks this table in order; what it does not
# name is not an upstream's failure but a fault of the proxy's own, and is raised as it is.
_TRANSLATIONS: tuple[
    tuple[type[BaseException] | tuple[type[BaseException], ...], type[UpstreamError], str], ...
] = (
    (TimeoutError, UpstreamTimeoutError, "timed out"),
    (BrokenOff, UpstreamProtocolError, "broke off its response"),
    (InvalidResponse, UpstreamProtocolError, "sent an invalid response"),
    (TooLarge, UpstreamProtocolError, "sent a response over the proxy's limit"),
    (TooLong, UpstreamTimeoutError, "streamed past the proxy's limit"),
    (Overdue, UpstreamTimeoutError, "answered past the proxy's total_timeout"),
    (PoolExhausted, UpstreamBusyError, "has no connection free"),
    (ClosedEarly, UpstreamConnectError, "closed the connection before answering"),
    (ProxyRefused, UpstreamConnectError, "could not be reached through the proxy"),
    ((ConnectionError, socket.gaierror), UpstreamConnectError, "is unreachable"),
    (OSError, UpstreamConnectError, "failed"),
)


def error_class_for(exc_type: type[BaseException]) -> tuple[type[UpstreamError], str] | None:
    """The Upstream* class and wording for an exception type; None when it is not one of the
    network's or the upstream's failures."""
    for source, target, wording in _TRANSLATIONS:
        if issubclass(exc_type, source):
            return target, wording
    return None


def translate(exc: BaseException, upstream: str, url: str) -> UpstreamError:
    """Map a connection pool's (or asyncio's, or a socket's) exception onto the proxy's Upstream* errors.

    The message names the upstream, the URL and the cause, so a client can act on it. Raises
    `exc` itself when it is none of those: a bug stays a bug, never an upstream error charged
    to the session.
    """
    if isinstance(exc, UpstreamError):
        return exc
    mapped = error_class_for(type(exc))
    if mapped is None:
        raise exc
    target, wording = mapped
    detail = str(exc).strip()
    cause = f"{exc.__class__.__name__}: {detail}" if detail else exc.__class__.__name__
    return target(f"upstream '{upstream}' {wording} ({url}): {cause}")
