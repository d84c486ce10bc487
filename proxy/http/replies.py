"""What the proxy sends: JSON replies, SSE streams, and errors in the OpenAI shape."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy.errors import ToolsentryError, status_of
from proxy.http.disconnect import DisconnectWatch
from proxy.pipeline.stream import TurnStream

JSON = "application/json"


class JSONReply(Response):
    """JSON bytes and a few headers, sent as they are: every route's answer, without the header
    handling a general Response does for every kind of content (a few µs a request)."""

    media_type = JSON

    def __init__(
        self, content: bytes, status_code: int = 200, headers: Mapping[str, str] | None = None
    ) -> None:
        self.body = content
        self.status_code = status_code
        self.background = None
        raw = [(b"content-length", b"%d" % len(content)), (b"content-type", b"application/json")]
        if headers:
            raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.raw_headers = raw

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        await send({"type": "http.response.body", "body": self.body})


def error_reply(exc: ToolsentryError) -> JSONReply:
    """The JSON reply for one of the proxy's errors: its status, body and headers."""
    return JSONReply(orjson.dumps(exc.body()), status_of(exc), exc.headers)


class SSEReply(Response):
    """Sends a TurnStream, and closes it (the upstream response with it) however the response
    ended: completed, client gone mid-body, or never started.

    What Starlette's StreamingResponse sends, without its task group: under ASGI spec 2.3 (what
    uvicorn speaks) that spawned a disconnect listener through anyio's task group and cancel
    scope on every stream, about 100 µs before the first byte (half the proxy's own time to
    first token). Here the request's one `DisconnectWatch`, started before the stream was
    opened, goes on watching and cancels the sender when the client goes.
    """

    media_type = "text/event-stream"

    def __init__(self, stream: TurnStream, watch: DisconnectWatch) -> None:
        self.status_code = stream.status
        self.background = None
        headers = {**stream.headers, "cache-control": "no-cache", "x-accel-buffering": "no"}
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        raw.append((b"content-type", b"text/event-stream; charset=utf-8"))
        self.raw_headers = raw
        self._stream = stream
        self._watch = watch

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._send(send)
        finally:
            await self._stream.aclose()

    async def _send(self, send: Send) -> None:
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            async for chunk in self._stream.body():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not self._watch.gone:
                raise
            sender = asyncio.current_task()
            assert sender is not None
            sender.uncancel()  # the client went away: the response is over, not cancelled
        finally:
            self._watch.stop()


def request_headers(scope: Scope) -> dict[str, str]:
    """A request's headers by name (lower-case, as ASGI servers give them); of a repeated
    header, the first, as Starlette's `Headers.get` reads it."""
    headers: dict[str, str] = {}
    for key, value in scope["headers"]:
        name = key.decode("latin-1")
        if name not in headers:
            headers[name] = value.decode("latin-1")
    return headers
