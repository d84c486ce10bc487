"""What tracing costs the proxy: CPU and wall p50 per chat request with tracing off, on, and on the code before.

Each arm is a fresh process that drives the proxy's ASGI app in-process (`bench.drivers.AsgiDriver`, the
driver bench.hotpath uses too), with the proxy's own upstream client, against
`bench.fake_upstream` in a process of its own; with tracing on, the proxy's OTLP/HTTP exporter
sends to a receiver in a third process that decodes nothing. The figures are CPU time of the
proxy's process per request (`time.process_time`, every thread: the exporter's thread is counted
too) and the median wall time of a request at concurrency 1. Arms alternate round by round, so a
noisy neighbour lands on all of them; the table gives medians over rounds with their min–max,
and each arm beside tracing off.

    python -m bench.tracing [--rounds 5] [--requests 1500] [--baseline REV] [--baseline-on REV]

`--baseline REV` adds the proxy at commit REV (a temporary git worktree) as an arm: tracing off
beside it says what the hooks cost when nothing is traced. `--baseline-on REV` adds REV's proxy
with tracing on (REV must have tracing): what a change to tracing saved. Both may be repeated.
Results: bench/results/tracing.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.machine import load_average, machine
from bench.processes import free_port, wait_port
from bench.tables import markdown_table

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

    from bench.bodies import request_body
    from bench.drivers import AsgiDriver
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
    driver = AsgiDriver(app, request_body())

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


def tracer_work_us(requests: int = 2000, repeat: int = 7) -> tuple[float, float]:
    """The tracer's own CPU µs per traced chat request, in this process (min over repeats): on
    the calling thread (what the event loop pays), and in all with the batch's encoding. The
    calls are the ones a valid chat request makes (a server span, one try, no violation); the
    batch goes to a sender that keeps nothing, so no HTTP is in it."""
    from proxy import tracing
    from proxy.tracing import Tracing, TracingConfig

    config = TracingConfig(schedule_delay_ms=3_600_000, max_queue_size=4 * requests)
    tracer = Tracing(config, send=lambda payload: True)
    headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    answer = {"model": "bench-model", "usage": {"prompt_tokens": 880, "completion_tokens": 40}}
    figures = {
        tracing.STREAM: False,
        tracing.CONVERSATION: "fp-0123456789abcdef",
        tracing.SESSION_ERRORS: 0,
        tracing.SESSION_MAX_ERRORS: 10,
        tracing.SESSION_EXHAUSTED: False,
        tracing.REPAIRS: 0,
        tracing.VIOLATIONS: None,
    }

    def one() -> None:
        trace = tracer.request(
            api="chat",
            model="",
            method="POST",
            route="/v1/chat/completions",
            headers=headers,
            stream=False,
        )
        trace.name("bench-model")
        sent: dict[str, str] = {}
        trace.upstream_try("bench", "http://127.0.0.1:8001/v1/chat/completions", sent).finish(
            status=200
        )
        trace.answered(answer)
        trace.finish_reason("tool_calls")
        trace.finish(200, figures)

    on_thread, in_all = [], []
    for _ in range(repeat):
        thread, process = time.thread_time(), time.process_time()
        for _ in range(requests):
            one()
        on_thread.append((time.thread_time() - thread) / requests * 1e6)
        tracer.force_flush()
        in_all.append((time.process_time() - process) / requests * 1e6)
    tracer.shutdown()
    return min(on_thread), min(in_all)


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


def busy(*loads: str) -> str:
    """A warning line when the machine was busier than it has CPUs during the run."""
    cpus = os.cpu_count() or 1
    peak = max((float(load.split()[0]) for load in loads if load != "unknown"), default=0.0)
    if peak <= cpus:
        return ""
    return (
        f"- The machine was busy (1-min load up to {peak:.1f} on {cpus} CPUs): the rounds' "
        "spread can exceed the differences between arms. Rerun on a quiet machine; the "
        "tracer's own work below is measured in-process and holds under load.\n"
    )


def _spread(values: list[float], *, signed: bool = False) -> str:
    form = "+.1f" if signed else ".1f"
    low, mid, high = min(values), statistics.median(values), max(values)
    return (
        f"{mid:{form}} ({low:{form}} to {high:{form}})"
        if signed
        else f"{mid:{form}} ({low:{form}}–{high:{form}})"
    )


def summarise(samples: dict[str, list[dict[str, float]]]) -> list[str]:
    """The table: each arm's medians over rounds (min–max), and each beside tracing off as the
    median (min–max) of the rounds' differences: arms of one round ran side by side, so a
    round's difference is little moved by how busy the machine was in that round."""
    off = samples[OFF]
    header = [
        "arm",
        "CPU µs / request, median (min–max)",
        "wall p50 µs at c1, median (min–max)",
        "CPU µs beside tracing off, per round",
        "wall p50 µs beside tracing off, per round",
    ]
    body = []
    for name, rows in samples.items():
        beside = ["", ""]
        if name != OFF:
            cpu = [r["cpu_us"] - o["cpu_us"] for r, o in zip(rows, off, strict=True)]
            wall = [r["wall_p50_us"] - o["wall_p50_us"] for r, o in zip(rows, off, strict=True)]
            beside = [_spread(cpu, signed=True), _spread(wall, signed=True)]
        cells = [_spread([r["cpu_us"] for r in rows]), _spread([r["wall_p50_us"] for r in rows])]
        body.append([name, *cells, *beside])
    return markdown_table(header, body).split("\n")


@dataclass(frozen=True)
class Arm:
    name: str
    tree: Path
    traced: bool


OFF, ON = "tracing off", "tracing on"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=1500, help="per arm and round")
    parser.add_argument(
        "--baseline", action="append", default=[], help="a commit whose proxy runs as an arm"
    )
    parser.add_argument(
        "--baseline-on",
        action="append",
        default=[],
        help="a commit whose proxy runs as an arm with tracing on",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--upstream-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return

    started, load_before = datetime.now(UTC), load_average()
    command = "python -m bench.tracing " + " ".join(sys.argv[1:])
    upstream_port, receiver_port = free_port(), free_port()
    endpoint = f"http://127.0.0.1:{receiver_port}"
    with tempfile.TemporaryDirectory(prefix="toolsentry-baseline-") as tmp:
        trees: dict[str, Path] = {}
        for rev in dict.fromkeys([*args.baseline, *args.baseline_on]):
            trees[rev] = Path(tmp) / rev
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(trees[rev]), rev],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
        arms = [Arm(f"before ({rev[:10]})", trees[rev], False) for rev in args.baseline]
        arms += [Arm(f"before ({rev[:10]}), {ON}", trees[rev], True) for rev in args.baseline_on]
        arms += [Arm(OFF, ROOT, False), Arm(ON, ROOT, True)]
        samples: dict[str, list[dict[str, float]]] = {arm.name: [] for arm in arms}
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
                    for arm in arms:
                        on = endpoint if arm.traced else None
                        figures = run_arm(arm.name, arm.tree, upstream_port, on, args.requests)
                        samples[arm.name].append(figures)
        finally:
            for tree in trees.values():
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(tree)],
                    cwd=ROOT,
                    check=False,
                    capture_output=True,
                )
    on_loop, in_all = tracer_work_us()
    load_after = load_average()
    table = summarise(samples)
    print("\n".join(table))
    print(f"tracer's own work per request: {on_loop:.1f} µs on the loop, {in_all:.1f} µs in all")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        "# Tracing's cost (python -m bench.tracing)\n\n"
        f"- Run: {started:%Y-%m-%d %H:%M} UTC, `{command}`\n"
        f"- Machine: {machine()}; load average (1, 5, 15 min) {load_before} before the run, "
        f"{load_after} after it\n"
        f"- {args.rounds} rounds × {args.requests} chat requests per arm, concurrency 1, arms "
        "alternating in fresh processes: the in-process ASGI app (bench/drivers.py's AsgiDriver) → the proxy's upstream client "
        "→ bench.fake_upstream; tracing on exports every span over OTLP/HTTP to a receiver "
        "in another process. CPU is the proxy process's, every thread (the exporter's too).\n"
        + busy(load_before, load_after)
        + "\n"
        + "\n".join(table)
        + "\n\nThe tracer's own work per traced chat request, in-process and without HTTP "
        f"(`tracer_work_us`, min of 7 × 2000): {on_loop:.1f} µs CPU on the event loop's thread, "
        f"{in_all:.1f} µs with the worker's encoding of its spans.\n",
        encoding="utf-8",
    )
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
