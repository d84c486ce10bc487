"""The streaming chat-completions pipeline (DESIGN §7), on the steps of `ChatService`.

`open_stream` opens the upstream stream before the client gets anything, so a failure before the
first byte is an ordinary HTTP error; from then on the returned `ChatStream` owns the open upstream
response. Its body relays the upstream's SSE through `proxy.streaming`: content and keep-alive
comments go out the moment they arrive, each choice's tool calls are held until the choice
finishes, settled by `ChatService.settle_choice` (validated, repaired by a non-streamed re-ask,
`on_unrepaired` applied) and emitted as deltas. The turn is accounted by `ChatService.finish`
before the end, and a summary comment reports it after the body:

    : x-toolsentry {"session": "s1", "errors": 1, "max_errors": 10, "repairs": 0, "violations": ["unknown_tool"]}
    data: [DONE]

An error after the first byte ends the stream with an `{"error": …}` event (and no `[DONE]`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import AsyncExitStack, aclosing
from typing import TYPE_CHECKING, Any

import orjson

from proxy.errors import (
    ToolsentryError,
    UnrepairedToolCallError,
    UpstreamError,
    error_body,
)
from proxy.guard.channels import Channel
from proxy.logs import get_logger
from proxy.streaming import (
    DONE,
    ChunkAssembler,
    FinishedChoice,
    SSEComment,
    SSEDecoder,
    completion_chunks,
    encode_comment,
    encode_event,
)
from proxy.upstream import UpstreamResponse, UpstreamStream, raise_for_status

if TYPE_CHECKING:
    from proxy.service import ChatService, Turn

SUMMARY_COMMENT = "x-toolsentry"
"""The name that starts the summary comment sent before `[DONE]` (or before an error event)."""

# After `[DONE]` the upstream's body is read to its end, once the client has its whole response,
# so that the connection goes back to the pool; but never for longer than this.
_DRAIN_SECONDS = 1.0


class ChatStream:
    """A streamed chat completion ready to send: `status`, `headers` and the SSE `body`.

    Until `aclose` it owns the open upstream response. Whoever sends it must call `aclose` once
    the response is over, however it ended (also when the body was never iterated, e.g. a client
    that went away first): it closes the body and the upstream response and accounts a turn the
    stream did not finish. `summary` is the turn's summary once the stream has ended.
    """

    status = 200

    def __init__(
        self,
        headers: dict[str, str],
        body: AsyncGenerator[bytes, None],
        resources: AsyncExitStack | None = None,
    ) -> None:
        self.headers = headers
        self._body = body
        self._resources = resources or AsyncExitStack()
        self.summary: dict[str, Any] | None = None

    def body(self) -> AsyncIterator[bytes]:
        """The SSE body, one item per burst of events (iterate it once)."""
        return self._body

    async def aclose(self) -> None:
        """Close the body and the upstream response, and account an unfinished turn (idempotent)."""
        try:
            await self._body.aclose()
        finally:
            await self._resources.aclose()


def completion_stream(
    completion: Mapping[str, Any], headers: dict[str, str], *, include_usage: bool
) -> ChatStream:
    """A ChatStream that sends a ready completion (the budget's `finish` policy) as SSE."""
    chunks = completion_chunks(completion, include_usage=include_usage)
    summary = summary_of(headers)
    events = [encode_event(chunk) for chunk in chunks]

    async def body() -> AsyncGenerator[bytes, None]:
        yield b"".join([*events, summary_comment(summary), DONE])

    stream = ChatStream(headers, body())
    stream.summary = summary
    return stream


async def open_stream(service: ChatService, turn: Turn, path: str) -> ChatStream:
    """Send the turn's request to its upstream as a stream; return the ChatStream relaying it.

    Retries happen inside the upstream until its response headers arrive. Raises UpstreamError
    (UpstreamStatusError with the upstream's own error body for an error status), counted as
    the non-streaming path counts it, before anything reaches the client.
    """
    relay = _Relay(service, turn)
    async with AsyncExitStack() as resources:
        # Exits run last in, first out: drain the upstream body (after [DONE]), close the
        # upstream response, account a turn the stream did not finish.
        resources.push_async_callback(relay.account_unfinished)
        started = time.perf_counter()
        try:
            upstream = await resources.enter_async_context(
                turn.upstream.stream(path, body=orjson.dumps(turn.body), headers=turn.forward)
            )
            if upstream.status >= 400:
                data = b"".join([chunk async for chunk in upstream.chunks])
                elapsed = time.perf_counter() - started
                raise_for_status(
                    UpstreamResponse(upstream.status, upstream.headers, data, elapsed),
                    turn.upstream.name,
                )
            resources.push_async_callback(relay.drain, upstream.chunks)  # before it closes
        except UpstreamError as exc:
            relay.accounted = True
            await service.upstream_failed(turn, exc)
            raise
        finally:
            turn.upstream_seconds += time.perf_counter() - started
        stream = ChatStream(service.headers(turn), relay.run(upstream), resources.pop_all())
        relay.stream = stream
        return stream


def summary_of(headers: Mapping[str, str], failed: list[str] | None = None) -> dict[str, Any]:
    """The summary a stream reports after its body: its x-toolsentry-* headers' final values,
    with `failed` channels (an upstream error) added to the violations."""
    violations = [v for v in headers["x-toolsentry-violations"].split(",") if v]
    return {
        "session": headers["x-toolsentry-session"],
        "errors": int(headers["x-toolsentry-errors"]),
        "max_errors": int(headers["x-toolsentry-max-errors"]),
        "repairs": int(headers["x-toolsentry-repairs"]),
        "violations": list(dict.fromkeys(violations + (failed or []))),
    }


def summary_comment(summary: Mapping[str, Any]) -> bytes:
    """The SSE comment that reports a stream's turn: `: x-toolsentry {json}`."""
    return encode_comment(f"{SUMMARY_COMMENT} {orjson.dumps(summary).decode()}")


class _Relay:
    """One stream's relay: decoder, assembler and the turn's accounting state."""

    def __init__(self, service: ChatService, turn: Turn) -> None:
        self.service = service
        self.turn = turn
        self.accounted = False
        self.saw_done = False
        self.stream: ChatStream | None = None
        self._failed: list[str] = []

    async def run(self, upstream: UpstreamStream) -> AsyncGenerator[bytes, None]:
        """Relay the upstream body; end with the summary and `[DONE]`, or an error event."""
        try:
            async with aclosing(self._relay(upstream)) as bursts:
                async for burst in bursts:
                    yield burst
        except ToolsentryError as exc:
            await self._account_failure(exc)
            yield self._summary_comment() + encode_event(exc.body())
        except Exception as exc:
            # A fault of the proxy's own must still end the stream visibly, never cut it.
            get_logger().error("stream_relay_failed", error=repr(exc), exc_info=exc)
            await self._account_failure(exc)
            body = error_body("internal error in toolsentry; see the proxy's log", "internal_error")
            yield self._summary_comment() + encode_event(body)

    async def _relay(self, upstream: UpstreamStream) -> AsyncGenerator[bytes, None]:
        decoder, assembler = SSEDecoder(), ChunkAssembler()
        chunks = upstream.chunks
        out: list[bytes] = []
        done = at_end = False
        while not done and not at_end:
            started = time.perf_counter()
            try:
                items = decoder.feed(await anext(chunks))
            except StopAsyncIteration:
                items, at_end = decoder.flush(), True
            finally:
                self.turn.upstream_seconds += time.perf_counter() - started
            try:
                for item in items:
                    if isinstance(item, SSEComment):
                        out.append(encode_comment(item.text))  # keep-alives pass through
                        continue
                    if item.payload is None:
                        done = self.saw_done = True
                        break
                    out.extend(encode_event(chunk) for chunk in assembler.add(item.payload))
                    finished = assembler.take_finished()
                    if finished and out:
                        yield b"".join(out)  # what arrived goes out before a repair is awaited
                        out.clear()
                    for choice in finished:
                        out.extend(await self._release(choice, assembler))
            except Exception:
                if out:  # what the client should have had before the failure, it gets
                    yield b"".join(out)
                raise
            if out:
                yield b"".join(out)
                out.clear()
        assembler.close()  # an upstream that ends without [DONE] is fine if every choice finished
        await self._finish()
        yield self._summary_comment() + DONE

    async def _release(self, choice: FinishedChoice, assembler: ChunkAssembler) -> list[bytes]:
        settled = await self.service.settle_choice(self.turn, choice.message, choice.finish_reason)
        for usage in settled.extra_usage:
            assembler.add_usage(usage)
        chunks = assembler.emit_tool_calls(choice.index, settled.message, settled.finish_reason)
        return [encode_event(chunk) for chunk in chunks]

    async def drain(self, chunks: AsyncIterator[bytes]) -> None:
        """Read the rest of an upstream body that sent `[DONE]` (nothing after a cut-off stream)."""
        if not self.saw_done:
            return
        try:
            async with asyncio.timeout(_DRAIN_SECONDS):
                async for _ in chunks:
                    pass
        except (TimeoutError, UpstreamError):
            pass  # the connection is closed instead of pooled

    async def _finish(self, status: str = "200") -> None:
        self.accounted = True
        await self.service.finish(self.turn, status=status)

    async def _account_failure(self, exc: Exception) -> None:
        if self.accounted:
            return
        if isinstance(exc, UnrepairedToolCallError):
            self.accounted = True  # settle_choice accounted the turn before raising
        elif isinstance(exc, UpstreamError):
            self.accounted = True
            self._failed.append(Channel.UPSTREAM_ERROR.value)
            await self.service.upstream_failed(self.turn, exc)
        else:
            status = str(exc.status_code) if isinstance(exc, ToolsentryError) else "500"
            await self._finish(status)

    async def account_unfinished(self) -> None:
        """Account a turn whose stream ended early: the client went away (status 499)."""
        if not self.accounted:
            await self._finish("499")
        if self.stream is not None and self.stream.summary is None:
            self.stream.summary = self._summary()

    def _summary(self) -> dict[str, Any]:
        return summary_of(self.service.headers(self.turn), self._failed)

    def _summary_comment(self) -> bytes:
        summary = self._summary()
        if self.stream is not None:
            self.stream.summary = summary
        return summary_comment(summary)
