"""bench.scale's tables (closed loop, roles, open loop), issue 37's goals judged on the run,
and the section of bench/results/scale.md a run on a machine of N CPUs rewrites."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

from bench.machine import machine
from bench.scale.measure import Outcome
from bench.scale.roles import Roles, cpus
from bench.tables import console, markdown_table, rich_table, spread

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
        ratios = [r["p99_us"] / r["p50_us"] for r in o.rounds if r["p50_us"]]
        ratio = statistics.median(ratios)
        if connections == 256:
            lines.append(
                f"Fairness, {o.point.label} at c256: p99 = {ratio:.1f}× p50 (rounds "
                f"{min(ratios):.1f}–{max(ratios):.1f}×) — {judged(ratio <= 5)}."
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
method is in bench/scale/__init__.py's docstring. One section per machine; each run rewrites its own.
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
        f"Measured {time.strftime('%Y-%m-%d')} with `{' '.join(['python -m bench.scale', *given])}` "
        f"({info['seconds']:.0f} s). {roles.describe()}. wrk {args.connections} connections, "
        f"{args.warmup:g} s warm-up, {args.rounds} × {args.duration:g} s a point (median, "
        f"min–max). {conditions(outcomes, info, args.connections)}",
        "",
        closed,
        "",
        role,
        "",
        "Redis commands a request are `INFO commandstats`'s (its scripts' own commands included) "
        "over the rounds; those the proxy sent itself (its round trips) are `MONITOR`'s over "
        f"{args.monitor_requests} requests sent one at a time after the rounds.",
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


def conditions(outcomes: Sequence[Outcome], info: dict[str, Any], connections: int) -> str:
    """The load average, and what it did to the run when one worker could not have its CPU."""
    text = f"Load average {info['load']} at the start, {info['load_end']} at the end."
    used = [
        o.median("proxy_cores")
        for o in outcomes
        if o.point.target == "toolsentry" and o.point.workers == 1 and o.rounds
    ]
    cores = statistics.median(c for c in used if c is not None) if used else None
    if cores is not None and cores < 0.8:
        text += (
            f" One worker used {cores:.2f} of its CPU at c{connections}: it waited for a CPU "
            "shared with other work (which the load average counts), so requests a second are "
            "the machine's share at the time, not the proxy's capacity, and drift from minute "
            "to minute. CPU per request, the ratios between rows of one run, the Redis "
            "commands and the count check are what the run shows."
        )
    return text


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
