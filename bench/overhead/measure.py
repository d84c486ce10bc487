"""One run of bench.overhead: every round's concurrency-1 latencies, the interleaved latency
pairs, the side-by-side throughput of shadowing, and each target's load and time to first token."""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.bodies import WORKLOADS, Workload
from bench.drivers import HIGH_CONCURRENCY, KeepAlive, run_ttft, run_wrk, side_by_side
from bench.machine import load_average
from bench.overhead.targets import BASELINE, SHADOW, TARGETS, servers, targets_of
from bench.processes import ROOT, Placement, Server, baseline_checkout, free_port, pinned
from bench.tables import console

BENCH = ROOT / "bench"
TTFT_REQUESTS = 300
INTERLEAVED_REQUESTS = 1000


@dataclass
class Sample:
    """One round of one target."""

    c1: dict[str, float]
    c64: dict[str, float]
    ttft: dict[str, Any]
    interleaved: dict[str, float] = field(default_factory=dict)  # `p50_us`, see measure_interleaved
    side: dict[str, float] = field(default_factory=dict)  # `rps`, see measure_side_by_side


@dataclass
class Outcome:
    """Everything measured for one target, or why it was skipped."""

    name: str
    note: str = ""
    samples: list[Sample] = field(default_factory=list)
    ttft_note: str = ""

    def median(self, part: str, key: str) -> float | None:
        values = [getattr(s, part).get(key) for s in self.samples]
        present = [v for v in values if isinstance(v, int | float)]
        return statistics.median(present) if present else None


Results = dict[str, dict[str, Outcome]]
"""Outcomes by workload, then by target."""


def measure(args: argparse.Namespace) -> tuple[Results, dict[str, Any]]:
    wanted = [t for t in (args.only or TARGETS) if not (t == "litellm" and args.skip_litellm)]
    if args.baseline is not None:
        wanted.insert(wanted.index("toolsentry") + 1 if "toolsentry" in wanted else 0, BASELINE)
    if "direct" not in wanted:
        wanted.insert(0, "direct")  # every added figure is against direct
    workloads = [WORKLOADS[name] for name in args.workloads]
    placement = Placement.for_machine()
    info: dict[str, Any] = {"placement": placement.describe(), "notes": {}, "load": load_average()}
    results: Results = {
        w.name: {name: Outcome(name) for name in targets_of(w, wanted)} for w in workloads
    }
    if args.skip_litellm and "litellm" in (args.only or TARGETS):
        info["notes"]["litellm"] = "skipped (--skip-litellm)"
    with tempfile.TemporaryDirectory(prefix="toolsentry-bench-") as tmp:
        workdir = Path(tmp)
        bodies: dict[str, tuple[Path, Path]] = {}
        for w in workloads:
            plain, streamed = workdir / f"{w.name}.json", workdir / f"{w.name}-stream.json"
            plain.write_bytes(w.body())
            streamed.write_bytes(w.body(stream=True))
            bodies[w.name] = plain, streamed
        baseline = baseline_checkout(args.baseline, workdir) if args.baseline else ROOT
        with servers(
            [w for w in wanted if w != "direct"],
            workdir,
            placement,
            free_port(),
            {"toolsentry": args.toolsentry_dir, BASELINE: baseline},
        ) as (running, notes):
            info["notes"].update(notes)
            for outcomes in results.values():
                for name, outcome in outcomes.items():
                    if name not in running:
                        outcome.note = notes.get(name, "skipped")
            if args.profile:
                body_file = bodies[workloads[0].name][0]
                info["notes"].update(profile(running, body_file, args, placement))
            # Streaming: a target that answers stream:true with an error is skipped with its answer.
            for w in workloads:
                for name, outcome in results[w.name].items():
                    if not w.ttft or name not in running:
                        continue
                    server = running[name]
                    server.resume()
                    probe = run_ttft(server.url_for(w.route), bodies[w.name][1], 3, placement.load)
                    server.pause()
                    if "error" in probe:
                        outcome.ttft_note = f"streaming skipped: {probe['error'][:160]}"
            for round_ in range(args.rounds):
                c1 = measure_c1(running, results, workloads, bodies, args, placement, round_)
                paired = measure_interleaved(running, workloads, bodies, args, round_)
                if paired:
                    console.print(
                        f"  round {round_ + 1}/{args.rounds} c1 interleaved, p50 ms: "
                        + ", ".join(
                            f"{w} {name} {values['p50_us'] / 1000:.3f}"
                            for (w, name), values in paired.items()
                        )
                    )
                side = measure_side_by_side(running, bodies, args, placement)
                if side:
                    console.print(
                        f"  round {round_ + 1}/{args.rounds} c64 side by side, req/s: "
                        + ", ".join(f"{name} {values['rps']:.0f}" for name, values in side.items())
                    )
                for w in workloads:
                    order = [name for name in results[w.name] if name in running]
                    shift = round_ % len(order)
                    for name in order[shift:] + order[:shift]:
                        outcome = results[w.name][name]
                        c64, ttft = measure_load(
                            running[name], w, bodies[w.name], outcome, args, placement
                        )
                        sample = Sample(
                            c1[w.name, name],
                            c64,
                            ttft,
                            paired.get((w.name, name), {}),
                            side.get(name, {}) if w.name == SIDE_BY_SIDE_WORKLOAD else {},
                        )
                        outcome.samples.append(sample)
                        console.print(
                            f"  round {round_ + 1}/{args.rounds} {w.name:14} {name:20}"
                            + describe(sample)
                        )
    return results, info


C1_ORDER = ("responses", "chat", "messages", "chat-large", "messages-large")
"""The order of a target's c1 runs in a round (reversed every other round): each workload a
ratio goal compares (Responses and Messages with chat, each large body with the other) is
measured next to the one it is compared with."""


def measure_c1(
    running: dict[str, Server],
    results: Results,
    workloads: Sequence[Workload],
    bodies: dict[str, tuple[Path, Path]],
    args: argparse.Namespace,
    placement: Placement,
    round_: int,
) -> dict[tuple[str, str], dict[str, float]]:
    """One round's concurrency-1 runs, by (workload, target): each target in turn (rotating
    order) runs every workload back to back, so the latency ratios between workloads compare
    runs seconds apart, not a round apart, and a shared machine's drift between them is small."""
    order = sorted(workloads, key=lambda w: C1_ORDER.index(w.name))
    if round_ % 2:
        order.reverse()
    names = [name for name in running if any(name in results[w.name] for w in workloads)]
    shift = round_ % len(names)
    out = {}
    for name in names[shift:] + names[:shift]:
        server = running[name]
        server.resume()
        try:
            for w in order:
                if name not in results[w.name]:
                    continue
                url, body_file = server.url_for(w.route), bodies[w.name][0]
                run_wrk(url, body_file, 8, 2 if round_ == 0 else 1, placement.load)  # warm-up
                out[w.name, name] = run_wrk(url, body_file, 1, args.duration, placement.load)
        finally:
            server.pause()
    return out


RATIO_GOALS = (
    ("responses", "chat", "Responses"),
    ("messages", "chat", "Messages, small body"),
    ("messages-large", "chat-large", "Messages, 75 kB body"),
)
"""The latency ratio goals: (workload, the chat workload it is compared with, label)."""


def measure_interleaved(
    running: dict[str, Server],
    workloads: Sequence[Workload],
    bodies: dict[str, tuple[Path, Path]],
    args: argparse.Namespace,
    round_: int,
) -> dict[tuple[str, str], dict[str, float]]:
    """The c1 latency the ratio goals compare, by (workload, target): toolsentry and direct on
    every workload of a ratio goal, one request to each in turn (the order rotating), so that
    the workloads compared are measured milliseconds apart and what a shared machine's drift
    does to one it does to the other. `p50_us` of `--interleaved-requests` each."""
    names = {w.name for w in workloads}
    chosen = [
        w
        for w in workloads
        if any(w.name in pair[:2] and {pair[0], pair[1]} <= names for pair in RATIO_GOALS)
    ]
    server = running.get("toolsentry")
    if server is None or not chosen or args.interleaved_requests <= 0:
        return {}
    direct = running["direct"]
    server.resume()
    clients: dict[tuple[str, str], KeepAlive] = {}
    try:
        for w in chosen:
            body = bodies[w.name][0].read_bytes()
            for target in (server, direct):
                clients[w.name, target.name] = KeepAlive(target.port, w.route, body)
        keys = list(clients)
        for key in keys * 20:  # warm-up
            clients[key].post()
        latencies: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
        for i in range(args.interleaved_requests):
            shift = (i + round_) % len(keys)
            for key in keys[shift:] + keys[:shift]:
                latencies[key].append(clients[key].post())
    finally:
        for client in clients.values():
            client.close()
        server.pause()
    return {key: {"p50_us": statistics.median(values)} for key, values in latencies.items()}


def measure_load(
    server: Server,
    workload: Workload,
    body_files: tuple[Path, Path],
    outcome: Outcome,
    args: argparse.Namespace,
    placement: Placement,
) -> tuple[dict[str, float], dict[str, Any]]:
    """One round of one target on one workload under load: c64 (with the proxy's CPU), TTFT."""
    url = server.url_for(workload.route)
    body_file, stream_file = body_files
    server.resume()
    try:
        run_wrk(url, body_file, 8, 1, placement.load)  # warm-up
        cpu_before = server.cpu_seconds()
        c64 = run_wrk(url, body_file, HIGH_CONCURRENCY, args.duration, placement.load)
        cpu_after = server.cpu_seconds()
        if cpu_before is not None and cpu_after is not None and c64["requests"]:
            # CPU per request is what contention on a shared machine disturbs least.
            c64["cpu_us"] = (cpu_after - cpu_before) / c64["requests"] * 1e6
        ttft: dict[str, Any] = {}
        if workload.ttft and not outcome.ttft_note:
            ttft = run_ttft(url, stream_file, args.ttft_requests, placement.load)
    finally:
        server.pause()
    return c64, ttft


SIDE_BY_SIDE_WORKLOAD = "chat"


def measure_side_by_side(
    running: dict[str, Server],
    bodies: dict[str, tuple[Path, Path]],
    args: argparse.Namespace,
    placement: Placement,
) -> dict[str, dict[str, float]]:
    """The shadow's throughput goal, measured so that a shared core's drift cancels out:
    `toolsentry` and `toolsentry-shadow` resumed together on the proxy's core, each under a wrk
    of its own at concurrency 64 for `--duration` seconds (`side_by_side`). Both are CPU-bound
    and the scheduler gives each half the core, so the ratio of their requests/s is the inverse
    ratio of their CPU per request, at whatever speed the core ran in those seconds. `rps` by
    target; empty when either target is not running."""
    pair = [running.get("toolsentry"), running.get(SHADOW)]
    if any(server is None for server in pair) or SIDE_BY_SIDE_WORKLOAD not in bodies:
        return {}
    servers = [server for server in pair if server is not None]
    route = WORKLOADS[SIDE_BY_SIDE_WORKLOAD].route
    body_file = bodies[SIDE_BY_SIDE_WORKLOAD][0]
    for server in servers:
        server.resume()
    try:
        rps = side_by_side(servers, route, body_file, args.duration, placement.load)
    finally:
        for server in servers:
            server.pause()
    return {server.name: {"rps": value} for server, value in zip(servers, rps, strict=True)}


def describe(sample: Sample) -> str:
    c1, c64, ttft = sample.c1, sample.c64, sample.ttft
    errors = c1["errors"] + c64["errors"]
    return (
        f"c1 p50 {c1['p50_us'] / 1000:.3f} ms  c64 {c64['rps']:,.0f} req/s"
        + (f"  ttft p50 {ttft['p50_us'] / 1000:.3f} ms" if "p50_us" in ttft else "")
        + (f"  ({errors:.0f} errors)" if errors else "")
    )


def profile(
    running: dict[str, Server], body_file: Path, args: argparse.Namespace, placement: Placement
) -> dict[str, str]:
    """Flame graphs of the Python proxies under concurrency-64 load (py-spy), into bench/profiles/."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        return {"profile": "no py-spy: pip install py-spy"}
    notes = {}
    for name in ("toolsentry", "pass-aiohttp"):
        server = running.get(name)
        if server is None or server.process is None:
            continue
        out = BENCH / "profiles" / f"{args.profile_prefix}{name}.svg"
        out.parent.mkdir(exist_ok=True)
        server.resume()
        seconds = max(3, round(args.duration))
        recorder = subprocess.Popen(
            pinned(
                placement.load,
                [
                    spy,
                    "record",
                    "-o",
                    str(out),
                    "--pid",
                    str(server.process.pid),
                    "--duration",
                    str(seconds),
                    "--rate",
                    "250",
                    "--nonblocking",
                ],
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(0.5)
        run_wrk(server.url, body_file, HIGH_CONCURRENCY, seconds, placement.load)
        _, err = recorder.communicate(timeout=60)
        server.pause()
        notes[f"profile {name}"] = (
            str(out.relative_to(ROOT)) if out.exists() else f"py-spy failed: {err[-200:]!r}"
        )
    return notes
