"""What a replay shows, arm by arm: pass rate with a 95% CI, pass^k, failure channels as the proxy
counted them and as they reached the agent, repairs, errors per episode, the budget curve and the
termination reasons — as plain tables, rendered to Markdown (`summary.md`) or to the terminal.

Channels are counted twice on purpose. The proxy's accounting (its session record, else the
`x-toolsentry-*` headers kept on each turn) counts every failure of the upstream, repaired ones
included; the trajectory, checked again with `proxy.guard.toolcheck.validate`, shows what reached
the agent. The difference is what repair removed.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from rich import box
from rich.table import Table as RichTable

from evalkit.agent import to_openai_messages
from evalkit.formats import Results, SimulationRun
from evalkit.messages import AssistantMessage, ToolMessage
from evalkit.replay import Replay, budget_curve, episode_errors, reward_of
from evalkit.scoring import is_success, pass_hat_k
from proxy.guard.toolcheck import validate

Z_95: Final = 1.959964
SUMMARY: Final = "summary.md"
TOOL_ERROR: Final = "tool_error"
CHANNEL_ORDER: Final[tuple[str, ...]] = (
    "unknown_tool",
    "malformed_arguments",
    "schema_violation",
    "leaked_tool_call",
    "tool_choice_violation",
    "truncated",
    "empty_response",
    TOOL_ERROR,
    "upstream_error",
)
TERMINATION_ORDER: Final[tuple[str, ...]] = (
    "user_stop",
    "agent_stop",
    "too_many_errors",
    "max_steps",
    "agent_error",
    "user_error",
    "infrastructure_error",
)


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default); (0, 0) for n = 0."""
    if n == 0:
        return 0.0, 0.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class ArmSummary:
    """The numbers of one arm of a replay."""

    arm: str
    episodes: int
    passes: int
    ci: tuple[float, float]
    pass_hat: dict[int, float]
    proxy_channels: dict[str, int]
    proxy_turns: int
    agent_channels: dict[str, int]
    agent_turns: int
    repairs: int
    errors: list[int]
    budget: list[float]
    terminations: dict[str, int]
    wrong_names: dict[str, int] = field(default_factory=dict)

    @property
    def pass_rate(self) -> float:
        """Passed episodes over episodes (0 for none)."""
        return self.passes / self.episodes if self.episodes else 0.0

    @property
    def errors_per_episode(self) -> float:
        """The mean of `episode_errors` over the episodes."""
        return sum(self.errors) / len(self.errors) if self.errors else 0.0


def summarize(
    arm: str, results: Results, tools: list[dict[str, Any]], max_errors: int
) -> ArmSummary:
    """The summary of one arm's results; `tools` are the agent's declared tools."""
    simulations = results.simulations
    passes = sum(1 for s in simulations if is_success(reward_of(s)))
    by_task: dict[str, list[float]] = {}
    for s in simulations:
        by_task.setdefault(s.task_id, []).append(reward_of(s))
    trials = min((len(r) for r in by_task.values()), default=0)
    pass_hat = {k: pass_hat_k(by_task, k) for k in range(1, trials + 1)}

    proxy: Counter[str] = Counter()
    agent: Counter[str] = Counter()
    names: Counter[str] = Counter()
    proxy_turns = agent_turns = repairs = 0
    for s in simulations:
        counted, turns, repaired = proxy_accounting(s)
        proxy.update(counted)
        proxy_turns += turns
        repairs += repaired
        seen, turns, wrong = trajectory_channels(s, tools)
        agent.update(seen)
        agent_turns += turns
        names.update(wrong)
    return ArmSummary(
        arm=arm,
        episodes=len(simulations),
        passes=passes,
        ci=wilson_interval(passes, len(simulations)),
        pass_hat=pass_hat,
        proxy_channels=dict(proxy),
        proxy_turns=proxy_turns,
        agent_channels=dict(agent),
        agent_turns=agent_turns,
        repairs=repairs,
        errors=[episode_errors(s) for s in simulations],
        budget=budget_curve(simulations, max_errors),
        terminations=dict(Counter(s.termination_reason for s in simulations)),
        wrong_names=dict(names.most_common()),
    )


def proxy_accounting(simulation: SimulationRun) -> tuple[dict[str, int], int, int]:
    """The proxy's channel counts, requests and repairs for one episode.

    From its session record when the run fetched one, else from the headers of each turn (one
    per channel per turn: a lower bound). Returns empty counts for a run without a proxy.
    """
    block = simulation.toolsentry or {}
    record = block.get("proxy_session")
    if isinstance(record, dict) and isinstance(record.get("channels"), dict):
        channels = {str(k): int(v) for k, v in record["channels"].items()}
        return channels, int(record.get("requests") or 0), int(record.get("repairs") or 0)
    channels = {str(k): int(v) for k, v in (block.get("channels") or {}).items()}
    turns = block.get("turns") or []
    # x-toolsentry-repairs counts the repairs of its own response.
    repairs = sum(_count(t.get("headers", {}).get("x-toolsentry-repairs")) for t in turns)
    return channels, len(turns), repairs


def _count(value: object) -> int:
    return int(value) if isinstance(value, str) and value.isdigit() else 0


def trajectory_channels(
    simulation: SimulationRun, tools: list[dict[str, Any]]
) -> tuple[dict[str, int], int, list[str]]:
    """The failures that reached the agent in one episode, checked against `tools`.

    Returns the channel counts, the number of agent turns (assistant messages after the
    greeting) and the unknown tool names the agent called. `tool_error` counts the error answers
    to calls without a violation (a valid call the tool refused), as the proxy counts them: a
    failure already counted on its channel is not counted again.
    """
    channels: Counter[str] = Counter()
    wrong: list[str] = []
    turns = 0
    invalid: set[str] = set()
    for position, message in enumerate(simulation.messages):
        if not isinstance(message, AssistantMessage) or position == 0:
            continue
        turns += 1
        for violation in validate(to_openai_messages(None, [message])[0], tools):
            channels[violation.channel.value] += 1
            if violation.call_id:
                invalid.add(violation.call_id)
            if violation.channel.value == "unknown_tool" and violation.tool_name:
                wrong.append(violation.tool_name)
    channels[TOOL_ERROR] += sum(
        1
        for m in simulation.messages
        if isinstance(m, ToolMessage)
        and m.error
        and m.requestor == "assistant"
        and m.id not in invalid
    )
    if not channels[TOOL_ERROR]:
        del channels[TOOL_ERROR]
    return dict(channels), turns, wrong


# -- tables -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """A plain table: rendered as Markdown or for the terminal."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""
    left: int = 1  # columns of text, aligned left; the rest are numbers

    def markdown(self) -> str:
        """The table as a Markdown section."""
        lines = [f"## {self.title}", ""]
        if self.note:
            lines += [self.note, ""]
        lines.append("| " + " | ".join(self.headers) + " |")
        lines.append(
            "|" + "|".join(" --- " if i == 0 else " ---: " for i in range(len(self.headers))) + "|"
        )
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"

    def rich(self) -> RichTable:
        """The table for a rich console: compact, so that a whole summary fits one screen."""
        table = RichTable(
            title=self.title,
            title_justify="left",
            title_style="bold",
            box=box.SIMPLE_HEAD,
            padding=(0, 1),
            pad_edge=False,
        )
        for i, header in enumerate(self.headers):
            table.add_column(header, justify="left" if i < self.left else "right", no_wrap=i == 0)
        for row in self.rows:
            table.add_row(*row)
        return table


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def pass_table(summaries: Sequence[ArmSummary]) -> Table:
    """Pass rate, CI, pass^k, errors per episode and repairs per arm."""
    ks = sorted({k for s in summaries for k in s.pass_hat})
    headers = ["arm", "n", "pass %", "95% CI", *[f"pass^{k}" for k in ks]]
    headers += ["err/ep", "max err", "repairs"]
    rows = []
    for s in summaries:
        low, high = s.ci
        row = [s.arm, str(s.episodes), _pct(s.pass_rate), f"{_pct(low)}–{_pct(high)}"]
        row += [f"{s.pass_hat[k]:.3f}" if k in s.pass_hat else "—" for k in ks]
        row += [f"{s.errors_per_episode:.2f}", str(max(s.errors, default=0)), str(s.repairs)]
        rows.append(row)
    return Table("Pass rate", headers, rows)


def budget_table(summaries: Sequence[ArmSummary], max_errors: int) -> Table:
    """The budget curve of every arm: pass % at error budget k = 0…max_errors."""
    headers = ["arm", *[f"k={k}" for k in range(max_errors + 1)]]
    rows = [[s.arm, *[f"{100 * v:.0f}" for v in s.budget]] for s in summaries]
    note = (
        f"Pass % had the episodes run with an error budget of k (one run at {max_errors}: "
        "an episode passes at k when it passed with fewer than k errors)."
    )
    return Table("Budget curve", headers, rows, note)


def channel_tables(summaries: Sequence[ArmSummary]) -> list[Table]:
    """Per channel and arm, upstream (as the proxy counted) → reached the agent: counts, then
    rates in % of agent turns."""
    present = {c for s in summaries for c in (*s.proxy_channels, *s.agent_channels)}
    channels = [c for c in CHANNEL_ORDER if c in present]
    channels += sorted(present - set(CHANNEL_ORDER))
    headers = ["channel", *[s.arm for s in summaries]]
    counts, rates = [], []
    for channel in channels:
        counts.append(
            [channel]
            + [
                f"{s.proxy_channels.get(channel, 0)} → {s.agent_channels.get(channel, 0)}"
                for s in summaries
            ]
        )
        rates.append(
            [channel]
            + [
                f"{_rate(s.proxy_channels.get(channel, 0), s.proxy_turns)} → "
                f"{_rate(s.agent_channels.get(channel, 0), s.agent_turns)}"
                for s in summaries
            ]
        )
    counts.append(["agent turns", *[f"{s.proxy_turns} → {s.agent_turns}" for s in summaries]])
    note = (
        "upstream → agent: as the proxy counted it, repaired failures included → as it reached "
        "the agent (the trajectory checked again). tool_error: a valid call the tool refused."
    )
    return [
        Table("Failure channels (count)", headers, counts, note),
        Table("Failure channels (% of agent turns)", headers, rates),
    ]


def _rate(count: int, turns: int) -> str:
    return f"{100 * count / turns:.1f}" if turns else "—"


def termination_table(summaries: Sequence[ArmSummary]) -> Table:
    """How the episodes of each arm ended."""
    present = {r for s in summaries for r in s.terminations}
    reasons = [r for r in TERMINATION_ORDER if r in present] + sorted(
        present - set(TERMINATION_ORDER)
    )
    headers = ["arm", *reasons]
    rows = [[s.arm, *[str(s.terminations.get(r, 0)) for r in reasons]] for s in summaries]
    return Table("Termination reasons", headers, rows)


def wrong_names_table(summaries: Sequence[ArmSummary], top: int = 6) -> Table:
    """The unknown tool names that reached the agent, most frequent first, per arm."""
    rows = []
    for s in summaries:
        shown = ", ".join(f"{name} ×{count}" for name, count in list(s.wrong_names.items())[:top])
        rows.append([s.arm, shown or "—"])
    return Table("Unknown tool names that reached the agent", ["arm", "names"], rows, left=2)


def headline(
    arms: Sequence[tuple[str, str | None]], summaries: Sequence[ArmSummary], max_errors: int
) -> list[str]:
    """What the run shows, in sentences: each model against the first at the run's budget and
    at a budget of 2, without repair; then what repair recovers at 2.

    `arms` gives each summary's (model or profile, repair mode), in the same order.
    """
    by_key = {key: s for key, s in zip(arms, summaries, strict=True) if s.budget}
    labels = list(dict.fromkeys(label for label, _ in arms))
    tight = min(2, max_errors)
    lines = []
    plain = [r for r in dict.fromkeys(r for _, r in arms) if r != "reask"]
    base_mode = plain[0] if plain else "reask"
    reference = by_key.get((labels[0], base_mode))
    for label in labels[1:]:
        other = by_key.get((label, base_mode))
        if reference is None or other is None:
            continue
        lines.append(
            f"{label} against {labels[0]}: {_pct(other.budget[max_errors])}% vs "
            f"{_pct(reference.budget[max_errors])}% at max_errors {max_errors} "
            f"({_points(other, reference, max_errors)}); {_pct(other.budget[tight])}% vs "
            f"{_pct(reference.budget[tight])}% at max_errors {tight} "
            f"({_points(other, reference, tight)}); {other.errors_per_episode:.2f} errors per "
            f"episode against {reference.errors_per_episode:.2f}."
        )
    if base_mode != "reask":
        for label in labels:
            without, repaired = by_key.get((label, base_mode)), by_key.get((label, "reask"))
            if without is None or repaired is None:
                continue
            line = (
                f"repair for {label} at max_errors {tight}: {_pct(without.budget[tight])}% → "
                f"{_pct(repaired.budget[tight])}% ({repaired.repairs} repairs)"
            )
            if reference is not None and label != labels[0]:
                line += f"; {labels[0]} without repair: {_pct(reference.budget[tight])}%"
            lines.append(line + ".")
    return lines


def _points(a: ArmSummary, b: ArmSummary, k: int) -> str:
    return f"{100 * (a.budget[k] - b.budget[k]):+.1f} points"


def tables(summaries: Sequence[ArmSummary], max_errors: int) -> list[Table]:
    """Every table of a replay summary, in reading order."""
    return [
        pass_table(summaries),
        budget_table(summaries, max_errors),
        *channel_tables(summaries),
        wrong_names_table(summaries),
        termination_table(summaries),
    ]


def markdown(
    title: str,
    preamble: Sequence[str],
    arms: Sequence[tuple[str, str | None]],
    summaries: Sequence[ArmSummary],
    max_errors: int,
) -> str:
    """The whole summary as Markdown (`summary.md`); `arms` as for `headline`."""
    parts = [f"# {title}", "", *preamble, ""]
    lines = headline(arms, summaries, max_errors)
    if lines:
        parts += ["## Headline", "", *[f"- {line}" for line in lines], ""]
    parts += [t.markdown() for t in tables(summaries, max_errors)]
    return "\n".join(parts)


# -- a replay's summary ---------------------------------------------------------------------


def summarize_replay(replay: Replay) -> list[ArmSummary]:
    """The summary of every arm of `replay`, from the episodes it finished."""
    tools, _ = replay.domain.toolkit_classes()
    declared = tools.openai_tools()
    return [
        summarize(arm.name, replay.results(arm), declared, replay.options.max_errors)
        for arm in replay.arms
    ]


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
        f"{options.max_errors}, seed {options.seed}, {options.user} user."
    )
    if options.embedded:
        who = (
            "Agent: evalkit's simulated upstream (damage profiles "
            f"{', '.join(replay.profiles)}; a model of failure dynamics, not a real model) behind "
            "the toolsentry proxy, both started in-process."
        )
    else:
        who = f"Agent: model {options.model} at {options.base_url}."
    return [what, "", who]


def write_summary(replay: Replay, summaries: Sequence[ArmSummary]) -> Path:
    """Write `DIR/summary.md`; returns its path."""
    title = f"evalkit replay — {replay.options.domain}"
    text = markdown(
        title, replay_preamble(replay), arm_keys(replay), summaries, replay.options.max_errors
    )
    path = replay.out / SUMMARY
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
