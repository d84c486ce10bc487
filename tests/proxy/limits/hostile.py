"""An upstream on loopback that answers each request as the test scripts it: bodies over a cap,
compression bombs, error bodies over a cap, streams that never end, bodies that drip, answers
held until released; it notes each request whose client (the proxy) went away before its end."""

from __future__ import annotations

import asyncio
import functools
import gzip
import threading
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

MB = 1024 * 1024


@functools.cache
def gzip_bomb(decoded: int) -> bytes:
    """A gzip body that decodes to `decoded` zero bytes (about a thousandth of it on the wire)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(MB)
    parts = [compressor.compress(block) for _ in range(decoded // MB)]
    return b"".join([*parts, compressor.flush()])


def chat_chunk(content: str) -> bytes:
    chunk = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "hostile",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def responses_event(kind: str, **fields: Any) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (kind.encode(), orjson.dumps({"type": kind, **fields}))


def messages_event(kind: str, **fields: Any) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (kind.encode(), orjson.dumps({"type": kind, **fields}))


async def endless(first: list[bytes], piece: bytes, pause: float) -> AsyncIterator[bytes]:
    """`first`, then `piece` every `pause` seconds, forever (until the reader goes)."""
    for event in first:
        yield event
    while True:
        yield piece
        await asyncio.sleep(pause)


async def breaks_off(pieces: list[bytes]) -> AsyncIterator[bytes]:
    """`pieces`, then a failure: the server drops the connection mid-body."""
    for piece in pieces:
        yield piece
    raise ConnectionAbortedError("the hostile upstream breaks off here")


def opening(api: str) -> list[bytes]:
    """What a stream of `api` sends before its text: the events that open a message."""
    if api == "responses":
        response = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
        item = {"type": "message", "id": "msg_1", "role": "assistant", "content": []}
        return [
            responses_event("response.created", response=response),
            responses_event("response.output_item.added", output_index=0, item=item),
        ]
    if api == "messages":
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "hostile",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 1, "output_tokens": 0},
        }
        block = {"type": "text", "text": ""}
        return [
            messages_event("message_start", message=message),
            messages_event("content_block_start", index=0, content_block=block),
        ]
    return []


def text_piece(api: str, text: str) -> bytes:
    if api == "responses":
        return responses_event(
            "response.output_text.delta",
            output_index=0,
            item_id="msg_1",
            content_index=0,
            delta=text,
        )
    if api == "messages":
        return messages_event(
            "content_block_delta", index=0, delta={"type": "text_delta", "text": text}
        )
    return chat_chunk(text)


async def noting_the_end(
    pieces: AsyncIterator[bytes], gone: list[str], path: str
) -> AsyncIterator[bytes]:
    """`pieces`, noting `path` in `gone` when the reader goes away before their end."""
    try:
        async for piece in pieces:
            yield piece
    except BaseException:
        gone.append(path)
        raise


@dataclass
class Hostile:
    """What the next requests get: `mode` names the attack; `requests` counts them. `held`
    requests wait until `release` is set; `gone` names each request whose client went away
    first (its connection closed)."""

    mode: str = "big"
    size: int = 4 * MB
    requests: int = 0
    seen: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)

    @property
    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{path:path}", self._answer, methods=["GET", "POST"])])

    async def _answer(self, request: Request) -> Response:
        self.requests += 1
        path = request.url.path
        self.seen.append(path)
        api = "responses" if "responses" in path else "messages" if "messages" in path else "chat"
        json = {"content-type": "application/json"}
        if path.endswith("/models"):  # what /readyz asks: always answered
            return Response(b'{"object": "list", "data": []}', headers=json)
        if self.mode == "held":  # no answer until released, or until the client goes
            while not self.release.is_set():
                if await request.is_disconnected():
                    self.gone.append(path)
                    return Response(status_code=499)
                await asyncio.sleep(0.02)
            return Response(orjson.dumps(_completion("released")), headers=json)
        if self.mode == "fine":
            return Response(orjson.dumps(_completion("fine")), headers=json)
        if self.mode == "drip":  # a 200 whose body comes a byte at a time, never all of it
            pieces = endless([b'{"pad": "'], b"x", 0.05)
            body = noting_the_end(pieces, self.gone, path)
            return StreamingResponse(body, headers={**json, "content-length": str(MB)})
        if self.mode == "big":  # a 200 whose body never fits
            return Response(b'{"pad": "' + b"x" * self.size + b'"}', headers=json)
        if self.mode == "big_error":
            text = b'{"error": {"message": "' + b"x" * self.size + b'"}}'
            return Response(text, status_code=500, headers=json)
        if self.mode == "bomb":
            headers = {**json, "content-encoding": "gzip"}
            return Response(gzip_bomb(self.size), headers=headers)
        if self.mode == "small_gzip":  # under the cap: decoded and answered
            body = orjson.dumps(_completion("fine"))
            return Response(gzip.compress(body), headers={**json, "content-encoding": "gzip"})
        if self.mode == "breaks":  # a 200 that breaks off in the middle of its body
            return StreamingResponse(breaks_off([b'{"pad": "' + b"x" * self.size]), headers=json)
        sse = {"content-type": "text/event-stream"}
        if self.mode == "breaks_stream":  # a stream that breaks off in the middle
            pieces = [*opening(api), *[text_piece(api, "z" * 4096)] * (self.size // 4096)]
            return StreamingResponse(breaks_off(pieces), headers=sse)
        if self.mode == "endless":  # text as fast as it goes: the byte cap ends it
            piece = text_piece(api, "y" * 4096)
            return StreamingResponse(endless(opening(api), piece, 0), headers=sse)
        if self.mode == "pings":  # a comment now and then, forever: only a deadline ends it
            pings = endless(opening(api), b": ping\n\n", 0.05)
            return StreamingResponse(noting_the_end(pings, self.gone, path), headers=sse)
        raise AssertionError(self.mode)


def _completion(content: str) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "hostile",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
