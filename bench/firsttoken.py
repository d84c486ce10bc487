"""The proxy's own time to first token, in-process: what bench/ttft.py's added TTFT is made of.

A streamed request of bench/bodies.py through create_app's ASGI app, with the upstream stubbed
in-process (its canned stream from bench/fake_upstream.py, no sockets, no HTTP server): from the
ASGI call to the `http.response.start` message (headers) and to the first body message that
carries the first token. CPU time (`time.process_time_ns`) and wall time, medians over
requests, after a warm-up and `gc.freeze()` as the proxy does at startup (bench/drivers.py's
AsgiDriver). End-to-end TTFT on a machine shared with other work is mostly scheduling; this is the part that is the proxy's code.

    python -m bench.firsttoken [--requests 2000] [--profile chat]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvloop
from starlette.types import Message, Receive, Scope, Send

from bench.bodies import request_body
from bench.drivers import AsgiDriver
from bench.fake_upstream import FIRST_TOKEN, message_events, response_events, stream_events
from proxy.app import create_app
from proxy.config import Settings
from proxy.config_upstream import UpstreamConfig
from proxy.upstream_response import UpstreamResponse, UpstreamStream

ROUTES = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
_STREAMS = {"chat": stream_events, "responses": response_events, "messages": message_events}
_MARK = FIRST_TOKEN.encode()


class StubStreamUpstream:
    """An upstream whose every stream is the canned one of `api`, in its two bursts."""

    name = "stub"

    def __init__(self, api: str) -> None:
        self.bursts = _STREAMS[api]()

    async def request(self, method: str, path: str, *, body: Any, headers: Any) -> UpstreamResponse:
        raise NotImplementedError("streamed requests only")

    @asynccontextmanager
    async def stream(
        self, path: str, *, body: Any, headers: Any, method: str = "POST"
    ) -> AsyncIterator[UpstreamStream]:
        async def chunks() -> AsyncGenerator[bytes, None]:
            for burst in self.bursts:
                yield burst

        body_chunks = chunks()
        try:
            yield UpstreamStream(200, {"content-type": "text/event-stream"}, body_chunks)
        finally:
            await body_chunks.aclose()

    async def close(self) -> None:
        return None


def measure(api: str, requests: int, profiler: cProfile.Profile | None = None) -> dict[str, float]:
    """Medians in µs: CPU and wall time to the headers and to the first token."""
    app = create_app(
        Settings(upstreams=[UpstreamConfig(name="stub", base_url="http://stub/v1")]),
        upstreams=[StubStreamUpstream(api)],
    )
    marks: list[tuple[int, ...]] = []
    got: list[int] = []

    async def timed(scope: Scope, receive: Receive, send: Send) -> None:
        """The app, with the moments of its headers and its first token noted."""

        async def noting(message: Message) -> None:
            if message["type"] == "http.response.start":
                got.extend((time.process_time_ns(), time.perf_counter_ns()))
            elif len(got) == 4 and _MARK in message.get("body", b""):
                got.extend((time.process_time_ns(), time.perf_counter_ns()))
                if profiler is not None:
                    profiler.disable()
            await send(message)

        await app(scope, receive, noting)

    driver = AsgiDriver(timed, request_body(stream=True, api=api), ROUTES[api])

    async def one(profile: bool) -> None:
        got[:] = [time.process_time_ns(), time.perf_counter_ns()]
        if profiler is not None and profile:
            profiler.enable()
        await driver.request()
        if len(got) == 6:
            cpu, wall = got[0], got[1]
            marks.append((got[2] - cpu, got[3] - wall, got[4] - cpu, got[5] - wall))

    async def run() -> None:
        async with app.router.lifespan_context(app):
            for _ in range(200):
                await one(False)
            marks.clear()
            gc.freeze()
            for _ in range(requests):
                await one(True)

    uvloop.run(run())
    driver.check()
    if len(marks) != requests:
        raise RuntimeError(f"{requests - len(marks)} streams never carried the first token")

    def median(i: int) -> float:
        return statistics.median(m[i] for m in marks) / 1000

    return {
        "cpu_headers_us": median(0),
        "wall_headers_us": median(1),
        "cpu_first_token_us": median(2),
        "wall_first_token_us": median(3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument(
        "--profile",
        choices=sorted(ROUTES),
        help="print cProfile's top entries up to the first token",
    )
    args = parser.parse_args()
    if args.profile:
        profiler = cProfile.Profile()
        measure(args.profile, args.requests, profiler)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
        return
    print(f"{'api':10} {'CPU to headers':>15} {'CPU to 1st token':>17} {'wall to 1st token':>18}")
    for api in ROUTES:
        r = measure(api, args.requests)
        print(
            f"{api:10} {r['cpu_headers_us']:12.1f} µs {r['cpu_first_token_us']:14.1f} µs"
            f" {r['wall_first_token_us']:15.1f} µs"
        )


if __name__ == "__main__":
    main()
