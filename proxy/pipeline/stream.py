"""The stream driver: one streamed request through the turn (DESIGN §7).

`open_stream` opens the upstream stream before the client gets anything, so a failure before the
first byte is an ordinary HTTP error; from then on the returned `TurnStream` owns the open
upstream response. Its body relays the upstream's events through the protocol's
`StreamAssembly`: text and keep-alive comments go out the moment they arrive, each choice's tool
calls are held until it finishes, settled by the turn (validated, repaired by a non-streamed
re-ask, `on_unrepaired` applied), counted in the session store and only then sent as the
protocol's events. The turn closes before the end, and its summary comment goes out before the
terminal event:

    : x-toolsentry {"session": "s1", "errors": 1, "max_errors": 10, "repairs": 0, "violations": ["unknown_tool"]}
    data: [DONE]

An error after the first byte ends the stream with the protocol's error event, after the summary;
so does a session store that fails to count a held call (which then never goes out).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AsyncExitStack, aclosing

from proxy.errors import ToolsentryError, UpstreamError, UpstreamStatusError, status_of
from proxy.logs import get_logger
from proxy.pipeline.report import TurnReport
from proxy.pipeline.turn import Turn
from proxy.protocols.base import StreamAssembly
from proxy.sse import SSEComment, SSEDecoder, encode_comment
from proxy.upstream_response import UpstreamResponse, UpstreamStream, raise_for_status

# After the terminal event the upstream's body is read to its end, once the client has its
# whole response, so that the connection goes back to the pool; but never for longer than this.
_DRAIN_SECONDS = 1.0

_INTERNAL = "internal error in toolsentry; see the proxy's log"


class TurnStream:
    """A streamed answer ready to send: `status`, `headers` and the SSE `body`.

    Until `aclose` it owns the open upstream response. Whoever sends it must call `aclose` once
    the response is over, however it ended (also when the body was never iterated, e.g. a client
    that went away first): it closes the body and the upstream response and closes a turn the
    stream did not finish (status 499). `report` is the turn's report as it stands.
    """

    status = 200

    def __init__(
        self, turn: Turn, body: AsyncGenerator[bytes, None], resources: AsyncExitStack
    ) -> None:
        self.turn = turn
        self.headers = turn.report().headers()
        self._body = body
        self._resources = resources

    @property
    def report(self) -> TurnReport:
        """The turn's report (final once the stream has ended)."""
        return self.turn.report()

    def body(self) -> AsyncIterator[bytes]:
        """The SSE body, one item per burst of events (iterate it once)."""
        return self._body

    async def aclose(self) -> None:
        """Close the body and the upstream response, and close an unfinished turn (idempotent)."""
        try:
            await self._body.aclose()
        finally:
            await self._resources.aclose()


async def open_stream(turn: Turn, *, raw: bytes | None = None) -> TurnStream:
    """Send the turn's request upstream as a stream; return the TurnStream relaying it.

    `raw`: the client's body as sent. Retries happen inside the upstream until its response
    headers arrive. Raises UpstreamError (UpstreamStatusError with the upstream's own error body
    for an error status; the turn closed with its status) before anything reaches the client.
    """
    protocol = turn.protocol
    resources = AsyncExitStack()
    if turn.ending is not None:  # the budget's `finish` policy: the turn is closed
        events, end = protocol.finish_stream(protocol.finish(turn.body, turn.ending), turn.body)
        burst = events + turn.report().comment() + end

        async def finished() -> AsyncGenerator[bytes, None]:
            yield burst

        return TurnStream(turn, finished(), resources)
    relay = _Relay(turn, protocol.assembly(turn.body))
    async with resources:
        # Exits run last in, first out: drain the upstream body (after its terminal event),
        # close the upstream response, close a turn the stream did not finish.
        resources.push_async_callback(relay.close_unfinished)
        started = time.perf_counter()
        try:
            while True:
                upstream = await resources.enter_async_context(
                    turn.upstream.stream(
                        turn.path, body=turn.first_payload(raw), headers=turn.forward
                    )
                )
                if upstream.status < 400:
                    break
                data = b"".join([chunk async for chunk in upstream.chunks])
                elapsed = time.perf_counter() - started
                try:
                    raise_for_status(
                        UpstreamResponse(upstream.status, upstream.headers, data, elapsed),
                        turn.upstream.name,
                    )
                except UpstreamStatusError as exc:
                    # enforce_strict's tools refused: the client's own request, once
                    if not turn.refused_strict(exc):
                        raise
            resources.push_async_callback(relay.drain, upstream.chunks)  # before it closes
        except UpstreamError as exc:
            turn.fail(exc)
            await turn.close(status_of(exc))
            raise
        finally:
            turn.upstream_seconds += time.perf_counter() - started
        return TurnStream(turn, relay.run(upstream), resources.pop_all())


class _Relay:
    """One stream's relay: the decoder, the protocol's assembly, and the turn."""

    def __init__(self, turn: Turn, assembly: StreamAssembly) -> None:
        self.turn = turn
        self.assembly = assembly

    async def run(self, upstream: UpstreamStream) -> AsyncGenerator[bytes, None]:
        """Relay the upstream body; end with the summary and the terminal event, or an error."""
        try:
            async with aclosing(self._relay(upstream)) as bursts:
                async for burst in bursts:
                    yield burst
        except ToolsentryError as exc:
            report = await self._close_failed(exc)
            yield report.comment() + self.assembly.error_event(exc)
        except Exception as exc:
            # A fault of the proxy's own must still end the stream visibly, never cut it.
            get_logger().error("stream_relay_failed", error=repr(exc), exc_info=exc)
            report = await self._close_failed(exc)
            yield report.comment() + self.assembly.error_event(ToolsentryError(_INTERNAL))

    async def _relay(self, upstream: UpstreamStream) -> AsyncGenerator[bytes, None]:
        decoder, assembly, turn = SSEDecoder(), self.assembly, self.turn
        chunks = upstream.chunks
        out: list[bytes] = []
        at_end = False
        while not assembly.done and not at_end:
            started = time.perf_counter()
            try:
                items = decoder.feed(await anext(chunks))
            except StopAsyncIteration:
                items, at_end = decoder.flush(), True
            finally:
                turn.upstream_seconds += time.perf_counter() - started
            try:
                for item in items:
                    if isinstance(item, SSEComment):
                        out.append(encode_comment(item.text))  # keep-alives pass through
                        continue
                    out.extend(assembly.add(item))
                    finished = assembly.take_finished()
                    if finished and out:
                        yield b"".join(out)  # what arrived goes out before a repair is awaited
                        out.clear()
                    if finished:
                        settled = [await turn.settle(choice) for choice in finished]
                        await turn.commit()  # count, then send
                        for answer in settled:
                            out.extend(assembly.release(answer))
                    if assembly.done:
                        break
            except Exception:
                if out:  # what the client should have had before the failure, it gets
                    yield b"".join(out)
                raise
            if out:
                yield b"".join(out)
                out.clear()
        end = assembly.end()
        turn.answered(assembly.response_id)
        await turn.commit()  # what is left (a response id's link) before the terminal event
        report = await turn.close(200)
        yield report.comment() + end

    async def drain(self, chunks: AsyncIterator[bytes]) -> None:
        """Read the rest of an upstream body that sent its terminal event (nothing after a
        cut-off stream)."""
        if not self.assembly.done:
            return
        try:
            async with asyncio.timeout(_DRAIN_SECONDS):
                async for _ in chunks:
                    pass
        except (TimeoutError, UpstreamError):
            pass  # the connection is closed instead of pooled

    async def _close_failed(self, exc: Exception) -> TurnReport:
        turn = self.turn
        if turn.closed:  # on_unrepaired: reject closed it with 422 before raising
            return turn.report()
        if isinstance(exc, UpstreamError):
            turn.fail(exc)
            return await turn.close(status_of(exc))
        return await turn.close(exc.status_code if isinstance(exc, ToolsentryError) else 500)

    async def close_unfinished(self) -> None:
        """Close a turn whose stream ended early: the client went away (status 499)."""
        if not self.turn.closed:
            await self.turn.close(499)
