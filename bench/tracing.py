"""What tracing costs the proxy: CPU and wall p50 per chat request with tracing off, on, and on the code before.

Each arm is a fresh process that drives the proxy's ASGI app in-process (`bench.asgi.Driver`, the
driver bench.hotpath uses too), with the real aiohttp upstream client, against
`bench.fake_upstream` in a process of its own; with tracing on, the proxy's OTLP/HTTP exporter
sends to a receiver in a third process that decodes nothing. The figures are CPU time of the
proxy's process per request (`time.process_time`, every thread: the exporter's thread is counted
too) and the median wall time of a request at concurrency 1. Arms alternate round by round, so a
noisy neighbour lands on all of them; the table gives medians over rounds with their min–max,
and what tracing on adds beside off (and off beside the commit before).

    python -m bench.tracing [--rounds 5] [--requests 1500] [--baseline REV]

`--baseline REV` adds the proxy at commit REV (a temporary git worktree) as an arm: tracing off
against it says what the hooks cost when nothing is traced. Results: bench/results/tracing.md.
"""

from __future__ import annotations

import argparse
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

from bench.overhead import load_average, machine

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
    """In this process: CPU µs per request and the wall p50 through a fresh app (the child's job)."""
    import uvloop

    from bench.asgi import Driver
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
    driver = Driver(app, request_body())

    async def run() -> dict[str, float]:
        walls: list[float] = []
        async with app.router.lifespan_context(app):
            for _ in range(200):  # warm: pool connections, caches, the exporter's thread
                await driver.request()
            cpu = time.process_time()
            for _ in range(requests):
                start = time.perf_counter()
                await driver.request()
                walls.append(time.perf_counter() - start)
            cpu = time.process_time() - cpu
        return {"cpu_us": cpu / requests * 1e6, "wall_p50_us": statistics.median(walls) * 1e6}

    result = uvloop.run(run())
    driver.check()
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
    print(
        f"  {name:<22} {figures['cpu_us']:8.1f} µs CPU  {figures['wall_p50_us']:8.1f} µs wall p50"
    )
    return figures


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def summarise(samples: dict[str, list[dict[str, float]]], before: str | None) -> list[str]:
    """The table: each arm's medians over rounds (min–max), and what each costs beside the
    arm it adds to (on beside off, off beside the commit before)."""
    med = {
        name: {k: statistics.median(r[k] for r in rows) for k in ("cpu_us", "wall_p50_us")}
        for name, rows in samples.items()
    }
    beside = {"tracing on": "tracing off"}
    if before is not None:
        beside["tracing off"] = before
    lines = [
        "| arm | CPU µs / request, median (min–max) | wall p50 µs at c1, median (min–max) "
        "| added CPU | added wall p50 |",
        "|---|---|---|---|---|",
    ]
    for name, rows in samples.items():
        added = ["", ""]
        if name in beside:
            base = med[beside[name]]
            cpu = med[name]["cpu_us"] - base["cpu_us"]
            wall = med[name]["wall_p50_us"] - base["wall_p50_us"]
            added = [f"{cpu:+.1f} µs vs {beside[name]}", f"{wall:+.1f} µs vs {beside[name]}"]
        lines.append(
            f"| {name} | {_spread([r['cpu_us'] for r in rows])} "
            f"| {_spread([r['wall_p50_us'] for r in rows])} | {added[0]} | {added[1]} |"
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

    started, load_before = datetime.now(UTC), load_average()
    command = "python -m bench.tracing " + " ".join(sys.argv[1:])
    before = f"before ({args.baseline[:10]})" if args.baseline else None
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
            assert before is not None
            trees = {before: base, **trees}
            samples = {before: [], **samples}
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
    load_after = load_average()
    table = summarise(samples, before)
    print("\n".join(table))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        "# Tracing's cost (python -m bench.tracing)\n\n"
        f"- Run: {started:%Y-%m-%d %H:%M} UTC, `{command}`\n"
        f"- Machine: {machine()}; load average (1, 5, 15 min) {load_before} before the run, "
        f"{load_after} after it\n"
        f"- {args.rounds} rounds × {args.requests} chat requests per arm, concurrency 1, arms "
        "alternating in fresh processes: the in-process ASGI app (bench/asgi.py) → the real aiohttp "
        "client → bench.fake_upstream; tracing on exports every span over OTLP/HTTP to a receiver "
        "in another process. CPU is the proxy process's, every thread (the exporter's too).\n\n"
        + "\n".join(table)
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
