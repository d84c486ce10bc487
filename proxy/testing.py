"""A scripted OpenAI-compatible upstream and a loopback server runner, for tests, demos and benches.

`ScriptedUpstream` is a real HTTP server (Starlette under uvicorn on 127.0.0.1) that answers chat
completions from a script and records what it was asked, so tests exercise the proxy's real
network path. A script can misbehave on cue: an error status or a body that is not a completion
(`Fault`), a hang (`Fault.delay`), a connection reset before any response byte (`Reset`), or a
stream that stalls or breaks off (`SSE`). Builders (`completion`, `tool_call`) keep test data short.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from proxy.streaming import completion_chunks


def tool_call(
    name: str, arguments: dict[str, Any] | str, *, id: str | None = None
) -> dict[str, Any]:
    """An OpenAI tool call; dict arguments are serialised to the JSON string the API carries."""
    args = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    return {
        "id": id or f"call_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def completion(
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    *,
    finish_reason: str | None = None,
    model: str = "scripted-model",
    usage: dict[str, int] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A chat.completion with one choice; finish_reason defaults to tool_calls or stop."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
                "logprobs": None,
            }
        ],
        "usage": usage or {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        **extra,
    }


@dataclass
class Fault:
    """Answer with this status and body, after `delay` seconds."""

    status: int
    body: bytes | dict[str, Any] = b""
    delay: float = 0.0


@dataclass
class Reset:
    """Break the connection with a TCP reset, after `delay` seconds, before any response byte."""

    delay: float = 0.0


@dataclass
class SSE:
    """Answer with a server-sent-event stream of these events (dicts become `data:` JSON lines).

    `pause_after`: stop for `pause` seconds after that many events, or until `resume` is set
    (at most `pause` seconds) when it is given; `drop_after`: break the connection after that
    many events; `done`: finish with `data: [DONE]`. `chunk_sizes`: send the whole body (the
    events and `[DONE]`) cut into pieces of these many bytes, the sizes repeating; the pause and
    the drop then count pieces, not events. `completion`: the chat completion the events stream,
    when there is one; a request that does not ask for a stream (a re-ask) gets it as JSON, as
    a real server would answer the same turn.
    """

    events: list[bytes | dict[str, Any]]
    pause_after: int | None = None
    pause: float = 0.0
    drop_after: int | None = None
    done: bool = True
    resume: threading.Event | None = None
    chunk_sizes: Sequence[int] | None = None
    completion: dict[str, Any] | None = None

    @classmethod
    def of(cls, completion: dict[str, Any], *, fragment: int = 4, **options: Any) -> SSE:
        """Stream `completion` as vLLM would (with its usage), in pieces of `fragment` chars."""
        chunks = completion_chunks(completion, fragment=fragment, include_usage=True)
        return cls(list[bytes | dict[str, Any]](chunks), completion=completion, **options)

    def pieces(self) -> list[bytes]:
        """The byte pieces this reply sends, in order."""
        body = [
            e if isinstance(e, bytes) else b"data: " + orjson.dumps(e) + b"\n\n"
            for e in self.events
        ]
        if self.done:
            body.append(b"data: [DONE]\n\n")
        if not self.chunk_sizes:
            return body
        whole, pieces, sizes = b"".join(body), [], itertools.cycle(self.chunk_sizes)
        while whole:
            size = max(1, next(sizes))
            pieces.append(whole[:size])
            whole = whole[size:]
        return pieces


Reply = dict[str, Any] | Fault | Reset | SSE
Handler = Callable[[dict[str, Any]], Reply]


@dataclass
class ScriptedUpstream:
    """An OpenAI-compatible chat server that answers from `replies` (in order) or a `handler`.

    When the script runs out, the last reply repeats. Every chat request's body is kept in
    `requests` (parsed) and `raw_requests` (the bytes as received) and its headers (lower-case names) in `request_headers`; the path of every HTTP
    request, whatever its route, in `paths`. A completion (dict) answering a `stream: true`
    request is streamed as vLLM would (`SSE.of`). `pieces_sent` counts the SSE pieces written;
    `stream_cut` is set when a client closed a stream before its end.
    """

    replies: Iterable[Reply] = ()
    handler: Handler | None = None
    models: tuple[str, ...] = ("scripted-model",)
    requests: list[dict[str, Any]] = field(default_factory=list)
    raw_requests: list[bytes] = field(default_factory=list)
    request_headers: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._queue: deque[Reply] = deque(self.replies)
        self._last: Reply | None = None
        self.first_chunk_sent = threading.Event()
        self.stream_cut = threading.Event()
        self.pieces_sent = 0
        self.client_ports: list[int] = []  # per chat request: the connection it came on
        self.app = _KeepServerReceive(self._routes(), self.paths)

    def _routes(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/{path:path}", self._echo, methods=["GET", "POST"]),
                Route("/{path:path}", self._echo, methods=["GET", "POST"]),
            ]
        )

    def push(self, *replies: Reply) -> None:
        """Queue more replies."""
        self._queue.extend(replies)

    def _next(self, body: dict[str, Any]) -> Reply:
        if self.handler is not None:
            return self.handler(body)
        if self._queue:
            self._last = self._queue.popleft()
        if self._last is None:
            return completion("hello")
        return self._last

    async def _chat(self, request: Request) -> Response:
        raw = await request.body()
        body = orjson.loads(raw)
        self.raw_requests.append(raw)
        self.requests.append(body)
        self.request_headers.append(dict(request.headers.items()))
        self.client_ports.append(request.client.port if request.client else 0)
        reply = self._next(body)
        if isinstance(reply, Fault):
            if reply.delay:
                await asyncio.sleep(reply.delay)
            content = reply.body if isinstance(reply.body, bytes) else orjson.dumps(reply.body)
            return Response(content, status_code=reply.status, media_type="application/json")
        if isinstance(reply, Reset):
            if reply.delay:
                await asyncio.sleep(reply.delay)
            await _reset_connection()
            return Response(b"")  # never sent: the connection is gone
        if isinstance(reply, dict) and body.get("stream"):
            reply = SSE.of(reply)
        elif isinstance(reply, SSE) and reply.completion is not None and not body.get("stream"):
            reply = reply.completion
        if isinstance(reply, SSE):
            return StreamingResponse(self._stream(reply), media_type="text/event-stream")
        return Response(orjson.dumps(reply), media_type="application/json")

    async def _stream(self, reply: SSE) -> Any:
        pieces = reply.pieces()
        finished = dropped = False
        try:
            for i, piece in enumerate(pieces):
                if reply.drop_after is not None and i == reply.drop_after:
                    dropped = True
                    raise ConnectionResetError("scripted drop")
                yield piece
                self.pieces_sent += 1
                if i == 0:
                    self.first_chunk_sent.set()
                if reply.pause_after is not None and i + 1 == reply.pause_after:
                    await self._pause(reply)
            finished = True
        finally:
            if not finished and not dropped:
                self.stream_cut.set()

    @staticmethod
    async def _pause(reply: SSE) -> None:
        if reply.resume is None:
            await asyncio.sleep(reply.pause)
            return
        # `resume` is a threading.Event set from the test's thread; polling it (rather than
        # waiting in a worker thread) lets a client going away cancel the wait at once.
        deadline = time.monotonic() + reply.pause
        while not reply.resume.is_set() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.002)

    async def _models(self, request: Request) -> Response:
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "scripted"} for m in self.models
        ]
        return Response(
            orjson.dumps({"object": "list", "data": data}), media_type="application/json"
        )

    async def _echo(self, request: Request) -> Response:
        raw = await request.body()
        return Response(
            orjson.dumps(
                {
                    "path": request.url.path,
                    "method": request.method,
                    "body": raw.decode(),
                    "headers": dict(request.headers.items()),
                }
            ),
            media_type="application/json",
        )


_SERVER_RECEIVE: ContextVar[Any] = ContextVar("scripted_upstream_receive")


class _KeepServerReceive:
    """ASGI middleware that notes every path and keeps the server's own `receive`: its owner,
    uvicorn's request cycle, holds the connection a `Reset` breaks."""

    def __init__(self, app: Any, paths: list[str]) -> None:
        self.app = app
        self.paths = paths

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.paths.append(scope["path"])
        token = _SERVER_RECEIVE.set(receive)
        try:
            await self.app(scope, receive, send)
        finally:
            _SERVER_RECEIVE.reset(token)


async def _reset_connection() -> None:
    # uvicorn's `receive` is a method of the request cycle that owns the connection's transport;
    # SO_LINGER 0 turns the close into a reset, so the client sees ECONNRESET, not a clean EOF.
    cycle = getattr(_SERVER_RECEIVE.get(None), "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None:
        raise RuntimeError("Reset needs the upstream to run under uvicorn (LoopbackServer)")
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
    await asyncio.sleep(0)  # let the server see the connection lost before the handler returns


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class LoopbackServer:
    """Runs an ASGI app under uvicorn on 127.0.0.1 in a background thread; a context manager."""

    def __init__(self, app: Any, *, port: int | None = None) -> None:
        # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets whose proto says TCP,
        # and accepted sockets inherit it; with proto 0 every keep-alive response (headers and
        # body written apart) waited ~40 ms for the client's delayed ACK.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port or 0))
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            app, log_level="error", access_log=False, lifespan="on", loop="asyncio"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        """The server's root URL."""
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._server.serve(sockets=[self._sock])

    def task_count(self) -> int:
        """How many asyncio tasks the server's event loop holds right now."""
        if self._loop is None:
            raise RuntimeError("the server is not running")

        async def count() -> int:
            return len(asyncio.all_tasks())

        return asyncio.run_coroutine_threadsafe(count(), self._loop).result(timeout=10)

    def start(self) -> LoopbackServer:
        """Start serving and wait until the server accepts connections."""
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("loopback server did not start")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        """Shut the server down and wait for its thread (idempotent)."""
        if not self._thread.is_alive():
            self._sock.close()
            return
        self._server.should_exit = True
        self._thread.join(timeout=20)
        self._sock.close()

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
