"""The analysis of one run: its episodes' failures summed per channel, per task and per episode,
the distribution of errors per episode, termination reasons, wrong tool names and the budget
curve. Built from classified episodes (`channels.py`); pure.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from evalkit.analysis.budget import BudgetPoint, budget_curve
from evalkit.analysis.channels import EpisodeFailures, ErrorChannel, count_channels
from evalkit.analysis.stats import DEFAULT_RESAMPLES

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
    `schema_source` says where the agent's tool schemas came from (None: from error texts).
    """

    label: str
    domain: str
    model: str
    max_errors: int
    episodes: tuple[EpisodeFailures, ...]
    budget_curve: tuple[BudgetPoint, ...]
    schema_source: str | None = None
    sources: tuple[str, ...] = field(default_factory=tuple)

    # -- figures ---------------------------------------------------------------------------

    @property
    def mean_reward(self) -> float:
        """The mean recorded reward (0 for an empty run)."""
        if not self.episodes:
            return 0.0
        return math.fsum(e.reward for e in self.episodes) / len(self.episodes)

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

    def errors_per_episode(self) -> dict[int, int]:
        """How many episodes had 0, 1, 2, … errors (every count up to the largest)."""
        counts = Counter(e.errors for e in self.episodes)
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

    # -- output ----------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON of `evalkit analyze --json`: the figures first, then the breakdowns."""
        return {
            "episodes": len(self.episodes),
            "mean_reward": self.mean_reward,
            "channels": _named(self.channels()),
            "budget_curve": [p.to_dict() for p in self.budget_curve],
            "termination_reasons": dict(self.termination_reasons().most_common()),
            "label": self.label,
            "domain": self.domain,
            "model": self.model,
            "max_errors": self.max_errors,
            "errors": self.errors,
            "tool_calls": {"assistant": self.agent_calls, "user": self.user_calls},
            "rates": {c.value: self.rate(c) for c in ErrorChannel},
            "errors_per_episode": {str(n): c for n, c in self.errors_per_episode().items()},
            "wrong_tool_names": dict(self.wrong_tool_names().most_common()),
            "silent_violations": dict(self.silent_violations().most_common()),
            "proxy": {
                "channels": dict(self.proxy_channels().most_common()),
                "repairs": self.repairs,
            },
            "schema_source": self.schema_source,
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
    label: str = "",
    domain: str = "",
    model: str = "",
    schema_source: str | None = None,
    sources: Sequence[str] = (),
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> RunAnalysis:
    """Analyse classified episodes that ran at budget `max_errors`.

    The budget curve's bootstrap keeps each task's episodes together.

    Raises:
        ValueError: when `max_errors` is negative.
    """
    if max_errors < 0:
        raise ValueError(f"max_errors must be ≥ 0, got {max_errors}")
    curve = budget_curve(
        [e.reward for e in episodes],
        [e.errors for e in episodes],
        max_errors,
        [e.task_id for e in episodes],
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )
    return RunAnalysis(
        label=label,
        domain=domain,
        model=model,
        max_errors=max_errors,
        episodes=tuple(episodes),
        budget_curve=tuple(curve),
        schema_source=schema_source,
        sources=tuple(sources),
    )
