"""What bench.overhead prints and writes: the tables of every workload, the headline ratios and
the issues' goals, each judged on the median over rounds of a figure computed round by round."""

from __future__ import annotations

import datetime as dt
import statistics
from pathlib import Path
from typing import Any

from bench.bodies import WORKLOADS
from bench.drivers import HIGH_CONCURRENCY, wrk_version
from bench.machine import machine
from bench.overhead.measure import RATIO_GOALS, SIDE_BY_SIDE_WORKLOAD, Outcome, Results
from bench.overhead.targets import BASELINE, SHADOW
from bench.tables import console, markdown_table, rich_table, spread, write_section

SECTION_BEGIN = "<!-- overhead.py:begin -->"
SECTION_END = "<!-- overhead.py:end -->"

# The goals this benchmark reports against (tests never time anything).
GOAL_ADDED_P50_MS = 0.6
GOAL_ADDED_P99_MS = 2.0
GOAL_THROUGHPUT_OF_FLOOR = 0.70
GOAL_THROUGHPUT_OF_LITELLM = 20.0
GOAL_ADDED_TTFT_MS = 1.0
GOAL_SHADOW_ADDED_P50_MS = 0.1  # beside shadowing off
GOAL_SHADOW_THROUGHPUT = 0.80  # of shadowing off, every request shadowed
GOAL_PROTOCOL_ADDED = 1.1  # Responses, Messages: added c1 p50 ÷ chat's on the same body size
GOAL_PROTOCOL_THROUGHPUT = 0.75  # c64 req/s ÷ the bare aiohttp pass-through's, each protocol
GOAL_LARGE_ADDED_MS = 1.0  # the Claude-Code-sized request's added c1 p50
GOAL_NO_SLOWER = 0.95  # chat against the commit before the turn refactor, 5% for noise
REFACTOR_PARENT = "f869956"


def added(outcome: Outcome, direct: Outcome, part: str, key: str) -> float | None:
    """Median over rounds of (target − direct) in the same round, in µs."""
    diffs = []
    for mine, base in zip(outcome.samples, direct.samples, strict=False):
        a, b = getattr(mine, part).get(key), getattr(base, part).get(key)
        if isinstance(a, int | float) and isinstance(b, int | float):
            diffs.append(a - b)
    return statistics.median(diffs) if diffs else None


def per_round(
    outcome: Outcome, reference: Outcome, part: str, key: str, *, as_ratio: bool
) -> list[float]:
    """Round by round: target − reference (µs), or target / reference with `as_ratio`."""
    values = []
    for mine, base in zip(outcome.samples, reference.samples, strict=False):
        a, b = getattr(mine, part).get(key), getattr(base, part).get(key)
        if isinstance(a, int | float) and isinstance(b, int | float):
            if as_ratio:
                if b:
                    values.append(a / b)
            else:
                values.append(a - b)
    return values


SPREAD_COLUMNS = [
    "target",
    "added c1 p50 ms",
    "c64 req/s ÷ pass-aiohttp",
    "added TTFT ms",
]


def spread_rows(outcomes: dict[str, Outcome]) -> list[list[str]]:
    """Each proxy's figures as median [min–max] over rounds, each round against the same round's
    direct (added) or aiohttp pass-through (ratio): how far one round's noise reaches."""
    direct, floor = outcomes["direct"], outcomes.get("pass-aiohttp")
    out = []
    for o in outcomes.values():
        if o is direct or o is floor or not o.samples:
            continue
        rps = per_round(o, floor, "c64", "rps", as_ratio=True) if floor and floor.samples else []
        out.append(
            [
                o.name,
                spread(per_round(o, direct, "c1", "p50_us", as_ratio=False), ms),
                spread(rps, lambda r: f"{r:.2f}"),
                spread(per_round(o, direct, "ttft", "p50_us", as_ratio=False), ms),
            ]
        )
    return out


def ms(us: float | None, digits: int = 3) -> str:
    return "–" if us is None else f"{us / 1000:.{digits}f}"


def cpu(us: float | None) -> str:
    return "–" if us is None else f"{us:.0f}"


def ratio(a: float | None, b: float | None, digits: int = 1) -> str:
    if a is None or b is None or b == 0:
        return "–"
    return f"{a / b:.{digits}f}×"


def rows(outcomes: dict[str, Outcome]) -> list[list[str]]:
    direct = outcomes["direct"]
    out = []
    for o in outcomes.values():
        if not o.samples:
            out.append([o.name, "skipped (see below)", *["–"] * (len(COLUMNS) - 2)])
            continue
        is_direct = o is direct
        ttft_p50 = o.median("ttft", "p50_us")
        out.append(
            [
                o.name,
                ms(o.median("c1", "p50_us")),
                ms(o.median("c1", "p99_us")),
                "" if is_direct else ms(added(o, direct, "c1", "p50_us")),
                "" if is_direct else ms(added(o, direct, "c1", "p99_us")),
                f"{o.median('c64', 'rps'):,.0f}",
                ms(o.median("c64", "p99_us"), 2),
                cpu(o.median("c64", "cpu_us")),
                ms(ttft_p50) if ttft_p50 is not None else (o.ttft_note and "skipped") or "–",
                ""
                if is_direct
                else ms(added(o, direct, "ttft", "p50_us"))
                if ttft_p50 is not None
                else "–",
            ]
        )
    return out


COLUMNS = [
    "target",
    "c1 p50 ms",
    "c1 p99 ms",
    "added p50 ms",
    "added p99 ms",
    "c64 req/s",
    "c64 p99 ms",
    "CPU µs/req",
    "TTFT p50 ms",
    "added TTFT ms",
]


RATIO_COLUMNS = (
    "comparison",
    "throughput at c64",
    "added latency at c1",
    "p99 at c64",
    "proxy CPU at c64",
)


def floor_of(outcomes: dict[str, Outcome]) -> Outcome | None:
    passes = [o for n, o in outcomes.items() if n.startswith("pass-") and o.samples]
    return max(passes, key=lambda o: o.median("c64", "rps") or 0.0, default=None)


def throughput_ratio(mine: Outcome, other: Outcome) -> float | None:
    """`mine`'s c64 req/s ÷ `other`'s: the median of the rounds' ratios, as every table shows it."""
    values = per_round(mine, other, "c64", "rps", as_ratio=True)
    return statistics.median(values) if values else None


def headline(outcomes: dict[str, Outcome]) -> tuple[list[list[str]], list[list[str]]]:
    """(ratio rows, goal rows)."""
    ts, direct = outcomes.get("toolsentry"), outcomes["direct"]
    floor, lite = floor_of(outcomes), outcomes.get("litellm")
    ratios: list[list[str]] = []
    goals: list[list[str]] = []
    if ts is None or not ts.samples:
        return ratios, goals
    ts_add50 = added(ts, direct, "c1", "p50_us")
    ts_add99 = added(ts, direct, "c1", "p99_us")
    ts_rps, ts_p99 = ts.median("c64", "rps"), ts.median("c64", "p99_us")
    base = outcomes.get(BASELINE)
    for other in (floor, lite if lite is not None and lite.samples else None, base):
        if other is None or not other.samples:
            continue
        o50 = added(other, direct, "c1", "p50_us")
        rps_ratio = throughput_ratio(ts, other)
        ratios.append(
            [
                f"toolsentry vs {other.name}",
                "–" if rps_ratio is None else f"{rps_ratio:.2f}× the req/s",
                f"{ratio(ts_add50, o50, 2)} the added p50 ({ms(ts_add50)} vs {ms(o50)} ms)",
                f"{ratio(ts_p99, other.median('c64', 'p99_us'), 2)} the c64 p99",
                f"{ratio(ts.median('c64', 'cpu_us'), other.median('c64', 'cpu_us'), 2)} the CPU per request",
            ]
        )

    def goal(name: str, value: str, target: str, ok: bool | None) -> None:
        goals.append([name, value, target, "–" if ok is None else ("met" if ok else "MISSED")])

    goal(
        "added p50 at c1",
        f"{ms(ts_add50)} ms",
        f"≤ {GOAL_ADDED_P50_MS} ms",
        None if ts_add50 is None else ts_add50 / 1000 <= GOAL_ADDED_P50_MS,
    )
    goal(
        "added p99 at c1",
        f"{ms(ts_add99)} ms",
        f"≤ {GOAL_ADDED_P99_MS} ms",
        None if ts_add99 is None else ts_add99 / 1000 <= GOAL_ADDED_P99_MS,
    )
    share = None if floor is None else throughput_ratio(ts, floor)
    if floor is not None and share is not None:
        goal(
            f"c64 req/s vs {floor.name}",
            f"{share:.0%}",
            f"≥ {GOAL_THROUGHPUT_OF_FLOOR:.0%}",
            share >= GOAL_THROUGHPUT_OF_FLOOR,
        )
    if lite is not None and lite.samples and ts_rps is not None:
        times = ts_rps / (lite.median("c64", "rps") or 1)
        lower = (ts_p99 or 0) < (lite.median("c64", "p99_us") or 0)
        goal(
            "c64 req/s vs litellm, lower p99",
            f"{times:.0f}×, p99 {ms(ts_p99, 2)} vs {ms(lite.median('c64', 'p99_us'), 2)} ms",
            f"≥ {GOAL_THROUGHPUT_OF_LITELLM:.0f}×, lower",
            times >= GOAL_THROUGHPUT_OF_LITELLM and lower,
        )
    # Shadowing's goals are the issue's, with the others of the run (`issue_goals`).
    ttft_added = added(ts, direct, "ttft", "p50_us")
    goal(
        "added TTFT p50",
        f"{ms(ttft_added)} ms" if ttft_added is not None else ts.ttft_note or "–",
        f"≤ {GOAL_ADDED_TTFT_MS} ms",
        None if ttft_added is None else ttft_added / 1000 <= GOAL_ADDED_TTFT_MS,
    )
    return ratios, goals


def show(results: Results, info: dict[str, Any]) -> None:
    for workload, outcomes in results.items():
        title = f"{workload} ({WORKLOADS[workload].route}): medians over rounds; added = target − direct"
        console.print(rich_table(title, COLUMNS, rows(outcomes), text_columns={"target"}))
        spreads = spread_rows(outcomes)
        if spreads:
            title = f"{workload}, per round: median (min–max) over rounds"
            console.print(rich_table(title, SPREAD_COLUMNS, spreads, text_columns={"target"}))
        ratios, goals = headline(outcomes) if workload == "chat" else ([], [])
        if ratios:
            console.print(rich_table(f"{workload}: headline ratios", RATIO_COLUMNS, ratios))
        if goals:
            console.print(rich_table(f"{workload}: goals", GOAL_COLUMNS, goals))
    goals = issue_goals(results)
    if goals:
        title = "Goals of the issues: median (min–max) over rounds, judged on the median"
        console.print(rich_table(title, GOAL_COLUMNS, goals))
    for name, note in info["notes"].items():
        console.print(f"[dim]{name}: {note}[/]")
    for workload, outcomes in results.items():
        for o in outcomes.values():
            if o.ttft_note:
                console.print(f"[dim]{workload} {o.name}: {o.ttft_note}[/]")


GOAL_COLUMNS = ["goal", "measured", "target", ""]


def _added_rounds(results: Results, workload: str, target: str, part: str = "c1") -> list[float]:
    """Round by round, `target` − direct on `workload` (µs): empty when either is missing."""
    outcomes = results.get(workload, {})
    mine, direct = outcomes.get(target), outcomes.get("direct")
    if mine is None or direct is None:
        return []
    return per_round(mine, direct, part, "p50_us", as_ratio=False)


def _rps_rounds(
    results: Results, workload: str, target: str, reference: str, part: str = "c64"
) -> list[float]:
    """Round by round, `target`'s c64 req/s ÷ `reference`'s on `workload` (`part`: each alone,
    or "side", the two side by side)."""
    outcomes = results.get(workload, {})
    mine, other = outcomes.get(target), outcomes.get(reference)
    if mine is None or other is None:
        return []
    return per_round(mine, other, part, "rps", as_ratio=True)


def _paired(a: list[float], b: list[float], combine: Any) -> list[float]:
    return [combine(x, y) for x, y in zip(a, b, strict=False) if y]


def issue_goals(results: Results) -> list[list[str]]:
    """The goals of the turn, Messages and shadow issues, each as median (min–max) over rounds
    of a figure computed round by round (added latencies against the same round's direct,
    throughput against the same round's reference), judged on the median."""
    rows: list[list[str]] = []

    def goal(name: str, values: list[float], render: Any, target: str, ok: Any) -> None:
        # `ok` None: a figure shown beside a goal's, not judged itself.
        if not values:
            return
        middle = statistics.median(values)
        verdict = "–" if ok is None else "met" if ok(middle) else "MISSED"
        rows.append([name, spread(values, render), target, verdict])

    def times(r: float) -> str:
        return f"{r:.2f}×"

    def share(r: float) -> str:
        return f"{r:.0%}"

    def signed_ms(us: float) -> str:
        return f"{us / 1000:+.3f}"

    ts = "toolsentry"
    chat_added = _added_rounds(results, "chat", ts)
    for workload, versus, label in RATIO_GOALS:
        ratio_rounds = _paired(
            _added_rounds(results, workload, ts, "interleaved"),
            _added_rounds(results, versus, ts, "interleaved"),
            lambda x, y: x / y,
        )
        goal(
            f"{label}: added c1 p50 ÷ chat's on the same body size (requests interleaved)",
            ratio_rounds,
            times,
            f"≤ {GOAL_PROTOCOL_ADDED:.1f}×",
            lambda m: m <= GOAL_PROTOCOL_ADDED,
        )
    for workload in ("chat", "responses", "messages", "chat-large", "messages-large"):
        goal(
            f"{workload}: c64 req/s ÷ pass-aiohttp",
            _rps_rounds(results, workload, ts, "pass-aiohttp"),
            share,
            f"≥ {GOAL_PROTOCOL_THROUGHPUT:.0%}",
            lambda m: m >= GOAL_PROTOCOL_THROUGHPUT,
        )
    goal(
        "messages-large (Claude Code, 75 kB): added c1 p50 ms",
        _added_rounds(results, "messages-large", ts),
        ms,
        f"≤ {GOAL_LARGE_ADDED_MS:.1f} ms",
        lambda m: m / 1000 <= GOAL_LARGE_ADDED_MS,
    )
    goal(
        "chat: c64 req/s ÷ before the refactor (--baseline)",
        _rps_rounds(results, "chat", ts, BASELINE),
        times,
        f"≥ {GOAL_NO_SLOWER:.2f}× (no slower, 5% for noise)",
        lambda m: m >= GOAL_NO_SLOWER,
    )
    goal(
        "chat: added c1 p50 ÷ before the refactor (--baseline)",
        _paired(chat_added, _added_rounds(results, "chat", BASELINE), lambda x, y: x / y),
        times,
        f"≤ {1 / GOAL_NO_SLOWER:.2f}× (no slower, 5% for noise)",
        lambda m: m <= 1 / GOAL_NO_SLOWER,
    )
    for workload in ("chat", "responses", "messages"):
        goal(
            f"{workload}: added TTFT p50 ms",
            _added_rounds(results, workload, ts, "ttft"),
            ms,
            f"< {GOAL_ADDED_TTFT_MS:.1f} ms",
            lambda m: m / 1000 < GOAL_ADDED_TTFT_MS,
        )
    goal(
        "shadowing on (every request): added c1 p50 − off, ms",
        _paired(_added_rounds(results, "chat", SHADOW), chat_added, lambda x, y: x - y),
        signed_ms,
        f"≤ {GOAL_SHADOW_ADDED_P50_MS} ms",
        lambda m: m / 1000 <= GOAL_SHADOW_ADDED_P50_MS,
    )
    goal(
        "shadowing on: c64 req/s ÷ off, the two side by side on one core",
        _rps_rounds(results, SIDE_BY_SIDE_WORKLOAD, SHADOW, ts, part="side"),
        share,
        f"≥ {GOAL_SHADOW_THROUGHPUT:.0%}",
        lambda m: m >= GOAL_SHADOW_THROUGHPUT,
    )
    goal(
        "shadowing on: c64 req/s ÷ off, each alone in turn (not judged)",
        _rps_rounds(results, "chat", SHADOW, ts),
        share,
        "(judged side by side)",
        None,
    )
    return rows


def results_header() -> str:
    return (
        "# Benchmark results\n\n"
        f"Created {dt.date.today().isoformat()} on {machine()}.\n\n"
        "The machine is shared with other work, so every comparison runs side by side in one run\n"
        "and the ratios are the figures to trust; absolute numbers drift from run to run.\n\n"
        "Commands (from the repository root, with the project's virtualenv active):\n\n"
        "```\n"
        "python -m bench.overhead          # proxy overhead: direct, toolsentry, pass-throughs, LiteLLM\n"
        "python -m bench.validate          # validator choice and the guard's per-call cost\n"
        "make bench                        # both\n"
        "```\n\n"
        "Sections below are written by the scripts (between their markers) or by hand.\n"
    )


def section(results: Results, info: dict[str, Any], argv: list[str]) -> str:
    notes = [f"- {name}: {note}" for name, note in info["notes"].items()]
    notes += [
        f"- {workload} {o.name}: {o.ttft_note}"
        for workload, outcomes in results.items()
        for o in outcomes.values()
        if o.ttft_note
    ]
    sizes = ", ".join(
        f"{name} {len(WORKLOADS[name].body()) / 1000:.1f} kB on `{WORKLOADS[name].route}`"
        for name in results
    )
    parts = [
        SECTION_BEGIN,
        "## Proxy overhead (bench/overhead.py)",
        "",
        f"{dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M')} UTC, {machine()}; wrk {wrk_version()}.",
        f"Command: `{' '.join(['python -m bench.overhead', *argv])}`; load average at start "
        f"{info['load']}, at the end {info.get('load_end', '?')}, {info.get('seconds', 0):.0f} s",
        "(other work on the machine: the higher it is, the more the absolute figures stretch).",
        f"Placement: {info['placement']}. Concurrency 1 and {HIGH_CONCURRENCY} from wrk (one thread),",
        f"{info['duration']} s each, {info['rounds']} rounds in rotating order, medians shown; added = target − direct",
        "of the same round. TTFT: streamed requests one at a time, first content byte (bench/ttft.py).",
        f"Bodies (bench/bodies.py): {sizes}.",
        "",
    ]
    goals = issue_goals(results)
    if goals:
        parts += [
            "Goals of the issues, each a median (min–max) over rounds of a figure computed round",
            "by round, judged on the median:",
            "",
            markdown_table(GOAL_COLUMNS, goals),
            "",
        ]
    for workload, outcomes in results.items():
        parts += [
            f"### {workload} (`{WORKLOADS[workload].route}`)",
            "",
            markdown_table(COLUMNS, rows(outcomes)),
            "",
        ]
        spreads = spread_rows(outcomes)
        if spreads:
            parts += [
                "Per round, median (min–max) over rounds (each round against its own direct and",
                "aiohttp pass-through):",
                "",
                markdown_table(SPREAD_COLUMNS, spreads),
                "",
            ]
        ratios, goals = headline(outcomes) if workload == "chat" else ([], [])
        if ratios:
            parts += [markdown_table(list(RATIO_COLUMNS), ratios), ""]
        if goals:
            parts += [markdown_table(GOAL_COLUMNS, goals), ""]
    if notes:
        parts += [*notes, ""]
    parts.append(SECTION_END)
    return "\n".join(parts)


def write_results(path: Path, text: str) -> None:
    """Put `text` between this benchmark's markers in `path` (a new file gets the header)."""
    write_section(path, text, SECTION_BEGIN, SECTION_END, new=results_header())
