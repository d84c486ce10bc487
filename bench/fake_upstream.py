"""The fastest upstream this benchmark can make: canned bytes on uvloop + httptools.

Every POST gets the same answer with one valid tool call, in the protocol of its path: a chat
completion (`/v1/chat/completions`), a Responses `response` (`/v1/responses`: text, then the
`function_call` item) or an Anthropic `message` (`/v1/messages`, any query string: a text block,
then a `tool_use` block). When the body asks for `"stream": true` it gets the same answer as
server-sent events, in vLLM's order: the events up to a first text delta that carries
`FIRST_TOKEN`, a pause of `--pause-ms`, then the rest (more text, the call, the end). The pause
makes a proxy that buffered the stream visible in the time to first token. The call is to
`get_order_details`, or to `Bash` when the body declares a tool of that name (the Claude-Code-sized
requests of bench.overhead), so that the call is always one the request declared. Any GET
answers a model list. No framework, no parsing beyond HTTP framing and two substring checks:
whatever time a request takes through a proxy is the proxy's, not this server's.

Paced mode, for bench.streaming: a chat POST under `/paced/` (`/paced/v1/chat/completions`; give
a proxy `…/paced/v1` as its upstream) is parsed and answered like a model decoding: `max_tokens`
content chunks `bench_gap_ms` apart, each stamped with the upstream's `time.monotonic_ns()` in a
top-level field `t` (the clock is system-wide, so a client can tell each chunk's delivery
latency), then with `bench_tool_call` one tool call, then the finish; without `stream`, one
plain answer of `max_tokens` tokens.

    python -m bench.fake_upstream --port 9101 [--pause-ms 5] [--processes 1]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import time
from dataclasses import dataclass
from typing import Any, cast

import httptools
import orjson
import uvloop

from proxy.protocols.answer import Answer, Call, Usage
from proxy.protocols.messages import answer as anthropic
from proxy.sse import encode_typed_event as sse_event

MODEL = "bench-model"
FIRST_TOKEN = "Checking-first-token"
TEXT = FIRST_TOKEN + " your order."
ARGUMENTS = '{"order_id": "#W1234567"}'


@dataclass(frozen=True)
class CannedCall:
    """The one tool call of every canned answer."""

    name: str
    arguments: str


ORDER_CALL = CannedCall("get_order_details", ARGUMENTS)
BASH_CALL = CannedCall("Bash", '{"command": "ls -la", "description": "List the files here"}')
_BASH_DECLARED = b'"Bash"'  # a body that names a tool `Bash` gets BASH_CALL
_BASE: dict[str, Any] = {"id": "chatcmpl-bench0000000000", "created": 1_700_000_000, "model": MODEL}


def completion(call: CannedCall = ORDER_CALL) -> dict[str, Any]:
    """The canned chat completion: one valid call (to `get_order_details` by default)."""
    return {
        **_BASE,
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_bench0001",
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 812, "completion_tokens": 21, "total_tokens": 833},
    }


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
    event = {
        **_BASE,
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    return b"data: " + orjson.dumps(event) + b"\n\n"


def stream_events(call: CannedCall = ORDER_CALL) -> tuple[bytes, bytes]:
    """The canned chat stream as (first event, everything after the pause)."""
    first = _chunk({"role": "assistant", "content": FIRST_TOKEN})
    opened = {"index": 0, "id": "call_bench0001", "type": "function"}
    rest = b"".join(
        [
            _chunk({"content": " your order."}),
            _chunk({"tool_calls": [{**opened, "function": {"name": call.name}}]}),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": call.arguments}}]}),
            _chunk({}, "tool_calls"),
            b"data: [DONE]\n\n",
        ]
    )
    return first, rest


_RESPONSE_BASE: dict[str, Any] = {
    "id": "resp_bench0000000000",
    "object": "response",
    "created_at": 1_700_000_000,
    "model": MODEL,
}
_TEXT_ITEM: dict[str, Any] = {
    "type": "message",
    "id": "msg_bench0001",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": TEXT, "annotations": []}],
}
_RESPONSE_USAGE = {
    "input_tokens": 812,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 21,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 833,
}


def _call_item(call: CannedCall) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": "fc_bench0001",
        "call_id": "call_bench0001",
        "name": call.name,
        "arguments": call.arguments,
        "status": "completed",
    }


def response(call: CannedCall = ORDER_CALL) -> dict[str, Any]:
    """The canned Responses `response`: the same answer, text then one valid call."""
    return {
        **_RESPONSE_BASE,
        "status": "completed",
        "incomplete_details": None,
        "output": [_TEXT_ITEM, _call_item(call)],
        "usage": _RESPONSE_USAGE,
        "tool_choice": "auto",
        "tools": [],
        "parallel_tool_calls": True,
    }


def _named(event: dict[str, Any]) -> bytes:
    return sse_event(event)


def response_events(call: CannedCall = ORDER_CALL) -> tuple[bytes, bytes]:
    """The canned Responses stream as (events up to the first token, everything after the pause)."""
    events: list[dict[str, Any]] = []

    def add(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    started = {**response(call), "status": "in_progress", "output": [], "usage": None}
    add("response.created", response=started)
    add("response.in_progress", response=started)
    opened = {**_TEXT_ITEM, "status": "in_progress", "content": []}
    add("response.output_item.added", output_index=0, item=opened)
    where = {"item_id": _TEXT_ITEM["id"], "output_index": 0, "content_index": 0}
    part = {"type": "output_text", "text": "", "annotations": []}
    add("response.content_part.added", **where, part=part)
    add("response.output_text.delta", **where, delta=FIRST_TOKEN, logprobs=[])
    first = len(events)
    add("response.output_text.delta", **where, delta=" your order.", logprobs=[])
    add("response.output_text.done", **where, text=TEXT, logprobs=[])
    add("response.content_part.done", **where, part=_TEXT_ITEM["content"][0])
    add("response.output_item.done", output_index=0, item=_TEXT_ITEM)
    item = _call_item(call)
    add(
        "response.output_item.added",
        output_index=1,
        item={**item, "status": "in_progress", "arguments": ""},
    )
    at = {"item_id": item["id"], "output_index": 1}
    add("response.function_call_arguments.delta", **at, delta=call.arguments)
    add("response.function_call_arguments.done", **at, arguments=call.arguments)
    add("response.output_item.done", output_index=1, item=item)
    add("response.completed", response=response(call))
    encoded = [_named(e) for e in events]
    return b"".join(encoded[:first]), b"".join(encoded[first:])


def _anthropic_answer(call: CannedCall) -> Answer:
    return Answer(
        text=TEXT,
        calls=(Call(call.name, call.arguments, "toolu_bench0001"),),
        usage=Usage(input_tokens=812, output_tokens=21),
        model=MODEL,
        id="bench0000000000",
    )


def message(call: CannedCall = ORDER_CALL) -> dict[str, Any]:
    """The canned Anthropic `message`: the same answer, a text block then one `tool_use` block
    (vLLM's Messages shapes, written by proxy/protocols/messages/answer.py)."""
    return anthropic.body(_anthropic_answer(call))


def message_events(call: CannedCall = ORDER_CALL) -> tuple[bytes, bytes]:
    """The canned Messages stream as (events up to the first token, everything after the pause):
    `message_start`, a `ping` as Anthropic's API sends, the text block whose first delta is
    `FIRST_TOKEN`, the `tool_use` block, `message_delta`, `message_stop`."""
    answer = _anthropic_answer(call)
    events = anthropic.events(answer, fragment=len(FIRST_TOKEN), ping=True)
    first = next(
        i + 1
        for i, e in enumerate(events)
        if e["type"] == "content_block_delta" and e["delta"].get("text") == FIRST_TOKEN
    )
    encoded = [_named(e) for e in events]
    return b"".join(encoded[:first]), b"".join(encoded[first:])


def _plain(status: bytes, content_type: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: "
        + content_type
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


_STREAM_HEADERS = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


@dataclass(frozen=True)
class Canned:
    """One protocol's answer to one call as the bytes written: plain, and a stream's head (the
    headers and the events up to the first token) and tail (after the pause)."""

    plain: bytes
    stream_head: bytes
    stream_tail: bytes

    @classmethod
    def of(cls, body: dict[str, Any], stream: tuple[bytes, bytes]) -> Canned:
        first, rest = stream
        return cls(
            _plain(b"200 OK", b"application/json", orjson.dumps(body)),
            _STREAM_HEADERS + _chunked(first),
            _chunked(rest) + b"0\r\n\r\n",
        )


CANNED: dict[tuple[str, CannedCall], Canned] = {
    (api, call): Canned.of(body(call), events(call))
    for call in (ORDER_CALL, BASH_CALL)
    for api, body, events in (
        ("chat", completion, stream_events),
        ("responses", response, response_events),
        ("messages", message, message_events),
    )
}
"""The canned answers by (wire protocol, call)."""

MODELS = _plain(
    b"200 OK",
    b"application/json",
    orjson.dumps(
        {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]}
    ),
)


def _api_of(url: bytes) -> str:
    if url.startswith(b"/v1/responses"):
        return "responses"
    if url.startswith(b"/v1/messages"):
        return "messages"
    return "chat"


# -- paced mode (bench.streaming) ------------------------------------------------------------------

PACED = b"/paced/"


def _paced_chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "t": time.monotonic_ns(),
        "choices": [choice],
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


def _paced_plain(count: int) -> bytes:
    message = {"role": "assistant", "content": "".join(f"tok{i} " for i in range(count))}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
    body = {"id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": MODEL}
    body |= {"choices": [choice], "usage": {"prompt_tokens": 1, "completion_tokens": count}}
    return _plain(b"200 OK", b"application/json", orjson.dumps(body))


async def _paced_stream(transport: asyncio.Transport, request: dict[str, Any]) -> None:
    """Write a paced stream (see the module's docstring), each event a chunk of its own."""
    count, gap = int(request.get("max_tokens", 20)), float(request.get("bench_gap_ms", 0)) / 1000

    def emit(data: bytes) -> None:
        if not transport.is_closing():
            transport.write(_chunked(data))

    transport.write(_STREAM_HEADERS)
    emit(_paced_chunk({"role": "assistant", "content": ""}))
    for i in range(count):
        if gap:
            await asyncio.sleep(gap)
        emit(_paced_chunk({"content": f"tok{i} "}))
    finish = "stop"
    if request.get("bench_tool_call"):
        head = {"index": 0, "id": "call_1", "type": "function"}
        emit(_paced_chunk({"tool_calls": [head | {"function": {"name": "get_order_details"}}]}))
        arguments = '{"order_id": "#W1"}'
        emit(_paced_chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}))
        finish = "tool_calls"
    emit(_paced_chunk({}, finish) + b"data: [DONE]\n\n")
    if not transport.is_closing():
        transport.write(b"0\r\n\r\n")


class _Connection(asyncio.Protocol):
    def __init__(self, pause: float) -> None:
        self._pause = pause
        self._parser = httptools.HttpRequestParser(self)
        self._body: list[bytes] = []
        self._api = "chat"
        self._paced = False
        self._stream: asyncio.Task[None] | None = None  # a paced stream being written
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            assert self._transport is not None
            self._transport.close()

    def on_message_begin(self) -> None:
        self._body.clear()

    def on_url(self, url: bytes) -> None:
        self._paced = url.startswith(PACED)
        self._api = _api_of(url)

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        transport = self._transport
        assert transport is not None
        if self._parser.get_method() != b"POST":
            transport.write(MODELS)
            return
        body = b"".join(self._body)
        if self._paced:
            self._answer_paced(orjson.loads(body))
            return
        call = BASH_CALL if _BASH_DECLARED in body else ORDER_CALL
        canned = CANNED[self._api, call]
        if b'"stream":true' in body or b'"stream": true' in body:
            transport.write(canned.stream_head)
            asyncio.get_running_loop().call_later(
                self._pause, self._finish_stream, canned.stream_tail
            )
            return
        transport.write(canned.plain)

    def _answer_paced(self, request: dict[str, Any]) -> None:
        assert self._transport is not None
        if request.get("stream"):
            # The client waits for this answer before its next request: no two overlap.
            self._stream = asyncio.get_running_loop().create_task(
                _paced_stream(self._transport, request)
            )
        else:
            self._transport.write(_paced_plain(int(request.get("max_tokens", 20))))

    def _finish_stream(self, tail: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(tail)


async def serve(host: str, port: int, pause: float, *, reuse_port: bool = False) -> None:
    """Serve until cancelled; with `reuse_port`, beside other processes on the same port."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Connection(pause), host, port, backlog=1024, reuse_port=reuse_port or None
    )
    async with server:
        await server.serve_forever()


def _serve_process(host: str, port: int, pause: float, reuse_port: bool) -> None:
    uvloop.run(serve(host, port, pause, reuse_port=reuse_port))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pause-ms", type=float, default=5.0)
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="processes serving the port together (SO_REUSEPORT): one per core given [1]",
    )
    args = parser.parse_args()
    shared = args.processes > 1
    others = [
        multiprocessing.get_context("fork").Process(
            target=_serve_process,
            args=(args.host, args.port, args.pause_ms / 1000, shared),
            daemon=True,
        )
        for _ in range(args.processes - 1)
    ]
    for process in others:
        process.start()
    _serve_process(args.host, args.port, args.pause_ms / 1000, shared)


if __name__ == "__main__":
    main()
