"""How toolsentry scales across cores: throughput, CPU per request of every role, Redis commands
per request and the sessions' counts, at 1, 2, 4, … workers on the memory, SQLite and Redis
stores, beside the fake upstream alone (`direct`), the aiohttp pass-through and LiteLLM; then
latency at fixed request rates (open loop) against direct at the same rate.

Placement (`taskset`), on the CPUs this process may use: with 8 or more, a quarter for the fake
upstream (one process per CPU on one port, SO_REUSEPORT), an eighth for the load generator, one
for `redis-server`, the rest for the proxy, whose workers go 1, 2, 4, … up to them. With fewer
there is not enough to go round: upstream, load generator and Redis share the first CPU, one
worker has the second to itself, and the largest count takes every CPU (on 2 CPUs: workers 1
and 2, the second sharing a CPU with the rest, which the results file says).

Closed loop, every point: a warm-up, then `--rounds` rounds of `--duration` s of wrk at
`--connections` (256) posting the 7.2 kB chat body of bench/bodies.py; medians over rounds with
min–max. CPU per role from `/proc/<pid>/stat` of each process group (the proxy's workers, the
upstream's processes, redis-server) and wrk's own rusage, before and after each round. Redis
commands per request from `INFO commandstats` (the commands the store's Lua scripts run
included); the commands the proxy itself sends (round trips) from `MONITOR` over
`--monitor-requests` requests one at a time after the rounds. Count check (toolsentry): every
request of the run falls in one session (they share their first messages), so after each round
the session's request count (`GET /v1/sessions/{id}`) must have grown exactly as the proxy's
`toolsentry_requests_total` did, by at least wrk's answered requests and at most those plus the
connections still in flight when wrk stopped.

Open loop (bench/openloop.py, timed from each request's scheduled send): toolsentry on Redis at
the largest worker count (and at 4 workers where there are more), at `--rates` requests a
second; `auto` takes a quarter, a half and four fifths of that point's closed-loop rate (and
10,000/s at 4 workers: the issue's anchor). Direct runs at each rate just before, and the added
p50/p99 are the differences. The generator's own check (its dispatch lag and the requests it
handed over per 50 ms window against the rate) is reported beside.

    python -m bench.scale [--duration 3] [--rounds 3] [--connections 256] [--rates auto]
                          [--stores memory,sqlite,redis] [--quick] [--no-write] [--json FILE]

`--quick` is a smoke run (one round of one second, workers 1 and 2 on Redis only beside
memory, one rate); its results are not written to the results file. Needs `wrk` and
`redis-server` (scripts/system-deps).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from bench.bodies import request_body
from bench.drivers import KeepAlive, have_wrk, run_wrk
from bench.machine import load_average, machine
from bench.overhead.targets import LITELLM_VENV, litellm_config
from bench.processes import ROOT, Server, free_port, pinned, start, wait_port, wait_ready
from bench.tables import console, markdown_table, rich_table, spread, write_section

RESULTS = ROOT / "bench" / "results" / "scale.md"
ROUTE = "/v1/chat/completions"

# -- placement ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Roles:
    """The CPUs of each role; `shared` when the machine is too small to give each its own."""

    upstream: tuple[int, ...]
    load: tuple[int, ...]
    redis: tuple[int, ...]
    proxy: tuple[int, ...]
    every: tuple[int, ...]
    shared: bool

    def proxy_cpus(self, workers: int) -> tuple[int, ...]:
        """The CPUs a proxy of `workers` processes is pinned to: one each while the proxy's own
        CPUs last, else every CPU (a small machine's largest count)."""
        return self.proxy[:workers] if workers <= len(self.proxy) else self.every

    def worker_counts(self) -> list[int]:
        """1, 2, 4, … up to the proxy's CPUs; on a small machine also one per CPU."""
        counts = [1 << i for i in range(len(self.proxy).bit_length()) if 1 << i <= len(self.proxy)]
        if self.shared and len(self.every) > counts[-1]:
            counts.append(len(self.every))
        return counts

    def describe(self) -> str:
        text = (
            f"upstream on CPUs {cpus(self.upstream)}, load generator on {cpus(self.load)}, "
            f"redis-server on {cpus(self.redis)}, the proxy on {cpus(self.proxy)}"
        )
        if self.shared:
            text += (
                f" (too few CPUs to give each role its own: the largest worker count runs on "
                f"every CPU, {cpus(self.every)}, beside the other roles)"
            )
        return text


def roles_of(available: Sequence[int]) -> Roles:
    """Place the roles on `available` CPUs (see the module's docstring)."""
    every = tuple(sorted(available))
    n = len(every)
    if n >= 8:
        u, g = n // 4, max(1, n // 8)
        return Roles(
            every[:u], every[u : u + g], every[u + g : u + g + 1], every[u + g + 1 :], every, False
        )
    return Roles(every[:1], every[:1], every[:1], every[1:] or every, every, True)


def cpus(ids: Sequence[int]) -> str:
    return ",".join(str(i) for i in ids)


# -- what is measured -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One row of the closed-loop table."""

    target: str  # direct, pass-aiohttp, toolsentry, litellm
    store: str = ""  # memory, sqlite, redis (toolsentry)
    workers: int = 0  # 0: not a proxy of workers

    @property
    def label(self) -> str:
        parts = [self.target, self.store, f"w{self.workers}" if self.workers else ""]
        return " ".join(p for p in parts if p)


def points_of(roles: Roles, stores: Sequence[str], litellm: bool, quick: bool) -> list[Point]:
    """Every point of a run, in the order measured."""
    counts = roles.worker_counts()
    if quick:
        counts = counts[:2]
    out = [Point("direct"), Point("pass-aiohttp", workers=1)]
    if "memory" in stores:
        out.append(Point("toolsentry", "memory", 1))  # workers > 1 need a shared store
    for store in ("sqlite", "redis"):
        if store in stores:
            out += [Point("toolsentry", store, w) for w in counts]
    if litellm:
        out += [Point("litellm", workers=w) for w in counts]
    return out


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


# -- the roles' processes -------------------------------------------------------------------------


class Redis:
    """A `redis-server` of the run's own, without persistence, on a free loopback port."""

    def __init__(self, roles: Roles, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed (scripts/system-deps)")
        self.port = free_port()
        argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no"]
        self.server = start("redis", pinned(cpus(roles.redis), argv), self.port, "", workdir)
        wait_port(self.port)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self, *words: str) -> bytes:
        """One command over a fresh connection; the raw reply (RESP)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            parts = [f"${len(w.encode())}\r\n{w}\r\n" for w in words]
            sock.sendall(f"*{len(words)}\r\n{''.join(parts)}".encode())
            reply = b""
            while not reply.endswith(b"\r\n") or (reply[:1] == b"$" and reply.count(b"\r\n") < 2):
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                reply += chunk
            return reply

    def commands(self) -> int:
        """Commands run so far (`INFO commandstats`, scripts' own included), INFO not counted."""
        text = self.command("INFO", "commandstats").decode()
        total = 0
        for line in text.splitlines():
            if line.startswith("cmdstat_") and not line.startswith("cmdstat_info:"):
                total += int(line.split("calls=", 1)[1].split(",", 1)[0])
        return total

    def sent_per_request(self, proxy: Server, body: bytes, requests: int) -> float:
        """Commands the proxy itself sends a request (not those its scripts run): `MONITOR`
        while `requests` requests go one at a time."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as monitor:
            monitor.sendall(b"MONITOR\r\n")
            seen = monitor.recv(64)  # +OK
            client = KeepAlive(proxy.port, ROUTE, body)
            try:
                for _ in range(requests):
                    client.post()
            finally:
                client.close()
            time.sleep(0.2)
            monitor.settimeout(0.5)
            with contextlib.suppress(TimeoutError):
                while chunk := monitor.recv(1 << 20):
                    seen += chunk
        lines = seen.decode(errors="replace").splitlines()
        sent = [x for x in lines if x.startswith("+") and " [" in x and " lua]" not in x]
        return len(sent) / requests

    def flush(self) -> None:
        self.command("FLUSHALL")


@contextlib.contextmanager
def upstream(roles: Roles, workdir: Path, body: bytes) -> Iterator[Server]:
    """The canned upstream, one process per upstream CPU on one port."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.fake_upstream", "--port", str(port)]
    argv += ["--processes", str(len(roles.upstream))]
    server = start("upstream", pinned(cpus(roles.upstream), argv), port, ROUTE, workdir)
    try:
        why = wait_ready(server, body, 20)
        if why:
            raise RuntimeError(f"the fake upstream did not start: {why}")
        yield server
    finally:
        server.stop()


def proxy_command(
    point: Point, base: str, port: int, store: str
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that serve `point` in front of `base`."""
    python = sys.executable
    if point.target == "pass-aiohttp":
        argv = [python, "-m", "bench.passthrough", "--client", "aiohttp", "--upstream", base]
        return [*argv, "--port", str(port)], {}
    if point.target == "litellm":
        exe = str(LITELLM_VENV / "bin" / "litellm")
        config = litellm_config(Path(store), base)  # `store` is the workdir here
        argv = [exe, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
        env = {
            "LITELLM_LOG": "ERROR",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
        }
        return [*argv, "--num_workers", str(point.workers)], env
    argv = [python, "-m", "proxy.cli", "serve", "--upstream", base, "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--workers", str(point.workers), "--store", store]
    return argv, {}


@contextlib.contextmanager
def serving(
    point: Point, roles: Roles, workdir: Path, base: str, redis: Redis | None, body: bytes
) -> Iterator[Server]:
    """The proxy of `point`, pinned to its CPUs, answering the body; stopped after."""
    store = {
        "memory": "memory",
        "sqlite": f"sqlite:///{workdir / f'sessions-w{point.workers}.db'}",
        "redis": redis.url if redis else "",
    }.get(point.store, str(workdir))
    if point.store == "redis" and redis is not None:
        redis.flush()
    port = free_port()
    argv, env = proxy_command(point, base, port, store)
    server = start(
        point.label.replace(" ", "-"),
        pinned(cpus(roles.proxy_cpus(point.workers)), argv),
        port,
        ROUTE,
        workdir,
        env,
    )
    try:
        why = wait_ready(server, body, 120 if point.target == "litellm" else 60)
        if why:
            raise RuntimeError(why)
        yield server
    finally:
        server.stop()


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
    body = request_body()
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
        outcomes.append(
            Outcome(
                Point("litellm"),
                note="not measured: "
                + (
                    "--quick"
                    if args.quick
                    else f"LiteLLM is not installed in {LITELLM_VENV} "
                    "(python -m bench.overhead installs it)"
                ),
            )
        )
    return outcomes


# -- the report -----------------------------------------------------------------------------------


def ms(us: float) -> str:
    return f"{us / 1000:,.2f}"


def closed_rows(outcomes: Sequence[Outcome], roles: Roles) -> list[list[str]]:
    rows = []
    for o in outcomes:
        p = o.point
        first = [p.target, p.store, str(p.workers or "")]
        if not o.rounds:
            rows.append([*first, "", o.note, *[""] * 7])
            continue
        first.append(cpus(roles.proxy_cpus(p.workers) if p.workers else roles.upstream))
        ratio = [r["p99_us"] / r["p50_us"] for r in o.rounds if r["p50_us"]]
        exact = o.counts_exact
        rows.append(
            [
                *first,
                spread(o.values("rps"), lambda v: f"{v:,.0f}"),
                ms(o.median("p50_us") or 0),
                ms(o.median("p99_us") or 0),
                f"{statistics.median(ratio):.1f}×" if ratio else "",
                f"{o.median('proxy_cores') or 0:.2f}" if p.workers else "",
                f"{o.median('proxy_us') or 0:,.0f}" if p.workers else "",
                f"{sum(o.values('errors')):.0f}",
                "–" if exact is None else "exact" if exact else "MISMATCH",
            ]
        )
    return rows


CLOSED_HEADER = (
    "target", "store", "workers", "its CPUs", "req/s", "p50 ms", "p99 ms", "p99/p50",
    "proxy cores", "proxy µs/req", "errors", "count check",
)  # fmt: skip


def role_rows(outcomes: Sequence[Outcome]) -> list[list[str]]:
    rows = []
    for o in outcomes:
        if not o.rounds or not o.point.workers:
            continue
        redis = o.point.store == "redis"
        rows.append(
            [
                o.point.label,
                f"{o.median('upstream_cores') or 0:.2f}",
                f"{o.median('load_cores') or 0:.2f}",
                f"{o.median('redis_cores') or 0:.2f}" if redis else "",
                f"{o.median('redis_us') or 0:.0f}" if redis else "",
                f"{o.median('commands') or 0:.1f}" if redis else "",
                f"{o.sent_per_request:.1f}" if redis and o.sent_per_request is not None else "",
            ]
        )
    return rows


ROLE_HEADER = (
    "target", "upstream cores", "wrk cores", "redis cores", "redis µs/req",
    "Redis commands/request", "sent by the proxy/request (MONITOR)",
)  # fmt: skip


def sustained(target: dict[str, Any]) -> bool:
    """Whether an open-loop run kept its rate: 95% of it answered 200 and nothing cut."""
    return target["achieved"] >= 0.95 * target["rate"] and not target["unanswered"]


def open_rows(outcomes: Sequence[Outcome]) -> list[list[str]]:
    rows = []
    for o in outcomes:
        for run in o.open_loop:
            direct, target = run["direct"], run["target"]
            for name, r in (("direct", direct), (o.point.label, target)):
                kept = sustained(r)
                added = name != "direct" and kept
                achieved = f"{r['achieved']:,.0f}" + ("" if kept else " (cannot keep up)")
                count = "" if "count_ok" not in r else "exact" if r["count_ok"] else "MISMATCH"
                rows.append(
                    [
                        name,
                        f"{r['rate']:,.0f}",
                        achieved,
                        ms(r["p50_us"]),
                        ms(r["p99_us"]),
                        ms(r["p999_us"]),
                        f"{(r['p50_us'] - direct['p50_us']) / 1000:+.2f}" if added else "",
                        f"{(r['p99_us'] - direct['p99_us']) / 1000:+.2f}" if added else "",
                        f"{r['proxy_cores']:.2f}" if name != "direct" else "",
                        count,
                        f"{r['dispatch_lag_p50_us']:.0f} / {r['dispatch_lag_p99_us']:.0f}",
                        f"{r['window_min']:.2f}–{r['window_max']:.2f}",
                    ]
                )
    return rows


OPEN_HEADER = (
    "target", "requested req/s", "achieved", "p50 ms", "p99 ms", "p99.9 ms", "added p50",
    "added p99", "proxy cores", "count check", "dispatch lag p50/p99 µs", "per 50 ms window",
)  # fmt: skip


def find(outcomes: Sequence[Outcome], store: str, workers: int) -> Outcome | None:
    return next(
        (
            o
            for o in outcomes
            if o.point.target == "toolsentry"
            and o.point.store == store
            and o.point.workers == workers
            and o.rounds
        ),
        None,
    )


def judged(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def goals(outcomes: Sequence[Outcome], roles: Roles, connections: int) -> list[str]:
    """Issue 37's goals, each judged on this run: met, not met, or not measurable here."""
    n = len(roles.every)
    lines = []
    memory, redis1 = find(outcomes, "memory", 1), find(outcomes, "redis", 1)
    if redis1 and redis1.sent_per_request is not None:
        sent = redis1.sent_per_request
        lines.append(
            f"Redis ≤ 2 round trips per request: {sent:.1f} sent by the proxy a request (MONITOR) — {judged(sent <= 2)}."
        )
    if memory and redis1:
        ratio = (redis1.median("proxy_us") or 0) / (memory.median("proxy_us") or 1)
        lines.append(
            f"Proxy CPU per request with Redis ≤ 1.15× memory's, one worker each, side by side: "
            f"{redis1.median('proxy_us'):,.0f} against {memory.median('proxy_us'):,.0f} µs, "
            f"{ratio:.2f}× — {judged(ratio <= 1.15)}."
        )
    if redis1:
        lines.append(
            f"Redis server CPU per request halved: {redis1.median('redis_us'):,.0f} µs a request "
            "at one worker here; not judged by one run (a before/after pair on one machine is)."
        )
    counts = sorted(o.point.workers for o in outcomes if o.point.store == "redis" and o.rounds)
    top = find(outcomes, "redis", counts[-1]) if counts else None
    if redis1 and top and top is not redis1:
        speedup = (top.median("rps") or 0) / (redis1.median("rps") or 1)
        cpu = (top.median("proxy_us") or 0) / (redis1.median("proxy_us") or 1)
        w = top.point.workers
        if w >= 8:
            w8 = find(outcomes, "redis", 8) or top
            speedup = (w8.median("rps") or 0) / (redis1.median("rps") or 1)
            cpu = (w8.median("proxy_us") or 0) / (redis1.median("proxy_us") or 1)
            lines.append(
                f"8 workers ≥ 7× one worker's throughput on Redis: {speedup:.2f}× — {judged(speedup >= 7)}."
            )
            lines.append(
                f"CPU per request at 8 workers ≤ 1.1× at 1: {cpu:.2f}× — {judged(cpu <= 1.1)}."
            )
        else:
            lines.append(
                f"8 workers ≥ 7× one worker, CPU per request at 8 ≤ 1.1× at 1: not measurable on "
                f"{n} CPUs; {w} workers give {speedup:.2f}× one worker's throughput at "
                f"{cpu:.2f}× its CPU per request"
                + (
                    " (the second worker shares its CPUs with the upstream, wrk and Redis)"
                    if roles.shared
                    else ""
                )
                + "."
            )
    for o in (memory, redis1):
        if o is None:
            continue
        ratio = statistics.median(r["p99_us"] / r["p50_us"] for r in o.rounds if r["p50_us"])
        if connections == 256:
            lines.append(
                f"Fairness, {o.point.label} at c256: p99 = {ratio:.1f}× p50 — {judged(ratio <= 5)}."
            )
        else:
            lines.append(f"Fairness at c256: not measured (this run used c{connections}).")
    lines.append(moonshot(outcomes, roles))
    lines.append(
        "No regression on one core: bench.overhead's goal (`python -m bench.overhead --only "
        "toolsentry,pass-aiohttp --baseline <commit> --rounds 5`), not measured here."
    )
    return lines


def moonshot(outcomes: Sequence[Outcome], roles: Roles) -> str:
    w4 = find(outcomes, "redis", 4)
    anchor = next((r for r in (w4.open_loop if w4 else []) if r["rate"] == 10_000), None)
    if anchor is not None:
        t, d = anchor["target"], anchor["direct"]
        if not sustained(t):
            return f"Open loop, 4 workers on Redis at 10,000/s, added p50 ≤ 0.35 ms and p99 ≤ 1 ms: {t['achieved']:,.0f}/s achieved, cannot keep up — **not met**."
        p50, p99 = (t["p50_us"] - d["p50_us"]) / 1000, (t["p99_us"] - d["p99_us"]) / 1000
        return f"Open loop, 4 workers on Redis at 10,000/s: added p50 {p50:+.2f} ms, p99 {p99:+.2f} ms — {judged(p50 <= 0.35 and p99 <= 1)}."
    kept = [(o, r) for o in outcomes for r in o.open_loop if sustained(r["target"])]
    text = f"Open loop at 10,000/s on 4 proxy CPUs: not measurable on {len(roles.every)} CPUs"
    if kept:
        o, r = max(kept, key=lambda pair: pair[1]["rate"])
        t, d = r["target"], r["direct"]
        text += (
            f"; the largest rate sustained here, {r['rate']:,.0f}/s on {o.point.label}, adds "
            f"p50 {(t['p50_us'] - d['p50_us']) / 1000:+.2f} ms and p99 {(t['p99_us'] - d['p99_us']) / 1000:+.2f} ms"
        )
    return text + "."


BEGIN = "<!-- bench.scale {n} CPUs -->"
END = "<!-- end bench.scale {n} CPUs -->"
NEW_FILE = """# toolsentry across cores: `python -m bench.scale`

Workers 1, 2, 4, … on the memory, SQLite and Redis stores, beside the fake upstream alone and the
aiohttp pass-through, in a closed loop (wrk, c256) and at fixed request rates (open loop); the
method is in bench/scale.py's docstring. One section per machine; each run rewrites its own.
"""


def section(
    outcomes: Sequence[Outcome],
    roles: Roles,
    args: argparse.Namespace,
    given: Sequence[str],
    info: dict[str, Any],
) -> str:
    n = len(roles.every)
    closed = markdown_table(CLOSED_HEADER, closed_rows(outcomes, roles), right=range(4, 11))
    role = markdown_table(ROLE_HEADER, role_rows(outcomes), right=range(1, 7))
    opened = markdown_table(OPEN_HEADER, open_rows(outcomes), right=range(1, 9))
    notes = [f"- {o.point.label}: {o.note}" for o in outcomes if o.note]
    parts = [
        BEGIN.format(n=n),
        f"## {n} CPUs: {machine()}",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} with `python -m bench.scale {' '.join(given)}` "
        f"({info['seconds']:.0f} s). {roles.describe()}. wrk {args.connections} connections, "
        f"{args.warmup:g} s warm-up, {args.rounds} × {args.duration:g} s a point (median, "
        f"min–max). Load average {info['load']} at the start, {info['load_end']} at the end"
        + (
            ": a machine shared with other work, so absolute figures drift from minute to "
            "minute; the ratios between rows of one run are what it shows."
            if n <= 4
            else "."
        ),
        "",
        closed,
        "",
        role,
        "",
        "Open loop (bench/openloop.py; latency from each request's scheduled send; added = "
        "toolsentry − direct at the same rate, measured one after the other). The generator's "
        "own check: its dispatch lag (how late each request was handed to a connection's loop "
        "against the schedule) and the requests handed over in each 50 ms window as a share of "
        "the rate's (1.00: exactly the rate).",
        "",
        opened,
        "",
        "Goals (issue 37):",
        "",
        *[f"- {line}" for line in goals(outcomes, roles, args.connections)],
        *(["", "Notes:", "", *notes] if notes else []),
        END.format(n=n),
    ]
    return "\n".join(parts)


def show(outcomes: Sequence[Outcome], roles: Roles, args: argparse.Namespace) -> None:
    console.print(rich_table("closed loop", CLOSED_HEADER, closed_rows(outcomes, roles)))
    console.print(rich_table("roles", ROLE_HEADER, role_rows(outcomes)))
    console.print(rich_table("open loop", OPEN_HEADER, open_rows(outcomes)))
    for line in goals(outcomes, roles, args.connections):
        console.print(f"- {line}", highlight=False)


def as_json(outcomes: Sequence[Outcome], roles: Roles) -> dict[str, Any]:
    return {
        "roles": {k: list(v) for k, v in vars(roles).items() if isinstance(v, tuple)},
        "worker_counts": roles.worker_counts(),
        "points": [
            {
                "target": o.point.target,
                "store": o.point.store,
                "workers": o.point.workers,
                "rounds": o.rounds,
                "sent_per_request": o.sent_per_request,
                "open_loop": o.open_loop,
                "note": o.note,
            }
            for o in outcomes
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration", type=float, default=3.0, help="seconds a round [3]")
    parser.add_argument("--rounds", type=int, default=3, help="rounds a point [3]")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds [2]")
    parser.add_argument(
        "--connections", type=int, default=256, help="wrk's and the open loop's [256]"
    )
    parser.add_argument(
        "--rates",
        default="auto",
        help="open-loop requests a second, comma-separated, or auto (see above) [auto]",
    )
    parser.add_argument(
        "--stores",
        type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
        default=["memory", "sqlite", "redis"],
        help="toolsentry's session stores measured [memory,sqlite,redis]",
    )
    parser.add_argument(
        "--monitor-requests", type=int, default=50, help="requests under MONITOR [50]"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round of 1 s, 1 rate")
    parser.add_argument("--no-write", action="store_true", help=f"do not update {RESULTS.name}")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args(argv)
    if unknown := set(args.stores) - {"memory", "sqlite", "redis"}:
        parser.error(f"unknown store(s) {', '.join(sorted(unknown))}")
    if args.quick:
        args.duration, args.rounds, args.warmup = 1.0, 1, 1.0
        args.monitor_requests = min(args.monitor_requests, 20)
    if not have_wrk():
        console.print("[bold red]wrk is not installed[/] (scripts/system-deps)")
        return 2
    # With PYTHONDONTWRITEBYTECODE every worker compiles its imports and may miss uvicorn's
    # start-up check, to be replaced in a loop (seen on 16 cores): let the first write them.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    roles = roles_of(sorted(os.sched_getaffinity(0)))
    console.print(f"{machine()}\n{roles.describe()}; workers {roles.worker_counts()}")
    info: dict[str, Any] = {"load": load_average()}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="toolsentry-scale-") as tmp:
        outcomes = measure(args, roles, Path(tmp))
    info |= {"seconds": time.monotonic() - started, "load_end": load_average()}
    show(outcomes, roles, args)
    if args.json:
        args.json.write_text(json.dumps(as_json(outcomes, roles), indent=1))
    if not args.no_write and not args.quick:
        given = sys.argv[1:] if argv is None else argv
        n = len(roles.every)
        text = section(outcomes, roles, args, given, info)
        write_section(RESULTS, text, BEGIN.format(n=n), END.format(n=n), new=NEW_FILE)
        console.print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
