"""The fastest OpenAI-compatible upstream this benchmark can make: canned bytes on uvloop + httptools.

Every POST gets the same chat completion with one valid tool call (`get_order_details`), or, when
the body asks for `"stream": true`, the same answer as server-sent events: a first content delta
that carries `FIRST_TOKEN`, a pause of `--pause-ms`, then the rest (more content, the tool call's
deltas, the finish chunk, `[DONE]`). A POST to `/v1/responses` gets the same answer as a Responses
`response` (text, then the `function_call` item), or its events in vLLM's order. The pause makes a proxy that buffered the stream visible in
the time to first token. Any GET answers a model list. No framework, no parsing beyond HTTP
framing: whatever time a request takes through a proxy is the proxy's, not this server's.

    python -m bench.fake_upstream --port 9101 [--pause-ms 5]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
from typing import Any, cast

import httptools
import orjson
import uvloop

MODEL = "bench-model"
FIRST_TOKEN = "Checking-first-token"
ARGUMENTS = '{"order_id": "#W1234567"}'
_BASE: dict[str, Any] = {"id": "chatcmpl-bench0000000000", "created": 1_700_000_000, "model": MODEL}


def completion() -> dict[str, Any]:
    """The canned chat completion: one valid call to `get_order_details`."""
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
                            "function": {"name": "get_order_details", "arguments": ARGUMENTS},
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


def stream_events() -> tuple[bytes, bytes]:
    """The canned stream as (first event, everything after the pause)."""
    first = _chunk({"role": "assistant", "content": FIRST_TOKEN})
    call = {"index": 0, "id": "call_bench0001", "type": "function"}
    rest = b"".join(
        [
            _chunk({"content": " your order."}),
            _chunk({"tool_calls": [{**call, "function": {"name": "get_order_details"}}]}),
            _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ARGUMENTS}}]}),
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
    "content": [{"type": "output_text", "text": FIRST_TOKEN + " your order.", "annotations": []}],
}
_CALL_ITEM: dict[str, Any] = {
    "type": "function_call",
    "id": "fc_bench0001",
    "call_id": "call_bench0001",
    "name": "get_order_details",
    "arguments": ARGUMENTS,
    "status": "completed",
}
_RESPONSE_USAGE = {
    "input_tokens": 812,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 21,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 833,
}


def response() -> dict[str, Any]:
    """The canned Responses `response`: the same answer, text then one valid call."""
    return {
        **_RESPONSE_BASE,
        "status": "completed",
        "incomplete_details": None,
        "output": [_TEXT_ITEM, _CALL_ITEM],
        "usage": _RESPONSE_USAGE,
        "tool_choice": "auto",
        "tools": [],
        "parallel_tool_calls": True,
    }


def response_events() -> tuple[bytes, bytes]:
    """The canned Responses stream as (events up to the first token, everything after the pause)."""
    events: list[dict[str, Any]] = []

    def add(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    started = {**response(), "status": "in_progress", "output": [], "usage": None}
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
    add("response.output_text.done", **where, text=FIRST_TOKEN + " your order.", logprobs=[])
    add("response.content_part.done", **where, part=_TEXT_ITEM["content"][0])
    add("response.output_item.done", output_index=0, item=_TEXT_ITEM)
    call = {**_CALL_ITEM, "status": "in_progress", "arguments": ""}
    add("response.output_item.added", output_index=1, item=call)
    at = {"item_id": _CALL_ITEM["id"], "output_index": 1}
    add("response.function_call_arguments.delta", **at, delta=ARGUMENTS)
    add("response.function_call_arguments.done", **at, arguments=ARGUMENTS)
    add("response.output_item.done", output_index=1, item=_CALL_ITEM)
    add("response.completed", response=response())
    encoded = [
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    ]
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


COMPLETION = _plain(b"200 OK", b"application/json", orjson.dumps(completion()))
MODELS = _plain(
    b"200 OK",
    b"application/json",
    orjson.dumps(
        {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]}
    ),
)
_FIRST, _REST = stream_events()
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n" + _chunked(_FIRST)
)
STREAM_TAIL = _chunked(_REST) + b"0\r\n\r\n"
RESPONSE = _plain(b"200 OK", b"application/json", orjson.dumps(response()))
_R_FIRST, _R_REST = response_events()
RESPONSE_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n" + _chunked(_R_FIRST)
)
RESPONSE_STREAM_TAIL = _chunked(_R_REST) + b"0\r\n\r\n"


class _Connection(asyncio.Protocol):
    def __init__(self, pause: float) -> None:
        self._pause = pause
        self._parser = httptools.HttpRequestParser(self)
        self._body: list[bytes] = []
        self._responses = False
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
        self._responses = url.startswith(b"/v1/responses")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        transport = self._transport
        assert transport is not None
        if self._parser.get_method() != b"POST":
            transport.write(MODELS)
            return
        body = b"".join(self._body)
        if b'"stream":true' in body or b'"stream": true' in body:
            transport.write(RESPONSE_STREAM_HEAD if self._responses else STREAM_HEAD)
            tail = RESPONSE_STREAM_TAIL if self._responses else STREAM_TAIL
            asyncio.get_running_loop().call_later(self._pause, self._finish_stream, tail)
            return
        transport.write(RESPONSE if self._responses else COMPLETION)

    def _finish_stream(self, tail: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(tail)


async def serve(host: str, port: int, pause: float) -> None:
    """Serve until cancelled."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(pause), host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--pause-ms", type=float, default=5.0)
    args = parser.parse_args()
    uvloop.run(serve(args.host, args.port, args.pause_ms / 1000))


if __name__ == "__main__":
    main()
