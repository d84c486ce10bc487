"""One bench.scale run: each point's closed loop (wrk) with every role's CPU, Redis's commands
and the sessions' count check, and the open loop (bench/openloop.py) at fixed rates."""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from bench.bodies import named_body, request_body
from bench.drivers import run_wrk
from bench.overhead.targets import LITELLM_VENV
from bench.processes import ROOT, Server, pinned
from bench.scale.roles import Point, Redis, Roles, cpus, points_of, serving, upstream
from bench.tables import console


@dataclass
class Outcome:
    """What one point measured: a dict per round, the round trips, notes."""

    point: Point
    rounds: list[dict[str, Any]] = field(default_factory=list)
    sent_per_request: float | None = None  # Redis commands the proxy sent (MONITOR)
    note: str = ""
    open_loop: list[dict[str, Any]] = field(default_factory=list)

    def values(self, key: str) -> list[float]:
        return [r[key] for r in self.rounds if isinstance(r.get(key), int | float)]

    def median(self, key: str) -> float | None:
        values = self.values(key)
        return statistics.median(values) if values else None

    @property
    def counts_exact(self) -> bool | None:
        checks = [r["count_ok"] for r in self.rounds if "count_ok" in r]
        return all(checks) if checks else None


# -- the count check --------------------------------------------------------------------------


def session_of(server: Server, body: bytes) -> str:
    """The session every request of the benchmark falls in (the proxy's answer names it)."""
    request = urllib.request.Request(
        server.url, data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(response.headers["x-toolsentry-session"])


def counts(server: Server, session: str) -> tuple[int, int, int]:
    """(the session's requests, the proxy's `toolsentry_requests_total` answered 200, and over
    every status: a request whose client left counts as 499)."""
    with urllib.request.urlopen(server.url_for(f"/v1/sessions/{session}"), timeout=30) as r:
        requests = int(json.loads(r.read())["requests"])
    with urllib.request.urlopen(server.url_for("/metrics"), timeout=30) as r:
        text = r.read().decode()
    ok = every = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == "toolsentry_requests":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    every += sample.value
                    ok += sample.value if sample.labels.get("status") == "200" else 0
    return requests, int(ok), int(every)


Counts = tuple[int, int, int]


def settled_counts(server: Server, session: str, timeout: float = 10) -> Counts:
    """`counts` once the requests still in the proxy have ended (two reads alike)."""
    deadline = time.monotonic() + timeout
    last = counts(server, session)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = counts(server, session)
        if now == last:
            return now
        last = now
    return last


def count_check(before: Counts, after: Counts, answered: int, cut: int) -> tuple[bool, str]:
    """Whether the session counted every request the proxy answered 200 and none it did not
    see: between the 200s and every request of the metric, and between the `answered` the
    load generator saw and those plus the `cut` it left in flight. A request whose client
    left (499) is in its session when it had reached the session's record, else not."""
    session, ok, every = (a - b for a, b in zip(after, before, strict=True))
    exact = ok <= session <= every and answered <= session <= answered + cut
    detail = f"session +{session}, metric 200 +{ok}, all +{every}; answered {answered}, cut ≤ {cut}"
    return exact, detail


# -- one point ------------------------------------------------------------------------------------


@dataclass
class Meters:
    """CPU seconds so far of every role, and Redis's commands."""

    proxy: float
    upstream: float
    load: float
    redis: float
    commands: int

    @classmethod
    def read(cls, proxy: Server | None, up: Server, redis: Redis | None) -> Meters:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return cls(
            (proxy.cpu_seconds() or 0.0) if proxy else 0.0,
            up.cpu_seconds() or 0.0,
            children.ru_utime + children.ru_stime,  # wrk and the open-loop generator, waited for
            (redis.server.cpu_seconds() or 0.0) if redis else 0.0,
            redis.commands() if redis else 0,
        )

    def since(self, before: Meters, seconds: float, requests: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for role in ("proxy", "upstream", "load", "redis"):
            used = getattr(self, role) - getattr(before, role)
            out[f"{role}_cores"] = used / seconds
            out[f"{role}_us"] = used / max(1, requests) * 1e6
        out["commands"] = (self.commands - before.commands) / max(1, requests)
        return out


def closed_loop(
    point: Point,
    proxy: Server | None,
    up: Server,
    redis: Redis | None,
    args: argparse.Namespace,
    roles: Roles,
    body_file: Path,
) -> Outcome:
    """`args.rounds` wrk rounds on `point` (the upstream itself when `proxy` is None)."""
    outcome = Outcome(point)
    target = proxy or up
    load = cpus(roles.load)
    threads = len(roles.load)
    run_wrk(target.url, body_file, args.connections, args.warmup, load, threads)
    session = (
        session_of(proxy, body_file.read_bytes())
        if point.target == "toolsentry" and proxy
        else None
    )
    uses_redis = redis if point.store == "redis" else None
    for _ in range(args.rounds):
        before_counts = settled_counts(proxy, session) if proxy and session else None
        before = Meters.read(proxy, up, uses_redis)
        summary = run_wrk(target.url, body_file, args.connections, args.duration, load, threads)
        after = Meters.read(proxy, up, uses_redis)
        measured: dict[str, Any] = dict(summary)
        requests = int(summary["requests"])
        measured |= after.since(before, summary["duration_us"] / 1e6, requests)
        if proxy and session and before_counts:
            ok, detail = count_check(
                before_counts, settled_counts(proxy, session), requests, args.connections
            )
            measured |= {"count_ok": ok, "count_detail": detail}
        outcome.rounds.append(measured)
        console.print(f"  {point.label:24} {describe(measured)}")
    if uses_redis and proxy:
        outcome.sent_per_request = uses_redis.sent_per_request(
            proxy, body_file.read_bytes(), args.monitor_requests
        )
    return outcome


def describe(measured: dict[str, Any]) -> str:
    text = (
        f"{measured['rps']:9,.0f} req/s  p50 {measured['p50_us'] / 1000:7.2f} ms  "
        f"p99 {measured['p99_us'] / 1000:8.2f} ms  proxy {measured['proxy_us']:5.0f} µs/req"
    )
    if measured["errors"]:
        text += f"  {measured['errors']:.0f} errors"
    if "count_ok" in measured:
        text += "  counts " + (
            "exact" if measured["count_ok"] else f"WRONG ({measured['count_detail']})"
        )
    return text


def open_loop(
    rate: float,
    server: Server,
    proxy: Server | None,
    up: Server,
    args: argparse.Namespace,
    roles: Roles,
    body_file: Path,
) -> dict[str, Any]:
    """One open-loop run at `rate` against `server` (`proxy`, or the upstream when None)."""
    session = session_of(proxy, body_file.read_bytes()) if proxy else None
    before_counts = settled_counts(proxy, session) if proxy and session else None
    before = Meters.read(proxy, up, None)
    started = time.monotonic()
    argv = [sys.executable, "-m", "bench.openloop", "--url", server.url, "--body", str(body_file)]
    argv += ["--rate", str(rate), "--seconds", str(args.duration), "--warmup", str(args.warmup)]
    argv += ["--connections", str(args.connections), "--processes", str(len(roles.load))]
    done = subprocess.run(
        pinned(cpus(roles.load), argv),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=args.warmup + args.duration + 120,
        check=False,
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"bench.openloop failed: {done.stderr[-500:]}")
    result: dict[str, Any] = orjson.loads(done.stdout.strip().splitlines()[-1])
    after = Meters.read(proxy, up, None)
    answered = result["answered"] + result["warmup_answered"]
    result |= after.since(before, time.monotonic() - started, answered)
    if proxy and session and before_counts:
        ok, detail = count_check(
            before_counts, settled_counts(proxy, session), answered, result["unanswered"]
        )
        result |= {"count_ok": ok, "count_detail": detail}
    return result


# -- a run ----------------------------------------------------------------------------------------


def open_loop_targets(points: Sequence[Point]) -> set[Point]:
    """The Redis points measured at fixed rates: the largest worker count, and 4 workers."""
    redis = [p for p in points if p.target == "toolsentry" and p.store == "redis"]
    if not redis:
        return set()
    most = max(p.workers for p in redis)
    return {p for p in redis if p.workers in (most, 4)}


def rates_for(outcome: Outcome, args: argparse.Namespace) -> list[float]:
    """`--rates`, or (auto) fractions of the point's closed-loop rate, and 10,000/s at 4 workers."""
    if args.rates != "auto":
        return [float(r) for r in args.rates.split(",") if r.strip()]
    closed = outcome.median("rps") or 100.0
    fractions = (0.5,) if args.quick else (0.25, 0.5, 0.8)
    rates = [float(f"{closed * f:.2g}") for f in fractions]
    if outcome.point.workers == 4 and not args.quick:
        rates.append(10_000.0)
    return rates


def measure_point(
    point: Point,
    up: Server,
    redis: Redis | None,
    args: argparse.Namespace,
    roles: Roles,
    workdir: Path,
    open_targets: set[Point],
) -> Outcome:
    """The closed loop of one point, and its open loop when it is one of `open_targets`."""
    body_file = workdir / "chat.json"
    if point.target == "direct":
        return closed_loop(point, None, up, None, args, roles, body_file)
    try:
        base = up.url_for("/v1")
        with serving(point, roles, workdir, base, redis, body_file.read_bytes()) as proxy:
            outcome = closed_loop(point, proxy, up, redis, args, roles, body_file)
            if point in open_targets:
                for rate in rates_for(outcome, args):
                    direct = open_loop(rate, up, None, up, args, roles, body_file)
                    target = open_loop(rate, proxy, proxy, up, args, roles, body_file)
                    outcome.open_loop.append({"rate": rate, "direct": direct, "target": target})
                    console.print(f"  {point.label:24} open loop {describe_open(direct, target)}")
    except RuntimeError as exc:
        console.print(f"  {point.label:24} [red]skipped[/]: {exc}")
        return Outcome(point, note=f"skipped: {str(exc)[:300]}")
    return outcome


def describe_open(direct: dict[str, Any], target: dict[str, Any]) -> str:
    return (
        f"{target['rate']:,.0f}/s: achieved {target['achieved']:,.0f}, "
        f"p50 {target['p50_us'] / 1000:.2f} ms (direct {direct['p50_us'] / 1000:.2f}), "
        f"p99 {target['p99_us'] / 1000:.2f} ms (direct {direct['p99_us'] / 1000:.2f})"
    )


def measure(args: argparse.Namespace, roles: Roles, workdir: Path) -> list[Outcome]:
    """Every point of the run, in order."""
    litellm = (LITELLM_VENV / "bin" / "litellm").exists() and not args.quick
    points = points_of(roles, args.stores, litellm, args.quick)
    body = named_body(request_body(), "bench-scale")
    (workdir / "chat.json").write_bytes(body)
    redis = Redis(roles, workdir) if "redis" in args.stores else None
    outcomes = []
    try:
        with upstream(roles, workdir, body) as up:
            for point in points:
                outcome = measure_point(
                    point, up, redis, args, roles, workdir, open_loop_targets(points)
                )
                outcomes.append(outcome)
    finally:
        if redis is not None:
            redis.server.stop()
    if not litellm:
        where = str(LITELLM_VENV).replace(str(Path.home()), "~")
        why = "--quick" if args.quick else f"LiteLLM is not installed in {where}"
        note = f"not measured: {why} (python -m bench.overhead installs it)"
        outcomes.append(Outcome(Point("litellm"), note=note))
    return outcomes
