"""How little a shadowed pair can cost the proxy, beside what a request costs: the floor under
the shadow throughput goal (c64 with every request shadowed at least 80% of shadowing off).

On one core the goal leaves a pair (1 / 0.8 − 1) = 0.25 of an unshadowed request's CPU. This
measures, in one process and in the same rounds (arms interleaved, the order reversed every
other round; CPU time from getrusage; concurrency 16 against bench/fake_upstream.py on loopback;
on two CPUs or more the upstream runs on CPU 0 and this process on CPU 1):

- `request`: one chat request through the proxy's ASGI app, shadowing off (bench/drivers.py's
  AsgiDriver: no client sockets, so the proxy's own work and its upstream exchange);
- `request, shadowed`: the same app with every request shadowed, the fake upstream as the
  reference (what a pair costs today is the difference);
- `reference exchange`: the shadow's own client (`HttpUpstream`, no retries) as the shadow sends
  with it: on an idle connection, the answer read by the connection's callback (`send`);
- `reference exchange, a task each`: the same client's `request`, each in a task of its own (how
  the shadow sends when no connection is idle);
- `socket floor`: the same request and answer over a bare asyncio protocol (bytes built once,
  httptools parsing the answer, a callback per answer: no task, no future, no pool), the least
  any exchange can cost in this process;
- `judge`: the reference's answer checked as the shadow checks it (JSON parse, the adapter's
  read, the guard's validation, the decision), no I/O.

The socket floor plus the judge is what any implementation of the shadow must spend per pair
before it counts anything; the budget is 0.25 of `request`.

    python -m bench.shadowfloor [--rounds 8] [--requests 1000] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import httptools
import orjson
import uvloop

from bench.bodies import request_body
from bench.drivers import AsgiDriver
from bench.fake_upstream import completion
from bench.machine import cpu_seconds, load_average
from bench.processes import free_port, wait_port
from bench.tables import markdown_table, spread
from proxy.app import create_app
from proxy.config import Settings
from proxy.config_upstream import UpstreamConfig
from proxy.errors import UpstreamError
from proxy.protocols.chat import ChatProtocol
from proxy.shadow import judge_for
from proxy.upstream import HttpUpstream, Sent
from proxy.upstream_response import UpstreamResponse

OUT = Path(__file__).resolve().parent / "results" / "shadowfloor.md"
CONCURRENCY = 16
GOAL = 0.80
ROUTE = "/v1/chat/completions"

Arm = Callable[[int], Awaitable[None]]


class _Raw(asyncio.Protocol):
    """One keep-alive connection; `done` is called once per complete answer."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.done: Callable[[_Raw], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        done, self.done = self.done, None
        if done is not None:
            done(self)


async def _drive(step: Callable[[], Coroutine[Any, Any, None]], n: int) -> None:
    """`n` calls of `step`, CONCURRENCY at a time, each in a task of its own."""
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(CONCURRENCY)
    pending: set[asyncio.Task[None]] = set()

    def finished(task: asyncio.Task[None]) -> None:
        pending.discard(task)
        slots.release()

    for _ in range(n):
        await slots.acquire()
        task = loop.create_task(step())
        pending.add(task)
        task.add_done_callback(finished)
    await asyncio.gather(*pending)


async def arms(port: int, stack: contextlib.AsyncExitStack) -> dict[str, Arm]:
    base = f"http://127.0.0.1:{port}/v1"
    body = request_body()
    apps = {}
    for name, shadow in (("request", None), ("request, shadowed", {"reference": "bench"})):
        settings: dict[str, Any] = {"upstreams": [{"name": "bench", "base_url": base}]}
        if shadow is not None:
            settings["shadow"] = {**shadow, "sample": 1.0, "max_in_flight": 4 * CONCURRENCY}
        app = create_app(Settings(**settings), environ={})
        await stack.enter_async_context(app.router.lifespan_context(app))
        apps[name] = app

    def through(app: Any) -> Arm:
        driver = AsgiDriver(app, body, ROUTE)

        async def arm(n: int) -> None:
            async def worker(count: int) -> None:
                for _ in range(count):
                    await driver.request()

            await asyncio.gather(*(worker(n // CONCURRENCY) for _ in range(CONCURRENCY)))
            if app.state.shadow is not None:
                await app.state.shadow.drain()
            driver.check()

        return arm

    reference = HttpUpstream(UpstreamConfig(name="bench", base_url=base), api_key=None, retries=0)
    stack.push_async_callback(reference.close)
    headers = {"content-type": "application/json"}

    async def exchange() -> None:
        response = await reference.request("POST", "chat/completions", body=body, headers=headers)
        if response.status != 200:
            raise RuntimeError(f"the fake upstream answered {response.status}")

    loop = asyncio.get_running_loop()

    async def callbacks(n: int) -> None:
        # The pool's connections, idle from now on (the other arms outlast a keep-alive): 16
        # exchanges more, as a task each, counted with the arm's n (1.6% of n = 1000).
        await _drive(exchange, CONCURRENCY)
        left, finished = n, loop.create_future()

        def send() -> None:
            nonlocal left
            left -= 1
            sent = reference.send(
                "POST", "chat/completions", body=body, headers=headers, done=answered
            )
            if sent is None:
                raise RuntimeError("no idle connection in the reference's pool")

        def answered(sent: Sent, result: UpstreamResponse | UpstreamError) -> None:
            if not isinstance(result, UpstreamResponse) or result.status != 200:
                finished.set_exception(RuntimeError(f"the fake upstream answered {result!r}"))
            elif left > 0:
                send()
            elif reference.pool().idle == CONCURRENCY and not finished.done():
                finished.set_result(None)

        for _ in range(min(n, CONCURRENCY)):
            send()
        await finished

    raws: list[_Raw] = []
    for _ in range(CONCURRENCY):
        transport, raw = await loop.create_connection(_Raw, "127.0.0.1", port)
        stack.callback(transport.close)
        raws.append(raw)
    head = (
        f"POST {ROUTE} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()

    async def socket_floor(n: int) -> None:
        left, finished = n, loop.create_future()

        def send(raw: _Raw) -> None:
            nonlocal left
            left -= 1
            raw.done = answered
            assert raw.transport is not None
            raw.transport.writelines((head, body))

        def answered(raw: _Raw) -> None:
            if left > 0:
                send(raw)
            elif all(r.done is None for r in raws) and not finished.done():
                finished.set_result(None)

        for raw in raws[: min(n, len(raws))]:
            send(raw)
        await finished

    protocol = ChatProtocol()
    view = protocol.view(orjson.loads(body), None)
    judge = judge_for(protocol, view, "bench")
    answer = orjson.dumps(completion())

    async def judging(n: int) -> None:
        for _ in range(n):
            judge(orjson.loads(answer))

    return {
        "request": through(apps["request"]),
        "request, shadowed": through(apps["request, shadowed"]),
        "reference exchange": callbacks,
        "reference exchange, a task each": lambda n: _drive(exchange, n),
        "socket floor": socket_floor,
        "judge": judging,
    }


async def measure(port: int, rounds: int, requests: int) -> dict[str, list[float]]:
    async with contextlib.AsyncExitStack() as stack:
        table = await arms(port, stack)
        for arm in table.values():  # warm-up
            await arm(max(CONCURRENCY, requests // 4))
        out: dict[str, list[float]] = {name: [] for name in table}
        names = list(table)
        for round_ in range(rounds):
            for name in names if round_ % 2 == 0 else names[::-1]:
                start = cpu_seconds()
                await table[name](requests)
                out[name].append((cpu_seconds() - start) / requests * 1e6)
            print(
                f"  round {round_ + 1}/{rounds}: "
                + ", ".join(f"{name} {values[-1]:.1f}" for name, values in out.items())
            )
        return out


def report(out: dict[str, list[float]], argv: list[str], load: tuple[str, str], took: float) -> str:
    med = {name: statistics.median(values) for name, values in out.items()}
    request = med["request"]
    budget = (1 / GOAL - 1) * request
    pair = med["request, shadowed"] - request
    floor = med["socket floor"] + med["judge"]
    lines = [
        "# What a shadowed pair costs the proxy at least (bench/shadowfloor.py)",
        "",
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs, Python "
        f"{sys.version.split()[0]}. Command: `python -m bench.shadowfloor {' '.join(argv)}`; load "
        f"average at start {load[0]}, at the end {load[1]}, {took:.0f} s.",
        "",
        f"CPU µs of the process per operation at concurrency {CONCURRENCY}, median (min–max) "
        "over rounds, the arms interleaved in each round (see the script's docstring):",
        "",
        markdown_table(
            ["operation", "CPU µs"], [[n, spread(v, "{:.1f}".format)] for n, v in out.items()]
        ),
        "",
        f"- A pair costs today {pair:.1f} µs ({pair / request:.2f} of a request): shadowing every "
        f"request leaves {request / (request + pair):.0%} of the throughput on one core.",
        f"- The goal ({GOAL:.0%}) leaves a pair {budget:.1f} µs (0.25 of a request).",
        f"- The socket floor and the judge alone take {floor:.1f} µs "
        f"({med['socket floor']:.1f} + {med['judge']:.1f}): at best "
        f"{request / (request + floor):.0%}, with nothing spent on the turn's side, the "
        "pool, the counts, the metrics or the log.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds of every arm [8]")
    parser.add_argument("--requests", type=int, default=1000, help="operations per arm and round")
    parser.add_argument("--no-write", action="store_true", help=f"do not write {OUT.name}")
    args = parser.parse_args(argv)
    port = free_port()
    # As bench.overhead places them: the upstream on CPU 0, this process on CPU 1.
    two = (os.cpu_count() or 1) >= 2
    upstream = subprocess.Popen(
        [sys.executable, "-m", "bench.fake_upstream", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=(lambda: os.sched_setaffinity(0, {0})) if two else None,
    )
    if two:
        os.sched_setaffinity(0, {1})
    try:
        wait_port(port)
        load_start, started = load_average(), time.monotonic()
        out = uvloop.run(measure(port, args.rounds, args.requests))
        took = time.monotonic() - started
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)
    text = report(out, sys.argv[1:] if argv is None else argv, (load_start, load_average()), took)
    print(text)
    if not args.no_write:
        OUT.parent.mkdir(exist_ok=True)
        OUT.write_text(text)
        print(f"wrote {OUT.relative_to(Path.cwd()) if OUT.is_relative_to(Path.cwd()) else OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
