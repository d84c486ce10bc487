"""Recompute the rewards of every simulation of a results file and compare them with the recorded ones.

Each simulation's recorded tool calls (the agent's and the user's) are replayed on fresh
databases and compared, by canonical hash, with the gold actions replayed on others (τ²-bench's
DB check); the task's ENV assertions are run on the replayed environment (telecom), and the
reward is recomputed from the checks of its `reward_basis`. Three verdicts per simulation:

- DB: the DB reward (None on both sides for a simulation that did not end normally);
- ENV: the product of the ENV assertions (None when the task has none);
- reward: the whole reward, compared when it can be recomputed offline — not when the task's
  basis holds NL assertions, which need a judge — and when the file records one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from evalkit.domains.base import Domain
from evalkit.errors import DataError
from evalkit.formats import Results, SimulationRun
from evalkit.scoring import NORMAL_ENDINGS, RewardInfo, evaluate
from evalkit.tasks import Task


@dataclass(frozen=True)
class RescoredSimulation:
    """One simulation's rewards as recorded and as recomputed (`recorded`/`recomputed`: DB)."""

    id: str
    task_id: str
    trial: int | None
    termination_reason: str
    recorded: float | None
    recomputed: float | None
    recorded_env: float | None = None
    recomputed_env: float | None = None
    recorded_reward: float | None = None
    recomputed_reward: float | None = None

    @property
    def db_agrees(self) -> bool:
        """Whether the recomputed DB reward equals the recorded one."""
        return self.recorded == self.recomputed

    @property
    def env_agrees(self) -> bool:
        """Whether the recomputed ENV assertions' product equals the recorded one."""
        return self.recorded_env == self.recomputed_env

    @property
    def reward_agrees(self) -> bool:
        """Whether the rewards agree (True when either side is unknown: nothing to compare)."""
        if self.recorded_reward is None or self.recomputed_reward is None:
            return True
        return self.recorded_reward == self.recomputed_reward

    @property
    def agrees(self) -> bool:
        """Whether the DB reward, the ENV assertions and the reward all agree."""
        return self.db_agrees and self.env_agrees and self.reward_agrees


@dataclass
class RescoreReport:
    simulations: list[RescoredSimulation] = field(default_factory=list)

    @property
    def agree(self) -> int:
        """How many simulations agree."""
        return sum(1 for s in self.simulations if s.agrees)

    @property
    def disagreements(self) -> list[RescoredSimulation]:
        """The simulations whose recomputed DB reward differs from the recorded one."""
        return [s for s in self.simulations if not s.agrees]

    def to_dict(self) -> dict[str, Any]:
        """`{"simulations": n, "agree": m, "disagree": [...]}`.

        A disagreement is `{id, task_id, recorded, recomputed}` (the DB rewards), plus
        `"env": {recorded, recomputed}` and `"reward": {recorded, recomputed}` when those
        disagree.
        """
        disagree = []
        for s in self.disagreements:
            entry: dict[str, Any] = {
                "id": s.id,
                "task_id": s.task_id,
                "recorded": s.recorded,
                "recomputed": s.recomputed,
            }
            if not s.env_agrees:
                entry["env"] = {"recorded": s.recorded_env, "recomputed": s.recomputed_env}
            if not s.reward_agrees:
                entry["reward"] = {"recorded": s.recorded_reward, "recomputed": s.recomputed_reward}
            disagree.append(entry)
        return {"simulations": len(self.simulations), "agree": self.agree, "disagree": disagree}


def recorded_db_reward(simulation: SimulationRun) -> float | None:
    """The DB reward the file records for `simulation` (None when it has no DB check)."""
    info = simulation.reward_info
    if info is None or info.db_check is None:
        return None
    return info.db_check.db_reward


def env_reward(info: RewardInfo | None) -> float | None:
    """The product of the ENV assertions of a reward block (None when it has none)."""
    if info is None or not info.env_assertions:
        return None
    return math.prod(a.reward for a in info.env_assertions)


def _offline(info: RewardInfo) -> bool:
    # A reward whose NL assertions were left to a judge that did not run is not the reward.
    return not (info.info or {}).get("not_evaluated")


def rescore_simulation(
    domain: Domain, task: Task, simulation: SimulationRun, *, shortcut: bool = True
) -> RescoredSimulation:
    """Recompute one simulation's DB check, ENV assertions and reward.

    `shortcut` is `scoring.db_check`'s. NL assertions are not judged (the reward is then not
    recomputed when the task's basis needs them).
    """
    recorded = simulation.reward_info
    recomputed_db = recomputed_env = recomputed_reward = None
    if simulation.termination_reason in NORMAL_ENDINGS:
        info = evaluate(
            domain, task, simulation.messages, simulation.termination_reason, shortcut=shortcut
        )
        recomputed_db = None if info.db_check is None else info.db_check.db_reward
        recomputed_env = env_reward(info)
        recomputed_reward = info.reward if _offline(info) else None
    else:
        recomputed_reward = 0.0  # τ²-bench's reward of an episode that did not end normally
    return RescoredSimulation(
        id=simulation.id,
        task_id=simulation.task_id,
        trial=simulation.trial,
        termination_reason=simulation.termination_reason,
        recorded=recorded_db_reward(simulation),
        recomputed=recomputed_db,
        recorded_env=env_reward(recorded),
        recomputed_env=recomputed_env,
        recorded_reward=None if recorded is None else recorded.reward,
        recomputed_reward=recomputed_reward,
    )


def rescore(results: Results, domain: Domain, *, shortcut: bool = True) -> RescoreReport:
    """Recompute the rewards of every simulation of `results`.

    Tasks come from the file itself (the versions the run used), else from `domain`.

    Raises:
        DataError: when a simulation's task is in neither.
    """
    tasks = {t.id: t for t in results.tasks}
    report = RescoreReport()
    for simulation in results.simulations:
        task = tasks.get(simulation.task_id)
        if task is None:
            try:
                task = domain.get_task(simulation.task_id)
            except DataError:
                raise DataError(
                    f"simulation {simulation.id}: task {simulation.task_id!r} is neither in the "
                    f"results file nor in the {domain.name} domain"
                ) from None
        report.simulations.append(rescore_simulation(domain, task, simulation, shortcut=shortcut))
    return report
