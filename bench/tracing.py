"""What tracing costs the proxy: CPU per chat request with tracing off, on, and on the code before.

Each arm is a fresh process that drives the proxy's ASGI app in-process, with the real aiohttp
upstream client, against `bench.fake_upstream` in a process of its own; with tracing on, the
real OTLP/HTTP exporter sends to a receiver in a third process that decodes nothing. The figure
is CPU time of the proxy's process per request (`time.process_time`, every thread: the batch
exporter's thread is counted too) and wall time per request at concurrency 1. Arms alternate
round by round, so a noisy neighbour lands on all of them; the table gives medians over rounds
with their min–max, and ratios against tracing off.

    python -m bench.tracing [--rounds 5] [--requests 1500] [--baseline REV]

`--baseline REV` adds the proxy at commit REV (a temporary git worktree) as an arm: tracing off
against it says what the hooks cost when nothing is traced. Results: bench/results/tracing.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "tracing.md"

_RECEIVER = """
import sys, uvicorn
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/x-protobuf")]})
    await send({"type": "http.response.body", "body": b""})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


@contextmanager
def process(*argv: str, port: int, env: dict[str, str] | None = None) -> Iterator[None]:
    proc = subprocess.Popen(argv, env=env, cwd=ROOT)
    try:
        wait_port(port)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def measure(upstream_port: int, endpoint: str | None, requests: int) -> dict[str, float]:
    """In this process: CPU and wall µs per request through a fresh app (the child's job)."""
    import uvloop

    from bench.overhead import request_body
    from proxy.app import create_app
    from proxy.config import Settings

    settings: dict[str, Any] = {
        "upstreams": [{"name": "bench", "base_url": f"http://127.0.0.1:{upstream_port}/v1"}]
    }
    if endpoint is not None:
        settings["otlp_endpoint"] = endpoint
    try:
        app = create_app(Settings(**settings), environ={})
    except Exception as exc:  # the baseline has no otlp_endpoint setting: off is all it has
        raise SystemExit(f"cannot build the app: {exc}") from exc
    raw = request_body()
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
    headers.append((b"content-length", str(len(raw)).encode()))
    statuses: list[int] = []

    async def one() -> None:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions",
            "root_path": "",
            "query_string": b"",
            "headers": headers,
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8000),
            "state": {},
        }
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.sleep(3600)
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        await app(scope, receive, send)

    async def run() -> dict[str, float]:
        async with app.router.lifespan_context(app):
            for _ in range(200):  # warm: pool connections, caches, the exporter's thread
                await one()
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(requests):
                await one()
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        return {"cpu_us": cpu / requests * 1e6, "wall_us": wall / requests * 1e6}

    result = uvloop.run(run())
    if set(statuses) != {200}:
        raise SystemExit(f"the app answered {sorted(set(statuses))}, not 200")
    return result


def child_main(args: argparse.Namespace) -> None:
    endpoint = args.endpoint or None
    print(json.dumps(measure(args.upstream_port, endpoint, args.requests)))


def run_arm(
    name: str, tree: Path, upstream_port: int, endpoint: str | None, requests: int
) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{ROOT}"}
    argv = [sys.executable, str(Path(__file__).resolve()), "--child"]
    argv += ["--upstream-port", str(upstream_port), "--requests", str(requests)]
    if endpoint:
        argv += ["--endpoint", endpoint]
    out = subprocess.run(argv, env=env, cwd=tree, check=True, capture_output=True, text=True)
    figures: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"  {name:<22} {figures['cpu_us']:8.1f} µs CPU  {figures['wall_us']:8.1f} µs wall")
    return figures


def summarise(samples: dict[str, list[dict[str, float]]]) -> list[str]:
    off = samples["tracing off"]
    lines = [
        "| arm | CPU µs / request, median (min–max) | added CPU vs off | wall µs / request, median | ratio to off (CPU) |",
        "|---|---|---|---|---|",
    ]
    off_cpu = statistics.median(s["cpu_us"] for s in off)
    for name, rows in samples.items():
        cpu = [r["cpu_us"] for r in rows]
        wall = [r["wall_us"] for r in rows]
        med = statistics.median(cpu)
        lines.append(
            f"| {name} | {med:.1f} ({min(cpu):.1f}–{max(cpu):.1f}) | {med - off_cpu:+.1f} µs "
            f"| {statistics.median(wall):.1f} | {med / off_cpu:.3f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=1500, help="per arm and round")
    parser.add_argument("--baseline", help="a commit whose proxy runs as one more arm")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--upstream-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return

    upstream_port, receiver_port = free_port(), free_port()
    endpoint = f"http://127.0.0.1:{receiver_port}"
    samples: dict[str, list[dict[str, float]]] = {"tracing off": [], "tracing on": []}
    with tempfile.TemporaryDirectory(prefix="toolsentry-baseline-") as tmp:
        trees = {"tracing off": ROOT, "tracing on": ROOT}
        if args.baseline:
            base = Path(tmp) / "tree"
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(base), args.baseline],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            name = f"before ({args.baseline[:10]})"
            trees = {name: base, **trees}
            samples = {name: [], **samples}
        try:
            with (
                process(
                    sys.executable,
                    "-m",
                    "bench.fake_upstream",
                    "--port",
                    str(upstream_port),
                    port=upstream_port,
                ),
                process(sys.executable, "-c", _RECEIVER, str(receiver_port), port=receiver_port),
            ):
                for round_no in range(1, args.rounds + 1):
                    print(f"round {round_no}/{args.rounds}")
                    for name, tree in trees.items():
                        on = endpoint if name == "tracing on" else None
                        samples[name].append(run_arm(name, tree, upstream_port, on, args.requests))
        finally:
            if args.baseline:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(Path(tmp) / "tree")],
                    cwd=ROOT,
                    check=False,
                    capture_output=True,
                )
    table = summarise(samples)
    print("\n".join(table))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        "# Tracing's cost (python -m bench.tracing)\n\n"
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs (shared), "
        f"{args.rounds} rounds × {args.requests} chat requests per arm, concurrency 1, "
        "in-process ASGI app → real aiohttp client → bench.fake_upstream; tracing on exports "
        "every span over OTLP/HTTP to a receiver in another process.\n\n" + "\n".join(table) + "\n",
        encoding="utf-8",
    )
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
