"""What does the proxy add to a streamed chat completion? Measures it, proxy against direct.

Three processes on loopback: bench/fake_upstream.py in its paced mode (uvloop + httptools), the
proxy in front of it (`create_app` under the same server options as `toolsentry serve`), and this
client, bench/drivers.py's `StreamTimer`: a raw-socket HTTP/1.1 client on a keep-alive connection
per path that decodes the chunked body itself and timestamps every SSE event as it arrives.
Requests alternate between the two paths so that drift in the machine's load hits both alike.

- time to first token: from the request's first byte sent to the first content delta received;
- added latency per chunk: each upstream chunk carries the upstream's `time.monotonic_ns()` when
  it was written (a top-level field the proxy passes through; the clock is system-wide), so a
  chunk's delivery latency is its arrival minus that stamp, measured while the upstream paces
  its chunks like a model decoding;
- relay cost per chunk: a burst of chunks sent back to back, stream time divided by the count;
- a tool call: content then one tool call held, validated (valid) and re-emitted; total time.

    python -m bench.streaming [--requests 100] [--out bench/results/streaming.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.drivers import StreamTimer, Timed
from bench.fake_upstream import MODEL
from bench.processes import free_port, wait_port
from bench.tables import markdown_table

ROOT = Path(__file__).resolve().parent.parent
PACED_ROUTE = "/paced/v1/chat/completions"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
                "additionalProperties": False,
            },
        },
    }
]


def _serve(app: Any, port: int) -> None:
    import uvicorn

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
    )


def _serve_proxy(port: int, upstream_port: int) -> None:
    """The proxy under uvicorn, as `toolsentry serve` runs it, in front of the paced upstream."""
    from proxy.app import create_app
    from proxy.config import Settings
    from proxy.config_upstream import UpstreamConfig
    from proxy.logs import configure_logging

    configure_logging("warning")
    upstream = UpstreamConfig(name="bench", base_url=f"http://127.0.0.1:{upstream_port}/paced/v1")
    _serve(create_app(Settings(upstreams=[upstream])), port)


# ---------------------------------------------------------------- the measurement


def _request(tokens: int, gap_ms: float, *, tool_call: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Where is order #W1?"}],
        "tools": TOOLS,
        "stream": True,
        "max_tokens": tokens,
        "bench_gap_ms": gap_ms,
    }
    if tool_call:
        body["bench_tool_call"] = True
    return body


@dataclass
class Row:
    what: str
    unit: str
    direct: float
    proxy: float

    @property
    def added(self) -> float:
        return self.proxy - self.direct

    @property
    def ratio(self) -> float:
        return self.proxy / self.direct if self.direct else float("nan")


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _p90(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else float("nan")


async def _alternate(
    direct: StreamTimer, proxy: StreamTimer, body: dict[str, Any], requests: int
) -> tuple[list[Timed], list[Timed]]:
    for client in (direct, proxy):  # warm the connections and the proxy's upstream pool
        for _ in range(3):
            await client.post(body)
    out: tuple[list[Timed], list[Timed]] = ([], [])
    for i in range(requests):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for which in order:
            out[which].append(await (direct, proxy)[which].post(body))
    return out


async def measure(direct_port: int, proxy_port: int, requests: int) -> list[Row]:
    direct = StreamTimer(direct_port, PACED_ROUTE)
    proxy = StreamTimer(proxy_port)
    rows: list[Row] = []
    ms, us = 1e3, 1e6

    def add(
        what: str,
        unit: str,
        scale: float,
        d: list[Timed],
        p: list[Timed],
        f: Callable[[list[Timed]], float],
    ) -> None:
        rows.append(Row(what, unit, f(d) * scale, f(p) * scale))

    try:
        paced = _request(40, 1.0)
        d, p = await _alternate(direct, proxy, paced, requests)
        add("time to first token, median", "ms", ms, d, p, lambda t: _median([x.ttft for x in t]))
        add("time to first token, p90", "ms", ms, d, p, lambda t: _p90([x.ttft for x in t]))

        def lat(t: list[Timed]) -> list[float]:
            return [x for timed in t for x in timed.latencies]

        add("chunk delivery latency, median", "µs", us, d, p, lambda t: _median(lat(t)))
        add("chunk delivery latency, p90", "µs", us, d, p, lambda t: _p90(lat(t)))

        burst_tokens = 400
        d, p = await _alternate(direct, proxy, _request(burst_tokens, 0), max(10, requests // 4))
        add(
            f"relay cost per chunk ({burst_tokens} back to back)",
            "µs",
            us,
            d,
            p,
            lambda t: _median([x.total - x.ttft for x in t]) / burst_tokens,
        )

        plain = _request(5, 0) | {"stream": False}
        d, p = await _alternate(direct, proxy, plain, requests)
        add(
            "non-streamed request, total (reference)",
            "ms",
            ms,
            d,
            p,
            lambda t: _median([x.total for x in t]),
        )
        streamed = _request(5, 0)
        d, p = await _alternate(direct, proxy, streamed, requests)
        add(
            "streamed request (5 chunks), total",
            "ms",
            ms,
            d,
            p,
            lambda t: _median([x.total for x in t]),
        )
        tool = _request(5, 0, tool_call=True)
        d, p = await _alternate(direct, proxy, tool, requests)
        add(
            "content + one valid tool call, total",
            "ms",
            ms,
            d,
            p,
            lambda t: _median([x.total for x in t]),
        )
    finally:
        await direct.close()
        await proxy.close()
    return rows


def render(rows: list[Row], requests: int, seconds: float) -> str:
    lines = [
        "# Streaming: what the proxy adds",
        "",
        f"`python -m bench.streaming --requests {requests}` — {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
        f"{requests} requests per path and scenario, alternating; run took {seconds:.0f} s.",
        "Fake upstream, proxy and client are separate processes on loopback (uvloop + httptools).",
        "",
        markdown_table(
            ["measure", "unit", "direct", "proxy", "added", "proxy / direct"],
            [
                [
                    r.what,
                    r.unit,
                    f"{r.direct:.1f}",
                    f"{r.proxy:.1f}",
                    f"{r.added:+.1f}",
                    f"{r.ratio:.2f}×",
                ]
                for r in rows
            ],
            right=range(2, 6),
        ),
        "",
        "Paced scenario: 40 content chunks 1 ms apart after the role chunk. Chunk delivery",
        "latency: arrival at the client minus the upstream's write stamp of that chunk.",
        "Relay cost: stream time after the first token, over the chunk count, upstream writing",
        "as fast as it can. Non-streamed and streamed requests: five tokens, no pacing. Tool",
        "call: five content chunks, then one tool call the proxy holds, validates against its",
        "schema and re-emits before the finish.",
    ]
    return "\n".join(lines) + "\n"


def _start(argv: list[str], port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-m", *argv], cwd=ROOT, stdin=subprocess.DEVNULL)
    try:
        wait_port(port, timeout=30)
    except RuntimeError:
        process.kill()
        raise RuntimeError(f"bench server {argv} did not start") from None
    return process


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role")
    serve_proxy = sub.add_parser("proxy", help="(internal) serve the proxy")
    serve_proxy.add_argument("--port", type=int, required=True)
    serve_proxy.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "streaming.md")
    args = parser.parse_args(argv)
    if args.role == "proxy":
        _serve_proxy(args.port, args.upstream_port)
        return

    upstream_port, proxy_port = free_port(), free_port()
    started = time.monotonic()
    processes = [_start(["bench.fake_upstream", "--port", str(upstream_port)], upstream_port)]
    try:
        processes.append(
            _start(
                [
                    *("bench.streaming", "proxy", "--port", str(proxy_port)),
                    *("--upstream-port", str(upstream_port)),
                ],
                proxy_port,
            )
        )
        rows = asyncio.run(measure(upstream_port, proxy_port, args.requests))
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=10)
    text = render(rows, args.requests, time.monotonic() - started)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"written to {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
