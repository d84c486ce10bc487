"""The tables of evalkit's output, built from analysed runs: the one place that turns a figure of
`RunAnalysis` or `CellComparison` into the text of a cell (the `Table` type itself, and how it is
rendered, is `table.py`). `replay`'s screen and `summary.md`,
`analyze`, `compare` and `report` all print these tables, so one run shows the same figures
wherever it is shown. Numbers are points (×100) with one decimal unless a column says otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from evalkit.analysis.budget import Budget
from evalkit.analysis.channels import ErrorChannel
from evalkit.analysis.compare import CellComparison, SignatureStatistics
from evalkit.analysis.run import RunAnalysis
from evalkit.analysis.table import Column, Table, columns
from evalkit.termination import TerminationReason
from proxy.guard import Channel

NONE: Final = "—"
NO_SPREAD: Final = "(no spread)"
"""What a figure shows in place of an interval when its values do not vary."""


def pct(value: float | None, digits: int = 1) -> str:
    """A fraction as points (`0.609` → `60.9`); — for None."""
    return NONE if value is None else f"{100 * value:.{digits}f}"


def num(value: float | None, digits: int = 2) -> str:
    """A number with `digits` decimals; — for None."""
    return NONE if value is None else f"{value:.{digits}f}"


def p_value(value: float | None) -> str:
    """A p-value: three decimals, `<0.001` below that; — for None."""
    if value is None:
        return NONE
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def interval(low: float, high: float) -> str:
    """An interval of fractions as points: `74.3–93.9`."""
    return f"{pct(low)}–{pct(high)}"


def reward_interval(run: RunAnalysis) -> str:
    """A run's mean-reward interval as points, or what stands in its place: — without
    episodes, `(1 task)`, or `(no spread)` where every task's mean is alike."""
    if run.reward_ci is not None:
        return interval(*run.reward_ci)
    if not run.episodes:
        return NONE
    return "(1 task)" if len({e.task_id for e in run.episodes}) < 2 else NO_SPREAD


def budget_order(runs: Sequence[RunAnalysis]) -> list[Budget]:
    """Both budgets, the one the (first) run was budgeted with first."""
    first = runs[0].budget if runs else Budget.TAU2
    return [first, *[b for b in Budget if b is not first]]


def budget_title(budget: Budget, runs: Sequence[RunAnalysis]) -> str:
    """A budget curve's title, saying when it is the budget the runs ran under."""
    own = bool(runs) and all(r.budget is budget for r in runs)
    return f"Budget curve: {budget.label}" + (" (how this run was budgeted)" if own else "")


def nl_footnotes(runs: Sequence[RunAnalysis]) -> tuple[str, ...]:
    """A sentence saying how many episodes of each run were scored without their NL assertions
    (none when every run had a judge or no NL assertion)."""
    missing = [r for r in runs if r.unjudged]
    if not missing:
        return ()
    counts = ", ".join(f"{r.label} {r.unjudged} of {len(r.episodes)}" for r in missing)
    return (
        f"Episodes scored without their NL assertions (no judge given; pass --judge-base-url "
        f"and --judge-model to score them): {counts}.",
    )


# -- one run or several side by side -------------------------------------------------------


def runs_table(runs: Sequence[RunAnalysis]) -> Table:
    """One row per run: episodes, mean reward with its interval, pass^k, both budgets' errors per
    episode, repairs and how NL assertions were scored."""
    ks = sorted({k for r in runs for k in r.pass_hat()})
    header = ["run", "n", "reward", "95% CI", *[f"pass^{k}" for k in ks]]
    header += ["tool err/ep", "fail/ep", "repairs", "NL judged"]
    rows = []
    for r in runs:
        hat = r.pass_hat()
        row = [r.label, str(len(r.episodes)), pct(r.mean_reward), reward_interval(r)]
        row += [f"{hat[k]:.3f}" if k in hat else NONE for k in ks]
        row += [
            num(r.errors_per_episode_mean(Budget.TAU2)),
            num(r.errors_per_episode_mean(Budget.PROXY)),
            str(r.repairs),
            f"{r.judged}/{r.judged + r.unjudged}",
        ]
        rows.append(row)
    note = (
        f"reward: mean reward in points, 95% CI by bootstrap over tasks ({NO_SPREAD}: every "
        "task's mean alike; (1 task): too few to resample — no interval). tool err/ep: τ²-bench's "
        "count (tool messages with error: true); fail/ep: the proxy's budget count (every "
        "failure the agent experienced, or the tool errors when more). NL judged: episodes "
        "whose NL assertions a judge scored, of those that have them."
    )
    return Table("Runs", columns(*header), rows, note, nl_footnotes(runs))


def budget_table(runs: Sequence[RunAnalysis], budget: Budget) -> Table:
    """`budget`'s curve of every run, one row per run: mean reward at k = 0…max_errors."""
    top = max((r.max_errors for r in runs), default=0)
    header = ["run", *[f"k={k}" for k in range(top + 1)]]
    rows = []
    for r in runs:
        curve = r.curve(budget)
        rows.append(
            [
                r.label,
                *[pct(curve[k].pass_rate) if k < len(curve) else NONE for k in range(top + 1)],
            ]
        )
    note = (
        f"Mean reward (points) had each episode run with a budget of k: {budget.definition}. "
        "From one run: an episode scores its reward at k when its count stayed below k, else 0."
    )
    return Table(budget_title(budget, runs), columns(*header), rows, note)


def budget_ci_table(
    runs: Sequence[RunAnalysis], budget: Budget, comparison: CellComparison | None = None
) -> Table:
    """`budget`'s curve with 95% intervals, one row per k; with a comparison, the gap A − B (on
    the comparison's budget only)."""
    header = ["k", *[f"{r.label} [95% CI]" for r in runs]]
    gaps = comparison is not None and comparison.budget is budget
    if gaps:
        header.append("gap A − B [95% CI]")
    rows = []
    top = max((r.max_errors for r in runs), default=0)
    for k in range(top + 1):
        row = [str(k)]
        for r in runs:
            curve = r.curve(budget)
            if k < len(curve):
                point = curve[k]
                row.append(
                    f"{pct(point.pass_rate)} {NO_SPREAD}"
                    if point.ci_low == point.ci_high
                    else f"{pct(point.pass_rate)} [{pct(point.ci_low)}, {pct(point.ci_high)}]"
                )
            else:
                row.append(NONE)
        if gaps and comparison is not None:
            gap = next((g for g in comparison.gaps if g.k == k), None)
            if gap is None:
                row.append(NONE)
            elif gap.ci_low == gap.ci_high:
                row.append(f"{100 * gap.gap:+.1f} {NO_SPREAD}")
            else:
                row.append(
                    f"{100 * gap.gap:+.1f} [{100 * gap.ci_low:+.1f}, {100 * gap.ci_high:+.1f}]"
                )
        rows.append(row)
    note = (
        f"Mean reward (points) at budget k: {budget.definition}. {NO_SPREAD}: every episode "
        "(every paired difference) alike at that k, so no interval is drawn."
    )
    return Table(budget_title(budget, runs), columns(*header), rows, note)


def channel_table(runs: Sequence[RunAnalysis], comparison: CellComparison | None = None) -> Table:
    """τ²-bench's tool errors per channel: count and rate per 100 calls of each run; with a
    comparison, the rate ratio B/A with its interval."""
    header = ["channel"]
    for r in runs:
        prefix = f"{r.label}: " if len(runs) > 1 else ""
        header += [f"{prefix}count", f"{prefix}per 100 calls"]
    if comparison is not None:
        header.append("B/A [95% CI]")
    rows = []
    for channel in ErrorChannel:
        row = [channel.label]
        for r in runs:
            row += [str(r.channels()[channel]), pct(r.rate(channel), 2)]
        if comparison is not None:
            found = next(c for c in comparison.channels if c.channel is channel)
            ratio = found.ratio
            row.append(
                f"{NONE} ({found.missing})"
                if ratio is None
                else f"×{ratio.ratio:.2f} [{ratio.low:.2f}, {ratio.high:.2f}]"
                + ("*" if ratio.corrected else "")
            )
        rows.append(row)
    total = ", ".join(f"{r.label} {r.errors}" for r in runs)
    note = (
        "Every tool message with error: true in exactly one channel (τ²-bench's tool errors: "
        f"{total}); rates per 100 calls of the agent (user tool errors: of the user)."
    )
    return Table("Tool errors per channel", columns(*header), rows, note)


def experienced_tables(runs: Sequence[RunAnalysis]) -> list[Table]:
    """Per proxy channel and run: as the proxy counted it upstream (repaired failures included) →
    as it reached the agent (the trajectory checked again); counts, then per 100 agent turns."""
    valid = {c.value for c in Channel}
    present = {c.value for r in runs for c in r.experienced()}
    present |= {k for r in runs for k in r.proxy_channels() if k in valid}
    channels = [c for c in Channel if c.value in present]
    header = ["channel", *[r.label for r in runs]]
    counts, rates = [], []
    for channel in channels:
        counts.append(
            [channel.value]
            + [f"{_upstream(r, channel)} → {r.experienced()[channel]}" for r in runs]
        )
        rates.append(
            [channel.value]
            + [
                f"{_per_turn(_upstream_count(r, channel), r.proxy_requests)} → "
                f"{_per_turn(r.experienced()[channel], r.agent_turns)}"
                for r in runs
            ]
        )
    counts.append(["agent turns", *[f"{_requests(r)} → {r.agent_turns}" for r in runs]])
    sources = "; ".join(
        f"{r.label}: {', '.join(f'{n} from the {s}' for s, n in r.proxy_sources().items())}"
        for r in runs
        if r.through_proxy
    )
    note = (
        "upstream → agent: as the proxy counted it, repaired failures included → as it reached "
        "the agent (the trajectory checked again; what the proxy's budget counts). tool_error: "
        "a valid call the tool refused."
    )
    footnotes = (
        (f"Proxy figures per episode — {sources}.",)
        if sources
        else ("Not run through the proxy: upstream figures unknown (—).",)
    )
    return [
        Table("Failures the agent experienced (count)", columns(*header), counts, note, footnotes),
        Table("Failures the agent experienced (per 100 agent turns)", columns(*header), rates),
    ]


def _upstream_count(run: RunAnalysis, channel: Channel) -> int | None:
    return run.proxy_channels()[channel.value] if run.through_proxy else None


def _upstream(run: RunAnalysis, channel: Channel) -> str:
    count = _upstream_count(run, channel)
    return NONE if count is None else str(count)


def _requests(run: RunAnalysis) -> str:
    return str(run.proxy_requests) if run.through_proxy else NONE


def _per_turn(count: int | None, turns: int) -> str:
    return NONE if count is None or not turns else f"{100 * count / turns:.1f}"


def errors_table(runs: Sequence[RunAnalysis], budget: Budget) -> Table:
    """How many episodes had 0, 1, 2, … errors of `budget`'s count, one column per run."""
    per_run = [r.errors_per_episode(budget) for r in runs]
    top = max((max(c, default=0) for c in per_run), default=0)
    header = ["errors", *[r.label for r in runs]]
    rows = [[str(n), *[str(c.get(n, 0)) for c in per_run]] for n in range(top + 1)]
    what = "tool errors" if budget is Budget.TAU2 else "experienced failures"
    note = f"Episodes by their count under the {budget.label}."
    return Table(f"Episodes by {what}", columns(*header), rows, note)


def termination_table(runs: Sequence[RunAnalysis]) -> Table:
    """How the episodes of each run ended."""
    present = {reason for r in runs for reason in r.termination_reasons()}
    known: list[str] = [t.value for t in TerminationReason if t.value in present]
    reasons = known + sorted(present - set(known))
    rows = [[r.label, *[str(r.termination_reasons()[x]) for x in reasons]] for r in runs]
    return Table("Termination reasons", columns("run", *reasons), rows)


def wrong_names_table(runs: Sequence[RunAnalysis], top: int = 6) -> Table:
    """The names the agent called that are not tools (and failed), most frequent first."""
    rows = []
    for r in runs:
        names = r.wrong_tool_names().most_common(top)
        rows.append([r.label, ", ".join(f"{n} ×{c}" for n, c in names) or "none"])
    return Table("Wrong tool names", [Column("run"), Column("names")], rows)


def silent_table(run: RunAnalysis) -> Table:
    """Violations the validator found that raised no tool error (not in τ²-bench's count)."""
    rows = [[k, str(v)] for k, v in run.silent_violations().most_common()]
    return Table("Violations that raised no tool error", columns("channel", "count"), rows)


def tasks_table(run: RunAnalysis) -> Table:
    """The tasks with tool errors, the most errors first."""
    failing = sorted((t for t in run.tasks() if t.errors), key=lambda t: -t.errors)
    rows = [
        [
            t.task_id,
            str(t.episodes),
            pct(t.mean_reward),
            str(t.errors),
            ", ".join(f"{k} {v}" for k, v in t.channels.items() if v),
        ]
        for t in failing
    ]
    header = [Column("task"), *columns("episodes", "mean reward", "tool errors", text=0)]
    return Table("Tasks with tool errors", [*header, Column("channels")], rows)


# -- comparisons -----------------------------------------------------------------------------


def compare_table(comparisons: Sequence[CellComparison]) -> Table:
    """One row per cell: scores, the difference with its interval and tests, then the paper's
    statistics over wrong tool names (rank correlation, novel share) before the (task, channel)
    ones."""
    header = [
        "cell",
        "A",
        "B",
        "pairs",
        "A score",
        "B score",
        "B − A [95% CI]",
        "p (Holm)",
        "TOST p",
        "ρ wrong names",
        "novel wrong names %",
        "ρ task×channel",
        "novel task×channel %",
        "largest gap",
    ]
    rows = []
    for c in comparisons:
        gap = c.largest_gap()
        rows.append(
            [
                c.name,
                c.a.label,
                c.b.label,
                str(c.pairs),
                pct(c.a_score),
                pct(c.b_score),
                f"{100 * c.difference:+.1f} "
                + (
                    "(no interval)"
                    if c.score_missing
                    else f"[{100 * c.ci[0]:+.1f}, {100 * c.ci[1]:+.1f}]"
                ),
                p_value(c.p_holm),
                NONE if c.tost is None else p_value(c.tost.p),
                *signature_cells(c.wrong_names),
                *signature_cells(c.task_channels),
                NONE if gap is None else f"{100 * gap.gap:.1f} at k={gap.k}",
            ]
        )
    return Table("Comparison", columns(*header, text=3), rows)


def signature_cells(stats: SignatureStatistics) -> list[str]:
    """ρ and the novel share with their intervals whenever they can be computed (with a warning
    under `MIN_SIGNATURE_FAILURES` a side), or in words why there are none."""
    if stats.correlation is None:
        return [stats.too_few() if not stats.enough else str(stats.missing()), NONE]
    rho = num(stats.correlation)
    if stats.correlation_ci is not None:
        rho += f" [{num(stats.correlation_ci[0])}, {num(stats.correlation_ci[1])}]"
    else:
        rho += " (no interval)"
    if not stats.enough:
        rho += f" — warning: few failures (A {stats.a_failures}, B {stats.b_failures})"
    novel = pct(stats.novel)
    if stats.novel_ci is not None:
        novel += f" [{pct(stats.novel_ci[0])}, {pct(stats.novel_ci[1])}]"
    return [rho, novel]


def figures_table(comparison: CellComparison) -> Table:
    """One cell's figures as (figure, value) rows, for the terminal."""
    table = compare_table([comparison])
    (row,) = table.rows
    figures = dict(zip(table.headers, row, strict=True))
    del figures["cell"]
    figures["pairs"] += f" (unpaired: A {comparison.unmatched_a}, B {comparison.unmatched_b})"
    figures["TOST p"] += f" (±{100 * comparison.margin:g} points)"
    figures["largest gap"] += f" ({comparison.budget.label})"
    return Table(
        comparison.name, [Column("figure"), Column("value")], [[k, v] for k, v in figures.items()]
    )
