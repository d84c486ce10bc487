"""Per-request costs on the proxy's hot path, in-process, each beside what it replaced.

End-to-end figures (bench.overhead) cannot resolve a few microseconds on a shared machine;
these can: CPU time (`time.process_time_ns`) per call, the minimum and median over repeats.
The last figure is a whole chat request through the proxy's ASGI app, from the scope to the last
body message, with the upstream stubbed in-process (no sockets, no HTTP server): everything the
proxy's own code costs per request.

    python -m bench.hotpath [--repeat 15] [--only-app | --only-leaks | --stores
                            [--concurrency N] [--redis-before COMMIT]]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI

from bench.bodies import named_body, request_body
from bench.drivers import AsgiDriver
from bench.fake_upstream import completion
from bench.processes import ROOT
from bench.redisserver import RedisServer, RedisStats, redis_server
from proxy.config import Settings
from proxy.guard import toolcheck
from proxy.guard.leakformats import FAMILIES, FORMATS
from proxy.guard.leaks import find_leaked_calls, find_leaked_calls_in_reasoning
from proxy.http.jsonbody import BodyParser
from proxy.logs import configure_logging, get_logger, log_request
from proxy.upstream_response import UpstreamResponse

CHAT_ANSWER = orjson.dumps(completion())


class StubUpstream:
    """An upstream that answers every request with the benchmark's canned completion, in-process."""

    name = "stub"

    async def request(
        self, method: str, path: str, *, body: bytes | None, headers: Any
    ) -> UpstreamResponse:
        return UpstreamResponse(200, {"content-type": "application/json"}, CHAT_ANSWER, 0.0)

    def stream(self, path: str, *, body: bytes, headers: Any) -> Any:
        raise NotImplementedError

    async def close(self) -> None:
        return None


def app_request_us(raw: bytes, loops: int, repeat: int) -> tuple[float, float]:
    """CPU µs per chat request through create_app's ASGI app (stubbed upstream, memory store)."""
    import uvloop

    driver = AsgiDriver(stubbed_app(), raw)

    async def run() -> tuple[float, float]:
        await driver.request()
        samples = []
        for _ in range(repeat):
            start = time.process_time_ns()
            for _ in range(loops):
                await driver.request()
            samples.append((time.process_time_ns() - start) / loops / 1000)
        return min(samples), statistics.median(samples)

    result = uvloop.run(run())
    driver.check()
    return result


def stubbed_app(store: str = "memory", *, session_store: Any = None) -> Any:
    """create_app's ASGI app over the in-process stub upstream, with the session store `store`
    (or the store object `session_store`)."""
    from proxy.app import create_app

    return create_app(
        Settings(upstreams=[{"name": "stub", "base_url": "http://stub/v1"}], store=store),
        store=session_store,
        upstreams=[StubUpstream()],  # type: ignore[list-item]
    )


def awaiting_memory_store() -> Any:
    """The memory store, each write first waiting one turn of the event loop: the least any
    store that answers over a socket costs a request here (its task suspended and resumed, the
    other requests in flight run meanwhile), without the socket, the encoding or the parsing."""
    from proxy.session.stores import MemoryStore

    class AwaitingMemoryStore(MemoryStore):
        async def record(self, session: str, **counts: Any) -> Any:
            await asyncio.sleep(0)
            return await super().record(session, **counts)

        async def apply(self, session: str, update: Any, *, now: float) -> Any:
            await asyncio.sleep(0)
            return await super().apply(session, update, now=now)

    return AwaitingMemoryStore()


def with_tool_error(raw: bytes) -> bytes:
    """The chat body with its tool result reporting an error (τ²-bench's `Error…` form), so the
    request claims a tool error from its store before its turn (counted once: same call id)."""
    body = orjson.loads(raw)
    for message in body["messages"]:
        if message["role"] == "tool":
            message["content"] = "Error: no user with that email"
    return orjson.dumps(body)


def redis_store_at(commit: str, url: str) -> Any:
    """A RedisStore on `url` made by `commit`'s proxy/session/redis_store.py and
    redis_connections.py, the rest of proxy/ as it is here: the Redis code before and after a
    change, side by side in one process (a shared machine's load moves two processes' figures
    apart more than a change to the store does)."""
    import subprocess
    import sys
    import types

    def module(name: str, path: str, replace: tuple[str, str] | None = None) -> Any:
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{commit}:{path}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        if replace is not None:
            assert replace[0] in source, f"{path} of {commit} does not import {replace[0]!r}"
            source = source.replace(*replace)
        made = sys.modules[name] = types.ModuleType(name)
        exec(compile(source, f"{commit}:{path}", "exec"), made.__dict__)
        return made

    connections = f"redis_connections_{commit}"
    module(connections, "proxy/session/redis_connections.py")
    store = module(
        f"redis_store_{commit}",
        "proxy/session/redis_store.py",
        ("from proxy.session.redis_connections import", f"from {connections} import"),
    )
    return store.RedisStore(url)


async def side_by_side(
    server: RedisServer,
    drivers: dict[str, AsgiDriver],
    loops: int,
    repeat: int,
    concurrency: int = 1,
) -> tuple[dict[str, list[float]], dict[str, list[RedisStats]], dict[str, float]]:
    """CPU µs per request of each driver over `repeat` interleaved rounds of `loops` requests
    (`concurrency` at a time), what Redis did in each round of each driver named `redis…`, and
    the commands each of those sent it per request."""

    async def one_by_one(driver: AsgiDriver, n: int) -> None:
        for _ in range(n):
            await driver.request()

    async def requests(driver: AsgiDriver, n: int) -> None:
        shares = [n // concurrency + (i < n % concurrency) for i in range(concurrency)]
        await asyncio.gather(*(one_by_one(driver, share) for share in shares))

    for driver in drivers.values():
        await requests(driver, 20)  # warm: caches filled, the connection made
    on_redis = [name for name in drivers if name.startswith("redis")]
    sent: dict[str, float] = {}
    for name in on_redis:
        with server.monitored() as monitored:
            await requests(drivers[name], 50)
        sent[name] = monitored[0] / 50
    samples: dict[str, list[float]] = {name: [] for name in drivers}
    redis_spent: dict[str, list[RedisStats]] = {name: [] for name in on_redis}
    order = list(drivers.items())
    for round_ in range(repeat):
        # Every other round the other way round: no driver always runs after the same one.
        for name, driver in order if round_ % 2 == 0 else order[::-1]:
            before = server.stats()
            start = time.process_time_ns()
            await requests(driver, loops)
            samples[name].append((time.process_time_ns() - start) / loops / 1000)
            if name in redis_spent:
                redis_spent[name].append(server.stats() - before)
    for driver in drivers.values():
        await driver.app.state.store.close()  # type: ignore[attr-defined]
    return samples, redis_spent, sent


def store_rows(
    raw: bytes, loops: int, repeat: int, concurrency: int = 1, redis_before: str | None = None
) -> None:
    """The chat request through the ASGI app on the memory store and on a real `redis-server`
    side by side (their rounds interleaved, so the machine's load falls on both alike), plain
    and with a tool error in its history, and between them the memory store awaiting once per
    write (`awaiting_memory_store`: the floor of any remote store in this harness), and with
    `redis_before` the Redis store of that commit (`redis_store_at`); per request: the proxy's
    CPU µs, the ratio to memory, the commands the proxy sent (MONITOR), the commands Redis ran
    (scripts' included) and Redis's CPU µs. The body names its session, so each store does its
    per-request work (the gate, the counts) without a conversation lookup (and a commit's store
    from before that lookup serves it too)."""
    import uvloop

    raw = named_body(raw, "bench-hotpath")

    with redis_server() as server:
        print(
            f"{f'per chat request, {concurrency} at a time':<40} {'min µs':>8} {'median µs':>10} {'× memory':>9} "
            f"{'sent':>5} {'run':>6} {'redis µs':>9}"
        )
        for label, body in (("plain", raw), ("tool error", with_tool_error(raw))):
            drivers = {
                "memory": AsgiDriver(stubbed_app(), body),
                "memory, one await": AsgiDriver(
                    stubbed_app(session_store=awaiting_memory_store()), body
                ),
            }
            if redis_before is not None:
                before = redis_store_at(redis_before, server.url)
                drivers[f"redis {redis_before}"] = AsgiDriver(
                    stubbed_app(session_store=before), body
                )
            drivers["redis"] = AsgiDriver(stubbed_app(server.url), body)

            samples, redis_spent, sent = uvloop.run(
                side_by_side(server, drivers, loops, repeat, concurrency)
            )
            base = statistics.median(samples["memory"])
            for name, driver in drivers.items():
                driver.check()
                low, mid = min(samples[name]), statistics.median(samples[name])
                extra = ""
                if name in redis_spent:
                    spent = redis_spent[name]
                    run = statistics.median(s.commands for s in spent) / loops
                    cpu = statistics.median(s.cpu_seconds for s in spent) / loops * 1e6
                    extra = f"{sent[name]:>5.1f} {run:>6.1f} {cpu:>9.1f}"
                print(
                    f"{label + ', ' + name:<40} {low:>8.1f} {mid:>10.1f} {mid / base:>9.2f} {extra}"
                )


def print_rows(rows: list[tuple[str, tuple[float, float]]]) -> None:
    print(f"{'per call, CPU time':<66} {'min µs':>9} {'median µs':>10}")
    for label, (low, mid) in rows:
        print(f"{label:<66} {low:>9.2f} {mid:>10.2f}")


def leak_free_answer(*, mentions: bool = False) -> str:
    """A 4 kB support answer without a tool call; `mentions`: it also names call markers and
    words of their families in prose (function, invoke, <tool_call>, to=…), so finders run."""
    sentence = (
        "Your order #W1234567 was placed on March 3 and shipped two days later; the tracking "
        "number is 1Z999AA10123456784 and the parcel should arrive by Friday. "
    )
    if mentions:
        sentence += (
            "The function you asked about is not something I invoke; a <tool_call> tag or "
            "to=functions.x is how a model would write one. "
        )
    return (sentence * (4096 // len(sentence) + 1))[:4096]


def per_call_us(fn: Callable[[], Any], loops: int, repeat: int) -> tuple[float, float]:
    fn()
    samples = []
    for _ in range(repeat):
        start = time.process_time_ns()
        for _ in range(loops):
            fn()
        samples.append((time.process_time_ns() - start) / loops / 1000)
    return min(samples), statistics.median(samples)


def full_collection_ms(repeat: int) -> tuple[float, float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter_ns()
        gc.collect()
        samples.append((time.perf_counter_ns() - start) / 1e6)
    return min(samples), statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument(
        "--only-app", action="store_true", help="only the whole request through the ASGI app"
    )
    parser.add_argument("--only-leaks", action="store_true", help="only the leak-scan rows")
    parser.add_argument(
        "--stores",
        action="store_true",
        help="only the chat request on the memory store and on a real redis-server, side by side",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="with --stores: requests in flight at once (each round's requests split among them)",
    )
    parser.add_argument(
        "--redis-before",
        metavar="COMMIT",
        help="with --stores: also the Redis store of COMMIT's proxy/session/redis_*.py, "
        "its rounds interleaved with the others in the same process",
    )
    args = parser.parse_args()
    rep = args.repeat
    raw = request_body()
    devnull = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    configure_logging("info", stream=devnull)
    if args.stores:
        store_rows(raw, 300, rep, args.concurrency, args.redis_before)
        return
    if args.only_app:
        low, mid = app_request_us(raw, 500, rep)
        print(f"chat request through the ASGI app, upstream stubbed: {low:.1f} / {mid:.1f} µs")
        return
    body = orjson.loads(raw)
    tools = body["tools"]
    limits = toolcheck.DEFAULT_LIMITS
    toolcheck.compile_tools(tools)
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_order_details", "arguments": '{"order_id": "#W1234567"}'},
            }
        ],
    }
    index = toolcheck.compile_tools(tools)

    def canonical_key() -> object:
        key = (hashlib.sha256(toolcheck._canonical_json(tools, limits)).digest(), limits)
        return toolcheck._CACHE.get(key)

    log = get_logger()

    def log_event() -> None:
        log.info(
            "chat_completion",
            request_id="0123456789abcdef0123456789abcdef",
            model="bench-model",
            session="fp-0123456789abcdef",
            status=200,
            channels=None,
            errors="0",
            latency_ms=1.234,
        )

    def request_event() -> None:
        log_request(
            {
                "request_id": "0123456789abcdef0123456789abcdef",
                "model": "bench-model",
                "session": "fp-0123456789abcdef",
                "status": 200,
                "channels": None,
                "errors": "0",
                "latency_ms": 1.234,
            }
        )

    bodies = BodyParser()
    bodies.parse(raw)  # the first sight of the tools

    quiet = FastAPI()._native_telemetry
    off = FastAPI(telemetry={"tracing": False, "metrics": False, "logs": False})._native_telemetry  # type: ignore[call-arg]

    answer = leak_free_answer()
    worded = leak_free_answer(mentions=True)

    def five_formats_before() -> object:
        # What the scan did on a text without a marker when it knew five formats.
        c = answer
        return (
            "<tool_call>" in c,
            "<function=" in c,
            "<|python_tag|>" in c,
            "[TOOL_CALLS]" in c,
            c.strip()[:1] in ("{", "[", "`"),
        )

    leak_rows: list[tuple[str, tuple[float, float]]] = [
        (
            f"leak scan, {len(answer):,} B answer, no call: 5 formats' tests (before)",
            per_call_us(five_formats_before, 5000, rep),
        ),
        (
            f"leak scan, same answer: {len(FORMATS)} formats, {len(FAMILIES)} families (now)",
            per_call_us(lambda: find_leaked_calls(answer), 5000, rep),
        ),
        (
            "leak scan, same answer as reasoning (now)",
            per_call_us(lambda: find_leaked_calls_in_reasoning(answer), 5000, rep),
        ),
        (
            f"leak scan, {len(worded):,} B answer naming markers in prose (now)",
            per_call_us(lambda: find_leaked_calls(worded), 2000, rep),
        ),
    ]
    if args.only_leaks:
        print_rows(leak_rows)
        return
    rows: list[tuple[str, tuple[float, float]]] = [
        *leak_rows,
        (
            "tools cache key: canonical JSON + sha256 (before)",
            per_call_us(canonical_key, 2000, rep),
        ),
        (
            "compile_tools hit: JSON as sent (skipped when the parse knows them)",
            per_call_us(lambda: toolcheck.compile_tools(tools), 2000, rep),
        ),
        (
            "validate one valid call (warm)",
            per_call_us(lambda: toolcheck.validate(message, tools, index=index), 2000, rep),
        ),
        (
            "request log event through structlog's logger (before)",
            per_call_us(log_event, 2000, rep),
        ),
        ("request log event, log_request: same line (now)", per_call_us(request_event, 2000, rep)),
        ("FastAPI telemetry check per request: default", per_call_us(quiet.enabled, 5000, rep)),
        ("FastAPI telemetry check per request: off (now)", per_call_us(off.enabled, 5000, rep)),
        (
            f"request body parse: orjson.loads of all {len(raw):,} bytes (before)",
            per_call_us(lambda: orjson.loads(raw), 2000, rep),
        ),
        (
            "request body parse, its tools known: ChatBodyParser (now)",
            per_call_us(lambda: bodies.parse(raw), 2000, rep),
        ),
        (
            "orjson.dumps of the request body (no longer on the first attempt)",
            per_call_us(lambda: orjson.dumps(body), 2000, rep),
        ),
    ]
    rows.append(
        (
            "chat request through the ASGI app, upstream stubbed",
            app_request_us(raw, 500, rep),
        )
    )
    print_rows(rows)

    from proxy.app import create_app

    create_app(Settings(upstreams=[{"name": "u", "base_url": "http://127.0.0.1:9/v1"}]))
    objects = len(gc.get_objects())
    before = full_collection_ms(5)
    gc.freeze()
    after = full_collection_ms(5)
    print(
        f"full collection with the app's startup heap ({objects:,} objects): "
        f"{before[1]:.2f} ms; after gc.freeze(): {after[1]:.2f} ms (medians of 5)"
    )


if __name__ == "__main__":
    main()
