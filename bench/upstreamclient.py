"""What the upstream HTTP client costs the proxy: CPU per request of proxy/upstream_http1.py against aiohttp's.

Both clients run in one process, on one event loop (uvloop), against `bench.fake_upstream` in a
process of its own, each as the proxy configures it: `HttpUpstream` (proxy/upstream.py over
proxy/upstream_pool.py's pool of proxy/upstream_http1.py's connections) and an aiohttp
`ClientSession` set up as the proxy's upstream client was before it (a `TCPConnector` with the same limit, keep-alive and DNS cache, a socket read
timeout, automatic decompression). Each request is the benchmark's chat turn (bench/bodies.py,
7 kB with 17 tools) sent whole, its answer read whole (`plain`) or as a stream of events
(`stream`). Arms alternate round by round so a noisy neighbour lands on both; the figure is CPU
time of the process per request (`time.process_time`), median over rounds with its min–max, and
the ratio of the two of each round.

    python -m bench.upstreamclient [--rounds 7] [--requests 2000]

Results: bench/results/upstreamclient.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import uvloop

from bench.bodies import request_body
from bench.machine import load_average, machine
from bench.processes import free_port, wait_port
from bench.tables import markdown_table, spread
from proxy.config_upstream import UpstreamConfig
from proxy.upstream import HttpUpstream

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "upstreamclient.md"
PATH = "chat/completions"

Send = Callable[[bytes], Awaitable[int]]


def _aiohttp_arm(config: UpstreamConfig, base: str) -> tuple[aiohttp.ClientSession, Send, Send]:
    connector = aiohttp.TCPConnector(
        limit=config.max_connections, keepalive_timeout=config.keepalive_timeout, ttl_dns_cache=300
    )
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=config.connect_timeout, sock_read=config.timeout
    )
    session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=True)
    url = f"{base}/{PATH}"
    headers = {"content-type": "application/json"}

    async def plain(body: bytes) -> int:
        async with session.request("POST", url, data=body, headers=headers) as resp:
            return len(await resp.read())

    async def stream(body: bytes) -> int:
        async with session.request("POST", url, data=body, headers=headers) as resp:
            return sum([len(chunk) async for chunk in resp.content.iter_any()])

    return session, plain, stream


def _http1_arm(config: UpstreamConfig) -> tuple[HttpUpstream, Send, Send]:
    upstream = HttpUpstream(config, api_key=None, retries=0)

    async def plain(body: bytes) -> int:
        return len((await upstream.request("POST", PATH, body=body, headers={})).body)

    async def stream(body: bytes) -> int:
        async with upstream.stream(PATH, body=body, headers={}) as opened:
            return sum([len(chunk) async for chunk in opened.chunks])

    return upstream, plain, stream


async def _cpu_per_request(send: Send, body: bytes, requests: int) -> float:
    for _ in range(50):
        await send(body)
    cpu = time.process_time()
    for _ in range(requests):
        await send(body)
    return (time.process_time() - cpu) / requests * 1e6


async def measure(port: int, rounds: int, requests: int) -> dict[str, dict[str, list[float]]]:
    base = f"http://127.0.0.1:{port}/v1"
    config = UpstreamConfig(name="bench", base_url=base)
    session, aio_plain, aio_stream = _aiohttp_arm(config, base)
    upstream, own_plain, own_stream = _http1_arm(config)
    arms = {
        "aiohttp": {"plain": aio_plain, "stream": aio_stream},
        "http1": {"plain": own_plain, "stream": own_stream},
    }
    bodies = {"plain": request_body(), "stream": request_body(stream=True)}
    samples: dict[str, dict[str, list[float]]] = {
        arm: {kind: [] for kind in bodies} for arm in arms
    }
    try:
        for round_ in range(rounds):
            order = list(arms) if round_ % 2 == 0 else list(reversed(arms))
            for arm in order:
                for kind, body in bodies.items():
                    figure = await _cpu_per_request(arms[arm][kind], body, requests)
                    samples[arm][kind].append(figure)
            print(
                f"  round {round_ + 1}: "
                + "  ".join(
                    f"{arm} {kind} {samples[arm][kind][-1]:.1f} µs"
                    for arm in arms
                    for kind in bodies
                )
            )
    finally:
        await session.close()
        await upstream.close()
    return samples


def _spread(values: list[float], form: str = ".1f") -> str:
    return spread(values, lambda v: f"{v:{form}}")


def report(samples: dict[str, dict[str, list[float]]], command: str, loads: tuple[str, str]) -> str:
    lines = [
        "# The upstream HTTP client's CPU per request (bench/upstreamclient.py)",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {machine()}.",
        f"Command: `{command}`; load average at start {loads[0]}, at the end {loads[1]}.",
        "",
        "CPU µs of the process per request, median (min–max) over rounds; the ratio is aiohttp's",
        "÷ proxy/upstream_http1.py's of the same round.",
        "",
    ]
    body = []
    for kind in samples["http1"]:
        own, theirs = samples["http1"][kind], samples["aiohttp"][kind]
        ratios = [a / b for a, b in zip(theirs, own, strict=True)]
        body.append([kind, _spread(theirs), _spread(own), f"{_spread(ratios, '.2f')}×"])
    header = ["request", "aiohttp", "proxy/upstream_http1.py", "aiohttp ÷ http1"]
    lines.append(markdown_table(header, body))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds, arms alternating [7]")
    parser.add_argument("--requests", type=int, default=2000, help="requests per arm per round")
    parser.add_argument("--no-write", action="store_true", help="do not write the results file")
    args = parser.parse_args()
    if args.rounds < 1 or args.requests < 1:
        parser.error("--rounds and --requests must be at least 1")
    port = free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-m", "bench.fake_upstream", "--port", str(port)], cwd=ROOT
    )
    start_load = load_average()
    try:
        wait_port(port)
        samples = uvloop.run(measure(port, args.rounds, args.requests))
    finally:
        upstream.terminate()
        upstream.wait(timeout=10)
    command = f"python -m bench.upstreamclient --rounds {args.rounds} --requests {args.requests}"
    text = report(samples, command, (start_load, load_average()))
    print(text)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text)
        print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
