"""A scripted upstream speaking the three wire protocols, and a loopback server runner, for tests,
demos and benches.

`ScriptedUpstream` is a real HTTP server (Starlette under uvicorn on 127.0.0.1) that answers
`POST /v1/chat/completions`, `/v1/responses` and `/v1/messages` (any query string, such as
`?beta=true`) from one script, plain or streamed as the request asks, and records what it was
asked (body, headers, query string), so tests exercise the proxy's real network path. A script
entry is a protocol-neutral `Answer` (built with `answer`, `call`, `thinking`), rendered for the
route it arrives on by the writers of `proxy.protocols` in vLLM's shapes; a raw body (a dict, sent as it is, except
that a chat completion asked for as a stream is streamed); or a misbehaviour: an error status or a
body that is not an answer (`Fault`, `Fault.error` in the route's error shape), a hang
(`Fault.delay`), a connection reset before any response byte (`Reset`), or a stream that stalls,
breaks off or fails midway (`SSE`). Builders (`completion`, `tool_call`, `response`, `message`)
keep test data short.
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from proxy.errors import error_body
from proxy.protocols.answer import Answer, Call, Thinking, Usage
from proxy.protocols.base import API, Finish
from proxy.protocols.chat import answer as chat_wire
from proxy.protocols.messages import answer as messages_wire
from proxy.protocols.responses import answer as responses_wire
from proxy.sse import DONE, encode_event, encode_typed_event


def _new_id() -> str:
    return uuid.uuid4().hex[:16]


def call(
    name: str,
    arguments: dict[str, Any] | str,
    *,
    id: str | None = None,
    namespace: str | None = None,
) -> Call:
    """A protocol-neutral tool call; dict arguments are serialised to the JSON text calls carry."""
    args = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    return Call(name, args, id or f"call_{uuid.uuid4().hex[:12]}", namespace)


def thinking(text: str, signature: str | None = None, *, redacted: bool = False) -> Thinking:
    """A reasoning block; a signature is made up when none is given, as vLLM does."""
    return Thinking(text, signature if signature is not None else uuid.uuid4().hex, redacted)


def answer(
    text: str | None = None,
    *calls: Call,
    finish: Finish | str | None = None,
    thoughts: Sequence[Thinking] = (),
    usage: Usage | None = None,
    model: str = "scripted-model",
    **extra: Any,
) -> Answer:
    """A protocol-neutral answer: text, then calls; `finish="length"` cuts it at the token limit.

    `extra` fields are added to every body and stream envelope it is rendered to.
    """
    return Answer(
        text=text,
        calls=calls,
        thinking=tuple(thoughts),
        finish=Finish(finish) if finish is not None else None,
        usage=usage or Usage(),
        model=model,
        id=_new_id(),
        created=int(time.time()),
        extra=extra,
    )


def tool_call(
    name: str, arguments: dict[str, Any] | str, *, id: str | None = None
) -> dict[str, Any]:
    """An OpenAI tool call; dict arguments are serialised to the JSON string the API carries."""
    return chat_wire.tool_call(call(name, arguments, id=id))


def completion(
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    *,
    finish_reason: str | None = None,
    model: str = "scripted-model",
    usage: dict[str, int] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A chat.completion with one choice; finish_reason defaults to tool_calls or stop.

    `tool_calls` are sent as given, however they are shaped.
    """
    finish = finish_reason or ("tool_calls" if tool_calls else "stop")
    body = chat_wire.completion(
        Answer(text=content, model=model, id=_new_id(), created=int(time.time()), extra=extra)
    )
    choice = body["choices"][0]
    choice["finish_reason"] = finish
    if tool_calls:
        choice["message"]["tool_calls"] = tool_calls
    if usage is not None:
        body["usage"] = usage
    return body


def response(
    text: str | None = None,
    *calls: Call,
    request: Mapping[str, Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """A Responses `response` object (sent raw when scripted); `options` as for `answer`."""
    return responses_wire.body(answer(text, *calls, **options), request)


def message(text: str | None = None, *calls: Call, **options: Any) -> dict[str, Any]:
    """A Messages `message` body (sent raw when scripted); `options` as for `answer`."""
    return messages_wire.body(answer(text, *calls, **options))


def render(reply: Answer, api: API, request: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The plain body of `reply` on `api`, as the scripted upstream sends it."""
    if api is API.RESPONSES:
        return responses_wire.body(reply, request)
    if api is API.MESSAGES:
        return messages_wire.body(reply)
    return chat_wire.completion(reply)


def stream_events(
    reply: Answer,
    api: API,
    request: Mapping[str, Any] | None = None,
    *,
    fragment: int | None = 4,
    ping: bool = False,
) -> list[dict[str, Any]]:
    """The stream events of `reply` on `api`, as the scripted upstream sends them."""
    if api is API.RESPONSES:
        return responses_wire.events(reply, request, fragment=fragment)
    if api is API.MESSAGES:
        return messages_wire.events(reply, fragment=fragment, ping=ping)
    return chat_wire.chunks(reply, fragment=fragment)


@dataclass
class Fault:
    """Answer with this status and body, after `delay` seconds.

    `Fault.error` builds one whose body is the route's own error shape (OpenAI's on chat and
    Responses, Anthropic's on Messages).
    """

    status: int
    body: bytes | dict[str, Any] = b""
    delay: float = 0.0
    message: str | None = None
    error_type: str | None = None

    @classmethod
    def error(
        cls, status: int, message: str, *, error_type: str | None = None, delay: float = 0.0
    ) -> Fault:
        """An error in the shape of the route it answers."""
        return cls(status, delay=delay, message=message, error_type=error_type)

    def content(self, api: API) -> bytes:
        """The body this fault sends on `api`."""
        if self.message is None:
            return self.body if isinstance(self.body, bytes) else orjson.dumps(self.body)
        if api is API.MESSAGES:
            return orjson.dumps(
                messages_wire.error_body(self.message, self.status, self.error_type)
            )
        kind = (
            self.error_type or _VLLM_ERROR_TYPES.get(self.status) or HTTPStatus(self.status).phrase
        )
        return orjson.dumps(error_body(self.message, kind, code=self.status))


_VLLM_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


@dataclass
class Reset:
    """Break the connection with a TCP reset, after `delay` seconds, before any response byte."""

    delay: float = 0.0


@dataclass
class SSE:
    """Answer with a server-sent-event stream.

    The events are `events` as given (bytes as they are; dicts as `data:` JSON lines, named
    after their `type` on Responses and Messages routes), or, when `answer` is set, that answer's
    events on the route it arrives on (text and arguments in deltas of `fragment` characters;
    `ping` adds Anthropic's `ping` after `message_start`). `fail_after`: after that many events,
    send the route's error event with `fail_message` and end. `pause_after`: stop for `pause`
    seconds after that many events, or until `resume` is set (at most `pause` seconds) when it
    is given; `drop_after`: break the connection after that many events; `done`: finish with
    `data: [DONE]` (default: on chat completions only, as vLLM does). `chunk_sizes`: send the
    whole body cut into pieces of these many bytes, the sizes repeating; the pause and the drop
    then count pieces, not events. `completion` (or `answer`): what a request that does not ask
    for a stream (a re-ask) gets instead, as a real server would answer the same turn.
    """

    events: list[bytes | dict[str, Any]] = field(default_factory=list)
    pause_after: int | None = None
    pause: float = 0.0
    drop_after: int | None = None
    done: bool | None = None
    resume: threading.Event | None = None
    chunk_sizes: Sequence[int] | None = None
    completion: dict[str, Any] | None = None
    answer: Answer | None = None
    fragment: int | None = 4
    ping: bool = False
    fail_after: int | None = None
    fail_message: str = "scripted failure in the middle of the stream"

    @classmethod
    def of(cls, reply: dict[str, Any] | Answer, *, fragment: int = 4, **options: Any) -> SSE:
        """Stream `reply` as vLLM would, in pieces of `fragment` chars: a chat completion (with
        its usage) on any route, or an answer in the protocol of the route it arrives on."""
        if isinstance(reply, Answer):
            return cls(answer=reply, fragment=fragment, **options)
        chunks = chat_wire.completion_chunks(reply, fragment=fragment, include_usage=True)
        return cls(list[bytes | dict[str, Any]](chunks), completion=reply, **options)

    def pieces(self, api: API = API.CHAT, request: Mapping[str, Any] | None = None) -> list[bytes]:
        """The byte pieces this reply sends on `api` (answering `request`), in order."""
        events: list[bytes | dict[str, Any]] = list(self.events)
        if self.answer is not None:
            events = list(
                stream_events(self.answer, api, request, fragment=self.fragment, ping=self.ping)
            )
        body = [e if isinstance(e, bytes) else _encode(e, api) for e in events]
        done = self.done if self.done is not None else api is API.CHAT
        if self.fail_after is not None:
            body = [*body[: self.fail_after], _encode(self._failure(api, self.fail_after), api)]
            done = False
        if done:
            body.append(DONE)
        if not self.chunk_sizes:
            return body
        whole, pieces, sizes = b"".join(body), [], itertools.cycle(self.chunk_sizes)
        while whole:
            size = max(1, next(sizes))
            pieces.append(whole[:size])
            whole = whole[size:]
        return pieces

    def _failure(self, api: API, position: int) -> dict[str, Any]:
        if api is API.MESSAGES:
            return messages_wire.error_body(self.fail_message, 500)
        if api is API.RESPONSES:
            return responses_wire.error_event(self.fail_message, sequence_number=position)
        return error_body(self.fail_message, "InternalServerError", code=500)


def _encode(event: dict[str, Any], api: API) -> bytes:
    # Chat completions name no event; Responses and Messages name each after its type.
    return encode_event(event) if api is API.CHAT else encode_typed_event(event)


ScriptedReply = Answer | dict[str, Any] | Fault | Reset | SSE
"""What the scripted upstream answers one request with."""
Handler = Callable[[dict[str, Any]], ScriptedReply]

_ROUTES = {
    API.CHAT: "/v1/chat/completions",
    API.RESPONSES: "/v1/responses",
    API.MESSAGES: "/v1/messages",
}


@dataclass
class ScriptedUpstream:
    """A chat, Responses and Messages server that answers from `replies` (in order) or a `handler`.

    When the script runs out, the last reply repeats. Every protocol request's body is kept in
    `requests` (parsed) and `raw_requests` (the bytes as received), its headers (lower-case
    names) in `request_headers`, its query string in `queries` and its protocol in `apis`
    (appended before the handler runs, so a handler may read `apis[-1]`); the path of every HTTP
    request, whatever its route, in `paths`. A chat completion (dict) answering a `stream: true`
    chat request is streamed as vLLM would (`SSE.of`); an `Answer` is rendered for its route,
    streamed when asked. `POST /v1/messages/count_tokens` answers a rough count in vLLM's shape.
    `pieces_sent` counts the SSE pieces handed to the server to write; `stream_cut` is set when a client closed a
    stream before its end.
    """

    replies: Iterable[ScriptedReply] = ()
    handler: Handler | None = None
    models: tuple[str, ...] = ("scripted-model",)
    requests: list[dict[str, Any]] = field(default_factory=list)
    raw_requests: list[bytes] = field(default_factory=list)
    request_headers: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    apis: list[API] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._queue: deque[ScriptedReply] = deque(self.replies)
        self._last: ScriptedReply | None = None
        self.first_chunk_sent = threading.Event()
        self.stream_cut = threading.Event()
        self.pieces_sent = 0
        self.client_ports: list[int] = []  # per protocol request: the connection it came on
        self.app = _KeepServerReceive(self._routes(), self.paths)

    def _routes(self) -> Starlette:
        def serve(api: API) -> Callable[[Request], Any]:
            async def endpoint(request: Request) -> Response:
                return await self._answer(request, api)

            return endpoint

        return Starlette(
            routes=[
                *(Route(path, serve(api), methods=["POST"]) for api, path in _ROUTES.items()),
                Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/{path:path}", self._echo, methods=["GET", "POST"]),
                Route("/{path:path}", self._echo, methods=["GET", "POST"]),
            ]
        )

    def push(self, *replies: ScriptedReply) -> None:
        """Queue more replies."""
        self._queue.extend(replies)

    def rescript(self, *replies: ScriptedReply) -> None:
        """Replace the script with `replies` (the last then repeats), e.g. between the examples
        of a property test that shares one server."""
        self._queue = deque(replies)
        self._last = None

    def _next(self, body: dict[str, Any]) -> ScriptedReply:
        if self.handler is not None:
            return self.handler(body)
        if self._queue:
            self._last = self._queue.popleft()
        if self._last is None:
            return completion("hello")
        return self._last

    async def _record(self, request: Request, api: API) -> dict[str, Any]:
        raw = await request.body()
        body = orjson.loads(raw)
        self.raw_requests.append(raw)
        self.requests.append(body)
        self.request_headers.append(dict(request.headers.items()))
        self.queries.append(request.url.query)
        self.apis.append(api)
        self.client_ports.append(request.client.port if request.client else 0)
        return body  # type: ignore[no-any-return]

    async def _answer(self, request: Request, api: API) -> Response:
        body = await self._record(request, api)
        reply = self._next(body)
        if isinstance(reply, Fault):
            if reply.delay:
                await asyncio.sleep(reply.delay)
            return Response(
                reply.content(api), status_code=reply.status, media_type="application/json"
            )
        if isinstance(reply, Reset):
            if reply.delay:
                await asyncio.sleep(reply.delay)
            await _reset_connection()
            return Response(b"")  # never sent: the connection is gone
        stream = bool(body.get("stream"))
        if isinstance(reply, Answer):
            reply = SSE.of(reply) if stream else render(reply, api, body)
        elif isinstance(reply, dict) and stream and api is API.CHAT:
            reply = SSE.of(reply)
        elif isinstance(reply, SSE) and not stream:
            if reply.answer is not None:
                reply = render(reply.answer, api, body)
            elif reply.completion is not None:
                reply = reply.completion
        if isinstance(reply, SSE):
            pieces = reply.pieces(api, body)
            return StreamingResponse(self._stream(reply, pieces), media_type="text/event-stream")
        return Response(orjson.dumps(reply), media_type="application/json")

    async def _stream(self, reply: SSE, pieces: list[bytes]) -> Any:
        finished = dropped = False
        try:
            for i, piece in enumerate(pieces):
                if reply.drop_after is not None and i == reply.drop_after:
                    dropped = True
                    raise ConnectionResetError("scripted drop")
                # Counted as it is handed to the server to write: after the yield, a fast
                # client could already hold the piece before it was counted.
                self.pieces_sent += 1
                yield piece
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

    async def _count_tokens(self, request: Request) -> Response:
        # A rough four bytes per token; not recorded in `requests` (it is not an answer).
        count = max(1, len(await request.body()) // 4)
        return Response(
            orjson.dumps(
                {"input_tokens": count, "context_management": {"original_input_tokens": count}}
            ),
            media_type="application/json",
        )

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
                    "query": request.url.query,
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
    """A TCP port on 127.0.0.1 that is free right now, and may be taken by the time it is used:
    a server started here binds port 0 itself (LoopbackServer; `toolsentry serve --port 0
    --port-file`), and a port that must refuse connections is `unused_socket`'s."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def unused_socket() -> socket.socket:
    """A TCP socket bound to a free port on 127.0.0.1 and not listening: a connection to its port
    is refused, and no other server can take the port while it is open. `LoopbackServer(app,
    sock=...)` serves on it later (an upstream that comes back on the same port)."""
    # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets whose proto says TCP,
    # and accepted sockets inherit it; with proto 0 every keep-alive response (headers and
    # body written apart) waited ~40 ms for the client's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    return sock


class LoopbackServer:
    """Runs an ASGI app under uvicorn on 127.0.0.1 in a background thread; a context manager.

    It binds its own socket (`port`, or a free one), or serves on `sock` (from `unused_socket`,
    or a Unix socket bound to its path).
    """

    def __init__(
        self, app: Any, *, port: int | None = None, sock: socket.socket | None = None
    ) -> None:
        if sock is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port or 0))
        self._sock = sock
        address = sock.getsockname()  # a Unix socket's is its path
        self._unix_path: str | None = address if isinstance(address, str) else None
        self.port: int = 0 if self._unix_path is not None else address[1]
        config = uvicorn.Config(
            app, log_level="error", access_log=False, lifespan="on", loop="asyncio"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        """The server's root URL (`unix:///path:` on a Unix socket: add the path after it)."""
        if self._unix_path is not None:
            return f"unix://{self._unix_path}:"
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
