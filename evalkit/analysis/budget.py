"""The budget curve: the score a run would have had at every error budget k = 0…B, from one run
at budget B (DESIGN §10).

An episode run at budget B is the same episode at budget k ≤ B up to the moment its error count
reaches k, and τ²-bench ends an episode with reward 0 when the count reaches `max_errors`
(`>=`). So at budget k an episode scores its recorded reward if its total error count is below
k, and 0 otherwise. The errors are all tool messages with `error: true`, the agent's and the
user's alike — τ²-bench's count. Budget 0 ends every episode before it starts (score 0); budget 1
tolerates no error at all; the point at k = B is the run's own mean reward.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evalkit.analysis.stats import DEFAULT_RESAMPLES, FloatArray, cluster_bootstrap_ci


@dataclass(frozen=True, slots=True)
class BudgetPoint:
    """The mean reward at error budget `k`, with a bootstrap confidence interval."""

    k: int
    pass_rate: float
    ci_low: float
    ci_high: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form: `{"k", "pass_rate", "ci_low", "ci_high"}`."""
        return {
            "k": self.k,
            "pass_rate": self.pass_rate,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
        }


def reward_at_budget(reward: float, errors: int, k: int) -> float:
    """The reward of an episode with `errors` tool errors had it run at budget `k`."""
    return reward if errors < k else 0.0


def rewards_by_budget(
    rewards: Sequence[float], errors: Sequence[int], max_errors: int
) -> FloatArray:
    """One row per episode, one column per budget k = 0…max_errors: the reward at that budget.

    Raises:
        ValueError: when the sequences differ in length or `max_errors` is negative.
    """
    if len(rewards) != len(errors):
        raise ValueError(f"{len(rewards)} rewards for {len(errors)} error counts")
    if max_errors < 0:
        raise ValueError(f"max_errors must be ≥ 0, got {max_errors}")
    budgets = np.arange(max_errors + 1)
    r = np.asarray(rewards, dtype=np.float64)[:, None]
    e = np.asarray(errors, dtype=np.int64)[:, None]
    return np.where(e < budgets[None, :], r, 0.0)


def budget_curve(
    rewards: Sequence[float],
    errors: Sequence[int],
    max_errors: int,
    clusters: Sequence[Hashable] | None = None,
    *,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> list[BudgetPoint]:
    """The budget curve of a run whose episodes had `rewards` and `errors` at budget `max_errors`.

    `clusters` (usually the task ids) say which episodes the bootstrap keeps together. Returns
    one point per k = 0…max_errors; an empty run has an empty curve.

    Raises:
        ValueError: as `rewards_by_budget`.
    """
    if not rewards:
        if errors:
            raise ValueError(f"0 rewards for {len(errors)} error counts")
        return []
    table = rewards_by_budget(rewards, errors, max_errors)
    low, high = cluster_bootstrap_ci(
        table, clusters, confidence=confidence, resamples=resamples, seed=seed
    )
    n = table.shape[0]
    return [
        BudgetPoint(
            k=k,
            # fsum: the point at k = B is the run's mean reward to the last bit.
            pass_rate=math.fsum(table[:, k].tolist()) / n,
            ci_low=float(low[k]),
            ci_high=float(high[k]),
        )
        for k in range(max_errors + 1)
    ]
