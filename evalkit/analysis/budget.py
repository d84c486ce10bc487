"""The budget curve: the score a run would have had at every error budget k = 0…B, from one run
at budget B (DESIGN §10), for each of the two budgets an episode can run under.

Two budgets, named apart (`Budget`):

- `Budget.TAU2`, τ²-bench's tool-error budget: the episode's count is its tool messages with
  `error: true`, the agent's and the user's alike; τ²-bench ends the episode with reward 0 when
  that count reaches `max_errors` (`>=`). This is the budget of every τ²-bench results file.
- `Budget.PROXY`, the proxy's experienced-failure budget: the proxy counts every failure the
  agent experienced — unrepaired violations that reached it (leaked calls, empty answers,
  `tool_choice` failures and calls a tool tolerated included) and the tool errors of its calls —
  and ends the session when its count reaches the budget. A run through the proxy (evalkit
  replay) is budgeted twice, by the proxy and by the environment, so an episode survives budget k
  only while both counts are below k: its count here is the larger of the two
  (`EpisodeFailures.errors_for`).

The counterfactual, stated once: **an episode's reward at budget k is its recorded reward if its
error count is below k, and 0 otherwise.** Proof sketch: let an episode run at budget B ≥ k, and
let t be the first step at which its count reaches k (if any). Up to t the episode at budget k
receives the same inputs and makes the same calls as the one at B — a budget acts only when the
count reaches it, and nothing before that depends on its value (the simulated upstream and the
scripted user are seeded per episode, not per budget). If the count never reaches k (errors <
k), the two episodes are identical to the end, reward included. If it does, the episode at k
ends at t with `too_many_errors`, whose reward is 0. Counts only grow, so "reaches k at some
step" is "final count ≥ k". Hence one run at B gives the whole curve k = 0…B; budget 0 ends
every episode before it starts (score 0), and at k = B the curve is the run's own mean reward
(every episode whose count reached B already ended with reward 0).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from evalkit.analysis.stats import DEFAULT_RESAMPLES, FloatArray, cluster_bootstrap_ci


class Budget(enum.StrEnum):
    """Which error count a budget curve is drawn over (see the module docstring)."""

    TAU2 = "tau2"
    PROXY = "proxy"

    @property
    def label(self) -> str:
        """The budget's name in tables and headlines."""
        return _LABELS[self]

    @property
    def definition(self) -> str:
        """What the budget counts, in one sentence."""
        return _DEFINITIONS[self]


_LABELS: Final = {
    Budget.TAU2: "τ²-bench tool-error budget",
    Budget.PROXY: "proxy experienced-failure budget",
}
_DEFINITIONS: Final = {
    Budget.TAU2: "an episode ends when its tool errors (tool messages with error: true, the "
    "agent's and the user's) reach k, as in τ²-bench",
    Budget.PROXY: "an episode ends when the failures the agent experienced (tool errors, leaked "
    "calls, empty answers, tool_choice failures, tolerated violations) or its tool errors reach "
    "k, as through the proxy",
}


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
    """The reward of an episode with `errors` errors (of the budget's count) had it run at
    budget `k`: the counterfactual of the module docstring."""
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
