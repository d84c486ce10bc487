"""What a replay shows, arm by arm — the tables of `evalkit.analysis.figure_tables` over each arm's
analysed results, the same ones `evalkit analyze` and `report` print for those files — and a
headline in sentences, rendered to Markdown (`summary.md`) or to the terminal.

Every figure here comes from `evalkit.analysis`: a replay runs through the proxy, so its
headline quotes the proxy's experienced-failure budget curve (the budget the episodes ran under);
the τ²-bench tool-error budget curve is shown beside it, each table titled with its budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from evalkit.analysis.channels import DeclaredTools
from evalkit.analysis.figure_tables import (
    budget_order,
    budget_table,
    experienced_tables,
    nl_footnotes,
    pct,
    runs_table,
    termination_table,
    wrong_names_table,
)
from evalkit.analysis.load import DomainData, analyze_results
from evalkit.analysis.run import RunAnalysis
from evalkit.analysis.table import Table
from evalkit.formats import Results
from evalkit.replay import Replay
from evalkit.wire import API_TITLES
from proxy.guard.repair import RepairMode
from proxy.guard.toolcheck import compile_tools

SUMMARY: Final = "summary.md"


def tables(runs: Sequence[RunAnalysis]) -> list[Table]:
    """Every table of a replay summary, in reading order."""
    return [
        runs_table(runs),
        *[budget_table(runs, budget) for budget in budget_order(runs)],
        *experienced_tables(runs),
        wrong_names_table(runs),
        termination_table(runs),
    ]


def headline(arms: Sequence[tuple[str, str | None]], runs: Sequence[RunAnalysis]) -> list[str]:
    """What the run shows, in sentences: each model against the first at the run's budget and
    at a budget of 2, without repair; then what repair recovers at 2. Every figure is a point of
    a run's own budget curve (`RunAnalysis.at_budget`), the curve the budget is named by.

    `arms` gives each run's (model or profile, repair mode), in the same order.
    """
    by_key = {key: r for key, r in zip(arms, runs, strict=True) if r.episodes}
    labels = list(dict.fromkeys(label for label, _ in arms))
    lines = []
    plain = [r for r in dict.fromkeys(r for _, r in arms) if r != RepairMode.REASK]
    base_mode = plain[0] if plain else RepairMode.REASK
    reference = by_key.get((labels[0], base_mode))
    if reference is None:
        return list(nl_footnotes(runs))
    top, budget = reference.max_errors, reference.budget
    tight = min(2, top)
    lines.append(
        f"Figures at each max_errors below: the {budget.label} curve, the budget these "
        "episodes ran under."
    )
    for label in labels[1:]:
        other = by_key.get((label, base_mode))
        if other is None:
            continue
        lines.append(
            f"{label} against {labels[0]}: {_at(other, top)}% vs {_at(reference, top)}% at "
            f"max_errors {top} ({_points(other, reference, top)}); {_at(other, tight)}% vs "
            f"{_at(reference, tight)}% at max_errors {tight} ({_points(other, reference, tight)});"
            f" {other.errors_per_episode_mean(budget):.2f} failures per episode against "
            f"{reference.errors_per_episode_mean(budget):.2f}."
        )
    if base_mode != RepairMode.REASK:
        for label in labels:
            without, repaired = (
                by_key.get((label, base_mode)),
                by_key.get((label, RepairMode.REASK)),
            )
            if without is None or repaired is None:
                continue
            line = (
                f"repair for {label} at max_errors {tight}: {_at(without, tight)}% → "
                f"{_at(repaired, tight)}% ({repaired.repairs} repairs)"
            )
            if label != labels[0]:
                line += f"; {labels[0]} without repair: {_at(reference, tight)}%"
            lines.append(line + ".")
    lines += nl_footnotes(runs)
    return lines


def _at(run: RunAnalysis, k: int) -> str:
    return pct(run.at_budget(k))


def _points(a: RunAnalysis, b: RunAnalysis, k: int) -> str:
    return f"{100 * (a.at_budget(k) - b.at_budget(k)):+.1f} points"


def markdown(
    title: str,
    preamble: Sequence[str],
    arms: Sequence[tuple[str, str | None]],
    runs: Sequence[RunAnalysis],
) -> str:
    """The whole summary as Markdown (`summary.md`); `arms` as for `headline`."""
    parts = [f"# {title}", "", *preamble, ""]
    lines = headline(arms, runs)
    if lines:
        parts += ["## Headline", "", *[f"- {line}" for line in lines], ""]
    parts += [t.markdown() for t in tables(runs)]
    return "\n".join(parts)


# -- a replay's summary ---------------------------------------------------------------------


def replay_tools(replay: Replay) -> DeclaredTools:
    """The agent's declared tools in `replay`, compiled for the analysis."""
    agent_tools, _ = replay.domain.toolkit_classes()
    return DeclaredTools(
        compile_tools(agent_tools.openai_tools()), f"{replay.domain.name} tools (this replay)"
    )


def summarize_replay(replay: Replay) -> list[RunAnalysis]:
    """The analysis of every arm of `replay`, from the episodes it finished, with the domain's
    tool schemas: what `evalkit analyze` gives for each arm's results file."""
    declared = replay_tools(replay)

    def tools(domain: str, results: Results) -> DeclaredTools:
        return declared

    data = DomainData(loaded=[replay.domain])
    runs = []
    for arm in replay.arms:
        path = replay.runs[arm.name].path
        runs.extend(analyze_results([(path, replay.results(arm))], tools=tools, data=data))
    return runs


def arm_keys(replay: Replay) -> list[tuple[str, str | None]]:
    """Each arm's (profile or model, repair mode), for `headline`."""
    return [(a.profile or a.model, a.repair) for a in replay.arms]


def replay_preamble(replay: Replay) -> list[str]:
    """What was run, in two sentences."""
    options = replay.options
    done = sum(len(r.simulations) for r in replay.runs.values())
    what = (
        f"Domain {options.domain}: {len(replay.tasks)} tasks × {options.trials} trial(s) × "
        f"{len(replay.arms)} arm(s) = {done} of {replay.total()} episodes, max_errors "
        f"{options.max_errors}, seed {options.seed}, {options.user} user, the agent speaking "
        f"{API_TITLES[options.api]}."
    )
    if options.embedded:
        who = (
            "Agent: evalkit's simulated upstream (damage profiles "
            f"{', '.join(replay.profiles)}; a model of failure dynamics, not a real model) behind "
            "the toolsentry proxy, both started in-process."
        )
    else:
        who = f"Agent: model {options.model} at {options.base_url}."
    if options.judge_model:
        judged = f"NL assertions judged by {options.judge_model} at {options.judge_base_url}."
    else:
        judged = "NL assertions not judged (no --judge-base-url): left out of the rewards."
    return [what, "", who, "", judged]


def write_summary(replay: Replay, runs: Sequence[RunAnalysis]) -> Path:
    """Write `DIR/summary.md`; returns its path."""
    title = f"evalkit replay — {replay.options.domain}"
    text = markdown(title, replay_preamble(replay), arm_keys(replay), runs)
    path = replay.out / SUMMARY
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
