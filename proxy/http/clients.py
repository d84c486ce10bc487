"""The proxy's client connections: uvicorn's HTTP/1.1 protocol (httptools) with the bounds in time
and number it lacks.

uvicorn bounds a connection's idleness only between two requests (`timeout_keep_alive`, armed
as a response ends), and its `limit_concurrency` refuses requests (503) once connections and
tasks together reach it, never connections: a connection that sends nothing, one that sends its
head a byte a second and one that sends its body a byte a second were each kept as long as the
client liked, and 300 idle sockets made real requests fail. `ClientConnection` adds:

- `client_idle_timeout` from a connection's start too (uvicorn's keep-alive timer, which its
  own code cancels at the first byte): a connection that never sends a byte is idle;
- `client_header_timeout`: once a request's first byte is in, its line and headers must be in
  within it, else the connection is answered 408 and closed;
- `client_body_timeout`: once its headers are in, its whole body must be in within it, else
  the connection is answered 408 (when nothing was answered yet) and closed: the request's
  task reads a disconnect;
- `max_client_connections`: a connection past it makes room by closing one with no request under
  way (idle, or still sending its head), else it is answered 503 and closed.

A request that arrives whole in one read, as nearly all do, arms no timer of its own: a phase's
timer is armed only when a read ends inside that phase.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from proxy.errors import error_body

# Where a connection's request stands after a read: none under way (between two requests, or
# being answered), its head partly in, its body partly in.
_BETWEEN, _HEAD, _BODY = 0, 1, 2


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """The bounds on client connections (`Settings`' client_* and max_client_connections)."""

    header_timeout: float
    body_timeout: float
    max_connections: int

    def protocol(self) -> Callable[..., asyncio.Protocol]:
        """uvicorn's `http` option: its protocol class bound to these limits (it pickles, for
        worker processes)."""
        return functools.partial(ClientConnection, limits=self)


def _refusal(status: int, reason: str, message: str, error_type: str) -> bytes:
    """A whole response that closes its connection: the error JSON in the OpenAI shape (the
    route, and so the protocol, is not known yet)."""
    body = orjson.dumps(error_body(message, error_type))
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n"
    )
    if status == 503:
        head += "retry-after: 1\r\n"
    return head.encode("latin-1") + b"\r\n" + body


class ClientConnection(HttpToolsProtocol):
    """One client connection, bounded in time and number as the module doc says."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        limits: ClientLimits,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._limits = limits
        self._phase = _BETWEEN
        self._timed = _BETWEEN  # the phase this connection's own timer is armed for
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio's callbacks

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        full = len(self.connections) >= self._limits.max_connections
        super().connection_made(transport)
        if full and not self._make_room():
            message = "the proxy has as many client connections open as it may; retry"
            self._refuse(_refusal(503, "Service Unavailable", message, "too_many_connections"))
            return
        # uvicorn arms its keep-alive timer only as a response ends, and cancels it at the
        # next byte: armed here as well, a connection that never sends a byte is idle too.
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._phase != self._timed:
            self._arm(self._phase)

    def connection_lost(self, exc: Exception | None) -> None:
        self._arm(_BETWEEN)
        super().connection_lost(exc)

    # -- httptools' callbacks: where the request stands

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = _HEAD

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._phase = _BODY

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._phase = _BETWEEN

    # -- the bounds

    @property
    def waiting(self) -> bool:
        """Whether no request is under way: idle between two, or still sending its head."""
        cycle = self.cycle
        return self._phase != _BODY and (cycle is None or cycle.response_complete)

    def _arm(self, phase: int) -> None:
        """Time `phase` (a request's head or body) from now; `_BETWEEN`: no timer of ours."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timed = phase
        if phase == _HEAD:
            self._timer = self.loop.call_later(self._limits.header_timeout, self._overdue)
        elif phase == _BODY:
            self._timer = self.loop.call_later(self._limits.body_timeout, self._overdue)

    def _overdue(self) -> None:
        """The request's head or body did not come in time: answered 408 where nothing was
        answered yet, and closed."""
        self._timer = None
        if self._timed == _HEAD:
            what, seconds = "headers", self._limits.header_timeout
            unanswered = self.waiting
        else:
            what, seconds = "body", self._limits.body_timeout
            unanswered = self.cycle is not None and not self.cycle.response_started
        message = f"the request's {what} did not arrive within {seconds:g} s"
        self._refuse(
            _refusal(408, "Request Timeout", message, "request_timeout") if unanswered else b""
        )

    def _make_room(self) -> bool:
        """Close another connection that has no request under way; whether there was one."""
        for other in self.connections:
            if other is not self and isinstance(other, ClientConnection) and other.waiting:
                other._refuse(b"")
                return True
        return False

    def _refuse(self, response: bytes) -> None:
        """Send `response` (if any) and close the connection."""
        transport = self.transport
        if transport.is_closing():
            return
        if response:
            transport.write(response)
        transport.close()
