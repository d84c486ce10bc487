"""The analysis of one run: its episodes' failures summed per channel, per task and per episode,
the distribution of errors per episode, termination reasons, wrong tool names, the mean reward
with its interval, pass^k, and a budget curve for each of the two budgets (`budget.py`). Built
from classified episodes (`channels.py`); pure.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evalkit.analysis.budget import Budget, BudgetPoint, budget_curve
from evalkit.analysis.channels import EpisodeFailures, ErrorChannel, NLScoring, count_channels
from evalkit.analysis.stats import DEFAULT_RESAMPLES, cluster_bootstrap_ci
from evalkit.scoring import is_success, pass_hat_k
from proxy.guard import Channel

DEFAULT_MAX_ERRORS = 10  # τ²-bench's default, for files that do not record theirs


@dataclass(frozen=True, slots=True)
class TaskSummary:
    """One task's episodes in a run."""

    task_id: str
    episodes: int
    mean_reward: float
    errors: int
    channels: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {
            "task_id": self.task_id,
            "episodes": self.episodes,
            "mean_reward": self.mean_reward,
            "errors": self.errors,
            "channels": self.channels,
        }


@dataclass(frozen=True)
class RunAnalysis:
    """One run (one domain, one agent model; any number of files and trials).

    `max_errors` is the budget the episodes ran at (the smallest one when files differ);
    `budget` is how they were budgeted (the proxy's budget when the run went through the proxy,
    else τ²-bench's): the curve a headline quotes. `curves` holds both budgets' curves;
    `reward_ci` the bootstrap interval of the mean reward (tasks resampled), None where
    `reward_ci_missing` says why there is none;
    `schema_source` says where the agent's tool schemas came from (None: from error texts).
    """

    label: str
    domain: str
    model: str
    max_errors: int
    episodes: tuple[EpisodeFailures, ...]
    curves: Mapping[Budget, tuple[BudgetPoint, ...]]
    budget: Budget = Budget.TAU2
    reward_ci: tuple[float, float] | None = None
    schema_source: str | None = None
    sources: tuple[str, ...] = field(default_factory=tuple)
    warnings: tuple[str, ...] = field(default_factory=tuple)

    # -- figures ---------------------------------------------------------------------------

    @property
    def budget_curve(self) -> tuple[BudgetPoint, ...]:
        """The curve of the budget the run was budgeted with (`budget`)."""
        return self.curves[self.budget]

    def curve(self, budget: Budget) -> tuple[BudgetPoint, ...]:
        """The curve of `budget`."""
        return self.curves[budget]

    def at_budget(self, k: int, budget: Budget | None = None) -> float:
        """The mean reward at budget `k` on `budget`'s curve (default: the run's own budget).

        Raises:
            ValueError: when `k` is outside 0…max_errors.
        """
        curve = self.curves[budget or self.budget]
        if not 0 <= k < len(curve):
            raise ValueError(f"budget {k} is outside 0…{self.max_errors}")
        return curve[k].pass_rate

    @property
    def mean_reward(self) -> float:
        """The mean recorded reward (0 for an empty run)."""
        if not self.episodes:
            return 0.0
        return math.fsum(e.reward for e in self.episodes) / len(self.episodes)

    @property
    def successes(self) -> int:
        """Episodes with reward ≈ 1."""
        return sum(1 for e in self.episodes if is_success(e.reward))

    def pass_hat(self) -> dict[int, float]:
        """pass^k for k = 1 … the fewest trials of any task (τ²-bench's definition)."""
        by_task: dict[str, list[float]] = {}
        for episode in self.episodes:
            by_task.setdefault(episode.task_id, []).append(episode.reward)
        trials = min((len(r) for r in by_task.values()), default=0)
        return {k: pass_hat_k(by_task, k) for k in range(1, trials + 1)}

    def errors_of(self, budget: Budget) -> list[int]:
        """Each episode's count under `budget`, in episode order."""
        return [e.errors_for(budget) for e in self.episodes]

    def errors_per_episode_mean(self, budget: Budget) -> float:
        """The mean count per episode under `budget` (0 for an empty run)."""
        counts = self.errors_of(budget)
        return sum(counts) / len(counts) if counts else 0.0

    @property
    def errors(self) -> int:
        """All recorded tool errors."""
        return sum(e.errors for e in self.episodes)

    @property
    def agent_calls(self) -> int:
        return sum(e.agent_calls for e in self.episodes)

    @property
    def user_calls(self) -> int:
        return sum(e.user_calls for e in self.episodes)

    def channels(self) -> Counter[ErrorChannel]:
        """Failures per channel (every recorded error in exactly one)."""
        return count_channels(self.episodes)

    def calls_for(self, channel: ErrorChannel) -> int:
        """The calls a channel's rate is measured against (the agent's, or the user's)."""
        return self.user_calls if channel.side == "user" else self.agent_calls

    def rate(self, channel: ErrorChannel) -> float | None:
        """Failures of `channel` per call of its side; None when that side made no call."""
        calls = self.calls_for(channel)
        return self.channels()[channel] / calls if calls else None

    @property
    def judged(self) -> int:
        """Episodes whose NL assertions a judge scored."""
        return sum(1 for e in self.episodes if e.nl_assertions is NLScoring.JUDGED)

    @property
    def unjudged(self) -> int:
        """Episodes scored without their NL assertions (no judge was given)."""
        return sum(1 for e in self.episodes if e.nl_assertions is NLScoring.NOT_EVALUATED)

    @property
    def agent_turns(self) -> int:
        """The agent's turns (assistant messages after the greeting)."""
        return sum(e.agent_turns for e in self.episodes)

    def experienced(self) -> Counter[Channel]:
        """Failures the agent experienced per proxy channel (what the proxy's budget counts)."""
        total: Counter[Channel] = Counter()
        for episode in self.episodes:
            total.update(episode.experienced())
        return total

    @property
    def through_proxy(self) -> bool:
        """Whether any episode carries the proxy's own accounting."""
        return any(e.proxy is not None for e in self.episodes)

    @property
    def proxy_requests(self) -> int:
        """Requests the proxy reported over the run."""
        return sum(e.proxy.requests for e in self.episodes if e.proxy is not None)

    def proxy_sources(self) -> Counter[str]:
        """Where the proxy's figures of each episode came from (session record, headers)."""
        return Counter(e.proxy.source for e in self.episodes if e.proxy is not None)

    def errors_per_episode(self, budget: Budget = Budget.TAU2) -> dict[int, int]:
        """How many episodes had 0, 1, 2, … errors under `budget` (every count up to the
        largest)."""
        counts = Counter(self.errors_of(budget))
        top = max(counts, default=-1)
        return {n: counts[n] for n in range(top + 1)}

    def termination_reasons(self) -> Counter[str]:
        return Counter(e.termination_reason for e in self.episodes)

    def wrong_tool_names(self) -> Counter[str]:
        """The names the agent called that are not tools, with how often."""
        total: Counter[str] = Counter()
        for episode in self.episodes:
            total.update(episode.wrong_tool_names())
        return total

    def silent_violations(self) -> Counter[str]:
        """Violations the validator found that raised no tool error, per proxy channel."""
        return Counter(v.channel.value for e in self.episodes for v in e.silent)

    def proxy_channels(self) -> Counter[str]:
        """Violations the proxy reported per channel (repaired ones included), from the
        simulations' `toolsentry` blocks; empty for runs that did not go through the proxy."""
        total: Counter[str] = Counter()
        for episode in self.episodes:
            total.update(episode.proxy_channels)
        return total

    @property
    def repairs(self) -> int:
        """Repairs the proxy reported over the run."""
        return sum(e.repairs for e in self.episodes)

    def tasks(self) -> list[TaskSummary]:
        """Per-task summaries, in order of first appearance."""
        grouped: dict[str, list[EpisodeFailures]] = {}
        for episode in self.episodes:
            grouped.setdefault(episode.task_id, []).append(episode)
        return [
            TaskSummary(
                task_id=task_id,
                episodes=len(episodes),
                mean_reward=math.fsum(e.reward for e in episodes) / len(episodes),
                errors=sum(e.errors for e in episodes),
                channels=_named(count_channels(episodes)),
            )
            for task_id, episodes in grouped.items()
        ]

    @property
    def reward_ci_missing(self) -> str | None:
        """Why the mean reward has no interval, in words (None: it has one)."""
        return reward_interval_missing(self.episodes)

    # -- output ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON of `evalkit analyze --json`: the figures first, then the breakdowns."""
        return {
            "episodes": len(self.episodes),
            "mean_reward": self.mean_reward,
            "channels": _named(self.channels()),
            "budget_curve": [p.to_dict() for p in self.budget_curve],
            "termination_reasons": dict(self.termination_reasons().most_common()),
            "reward_ci": None if self.reward_ci is None else list(self.reward_ci),
            "reward_ci_missing": self.reward_ci_missing,
            "budget": self.budget.value,
            "budget_curves": {b.value: [p.to_dict() for p in self.curves[b]] for b in Budget},
            "pass_hat": {str(k): v for k, v in self.pass_hat().items()},
            "nl_assertions": {"judged": self.judged, "unjudged": self.unjudged},
            "label": self.label,
            "domain": self.domain,
            "model": self.model,
            "max_errors": self.max_errors,
            "errors": self.errors,
            "tool_calls": {"assistant": self.agent_calls, "user": self.user_calls},
            "rates": {c.value: self.rate(c) for c in ErrorChannel},
            "errors_per_episode": {str(n): c for n, c in self.errors_per_episode().items()},
            "experienced": {c.value: n for c, n in self.experienced().most_common()},
            "wrong_tool_names": dict(self.wrong_tool_names().most_common()),
            "silent_violations": dict(self.silent_violations().most_common()),
            "proxy": {
                "channels": dict(self.proxy_channels().most_common()),
                "repairs": self.repairs,
                "requests": self.proxy_requests,
                "sources": dict(self.proxy_sources()),
            },
            "schema_source": self.schema_source,
            "warnings": list(self.warnings),
            "sources": list(self.sources),
            "tasks": [t.to_dict() for t in self.tasks()],
            "per_episode": [
                {
                    "simulation_id": e.simulation_id,
                    "task_id": e.task_id,
                    "trial": e.trial,
                    "reward": e.reward,
                    "termination_reason": e.termination_reason,
                    "errors": e.errors,
                    "experienced": e.errors_for(Budget.PROXY),
                    "channels": _named(e.channels()),
                }
                for e in self.episodes
            ],
        }


def _named(counts: Counter[ErrorChannel]) -> dict[str, int]:
    """Every channel by name, in the channels' order, zeros included."""
    return {c.value: counts[c] for c in ErrorChannel}


def analyze_episodes(
    episodes: Sequence[EpisodeFailures],
    *,
    max_errors: int = DEFAULT_MAX_ERRORS,
    budget: Budget | None = None,
    label: str = "",
    domain: str = "",
    model: str = "",
    schema_source: str | None = None,
    sources: Sequence[str] = (),
    warnings: Sequence[str] = (),
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> RunAnalysis:
    """Analyse classified episodes that ran at budget `max_errors`.

    `budget` is how the episodes were budgeted; by default the proxy's when any episode went
    through the proxy, else τ²-bench's. The bootstraps (both budget curves and the mean
    reward) keep each task's episodes together.

    Raises:
        ValueError: when `max_errors` is negative.
    """
    if max_errors < 0:
        raise ValueError(f"max_errors must be ≥ 0, got {max_errors}")
    rewards = [e.reward for e in episodes]
    tasks = [e.task_id for e in episodes]
    curves = {
        b: tuple(
            budget_curve(
                rewards,
                [e.errors_for(b) for e in episodes],
                max_errors,
                tasks,
                confidence=confidence,
                resamples=resamples,
                seed=seed,
            )
        )
        for b in Budget
    }
    if budget is None:
        budget = Budget.PROXY if any(e.proxy is not None for e in episodes) else Budget.TAU2
    reward_ci = None
    if reward_interval_missing(episodes) is None:
        low, high = cluster_bootstrap_ci(
            rewards, tasks, confidence=confidence, resamples=resamples, seed=seed
        )
        reward_ci = (float(low[0]), float(high[0]))
    return RunAnalysis(
        label=label,
        domain=domain,
        model=model,
        max_errors=max_errors,
        episodes=tuple(episodes),
        curves=curves,
        budget=budget,
        reward_ci=reward_ci,
        schema_source=schema_source,
        sources=tuple(sources),
        warnings=tuple(warnings),
    )


def reward_interval_missing(episodes: Sequence[EpisodeFailures]) -> str | None:
    """Why the mean reward of `episodes` has no bootstrap interval, in a few words: no
    episodes, fewer than two tasks (a resample of one task is itself), or every task's mean
    reward alike (every resample the same mean: a point, not an interval); None when it has one.
    """
    per_task: dict[str, list[float]] = {}
    for episode in episodes:
        per_task.setdefault(episode.task_id, []).append(episode.reward)
    if not per_task:
        return "no episodes"
    if len(per_task) < 2:
        return "1 task; an interval needs two or more"
    means = {math.fsum(rewards) / len(rewards) for rewards in per_task.values()}
    if len(means) == 1:
        return f"every task's mean reward is {100 * means.pop():.1f}: no spread to resample"
    return None
