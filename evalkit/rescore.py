"""Recompute the DB reward of every simulation of a results file and compare it with the recorded one.

Each simulation's recorded tool calls are replayed on a fresh database and the result is
compared, by canonical hash, with the gold actions replayed on another (τ²-bench's DB check).
A simulation that did not end normally has no DB check, recorded or recomputed (None).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from evalkit.domains.base import Domain
from evalkit.errors import DataError
from evalkit.formats import Results, SimulationRun
from evalkit.scoring import NORMAL_ENDINGS, db_check
from evalkit.tasks import Task


@dataclass(frozen=True)
class RescoredSimulation:
    id: str
    task_id: str
    trial: int | None
    termination_reason: str
    recorded: float | None
    recomputed: float | None

    @property
    def agrees(self) -> bool:
        """Whether the recomputed DB reward equals the recorded one."""
        return self.recorded == self.recomputed


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
        """`{"simulations": n, "agree": m, "disagree": [{id, task_id, recorded, recomputed}]}`."""
        return {
            "simulations": len(self.simulations),
            "agree": self.agree,
            "disagree": [
                {
                    "id": s.id,
                    "task_id": s.task_id,
                    "recorded": s.recorded,
                    "recomputed": s.recomputed,
                }
                for s in self.disagreements
            ],
        }


def recorded_db_reward(simulation: SimulationRun) -> float | None:
    """The DB reward the file records for `simulation` (None when it has no DB check)."""
    info = simulation.reward_info
    if info is None or info.db_check is None:
        return None
    return info.db_check.db_reward


def rescore_simulation(
    domain: Domain, task: Task, simulation: SimulationRun, *, shortcut: bool = True
) -> RescoredSimulation:
    """Recompute one simulation's DB reward (`shortcut` as in `scoring.db_check`)."""
    recomputed = None
    if simulation.termination_reason in NORMAL_ENDINGS:
        recomputed = db_check(domain, task, simulation.messages, shortcut=shortcut).db_reward
    return RescoredSimulation(
        id=simulation.id,
        task_id=simulation.task_id,
        trial=simulation.trial,
        termination_reason=simulation.termination_reason,
        recorded=recorded_db_reward(simulation),
        recomputed=recomputed,
    )


def rescore(results: Results, domain: Domain, *, shortcut: bool = True) -> RescoreReport:
    """Recompute the DB reward of every simulation of `results`.

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
