"""Whether a results file's records fit together and fit the domain's data: the reasons a recorded
reward and one recomputed from the data can differ without either being wrong.

Two kinds of finding, per simulation (`RecordIssue`):

- *inconsistent records* (`Problem.inconsistent`): a simulation without messages (nothing to
  replay); a `reward_info` whose action checks name another task's actions than the
  simulation's `task_id` (as in a public leaderboard submission whose rewards were attached to
  the wrong simulations); an action id of no task in the data; a task id in neither the file
  nor the domain. Such a record cannot be compared.
- *another data version* (`Problem.TASK_DIFFERS`): the task the file embeds differs from the
  domain's task of that id, field by field (`evaluation_criteria.reward_basis`, …). The file's
  own task is the one rescored; the difference explains a disagreement, and is otherwise a note.

Pure: `rescore` and `analyze` call `check_records` on what they read.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from evalkit.formats import UNKNOWN_TASK_PREFIX, Results, SimulationRun
from evalkit.tasks import Task

_SHOWN: Final = 3  # ids listed in a sentence before "…"
_STATE_FIELDS: Final = frozenset(
    {"initial_state", "evaluation_criteria.actions", "evaluation_criteria.env_assertions"}
)


class Problem(enum.StrEnum):
    """What is wrong with a record; values are the names used in JSON."""

    NO_MESSAGES = "no_messages"
    UNKNOWN_TASK = "unknown_task"
    OTHER_TASKS_ACTIONS = "other_tasks_actions"
    UNKNOWN_ACTION = "unknown_action"
    TASK_DIFFERS = "task_differs"

    @property
    def inconsistent(self) -> bool:
        """Whether the record cannot be compared at all (not merely another data version)."""
        return self is not Problem.TASK_DIFFERS

    @property
    def summary(self) -> str:
        """The problem in a few words, for a summary line."""
        return _SUMMARIES[self]


_SUMMARIES: Final = {
    Problem.NO_MESSAGES: "a simulation without messages",
    Problem.UNKNOWN_TASK: "a task id in neither the file nor the domain",
    Problem.OTHER_TASKS_ACTIONS: "reward_info checks another task's actions than the simulation's",
    Problem.UNKNOWN_ACTION: "an action id of no task in the data",
    Problem.TASK_DIFFERS: "the file's task differs from the domain's (another data version)",
}


@dataclass(frozen=True, slots=True)
class RecordIssue:
    """One finding about one simulation: what is wrong, in a sentence."""

    simulation_id: str
    task_id: str
    problem: Problem
    detail: str
    fields: tuple[str, ...] = ()

    def explains(self, *, db: bool, env: bool, reward: bool) -> bool:
        """Whether this finding explains a disagreement of the DB check, the ENV assertions or
        the reward (those flagged True): an inconsistent record explains any; another version
        of a task only one its differing fields can change — the gold actions, assertions and
        initial state the database and environment are rebuilt from, any evaluation criterion
        for the reward."""
        if self.problem.inconsistent:
            return True
        touched = {f.split(".")[0] for f in self.fields} | set(self.fields)
        state = bool(touched & _STATE_FIELDS)
        criteria = "evaluation_criteria" in touched
        return ((db or env) and state) or (reward and (state or criteria))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {
            "simulation": self.simulation_id,
            "task_id": self.task_id,
            "problem": self.problem.value,
            "detail": self.detail,
        }


def check_records(results: Results, domain_tasks: Sequence[Task] = ()) -> list[RecordIssue]:
    """Every finding about the simulations of `results`, against its own tasks and
    `domain_tasks` (the domain's data; empty when the domain is unknown), in simulation order."""
    embedded = {t.id: t for t in results.tasks}
    data = {t.id: t for t in domain_tasks}
    # Action ids need not be unique across tasks (telecom's name the tool): every owner counts.
    owners: dict[str, set[str]] = {}
    for task in [*domain_tasks, *results.tasks]:
        for action in _actions(task):
            owners.setdefault(action, set()).add(task.id)
    tasks = data | embedded
    issues: list[RecordIssue] = []
    differences = {
        task_id: task_differences(task, data[task_id])
        for task_id, task in embedded.items()
        if task_id in data
    }
    for simulation in results.simulations:
        if simulation.task_id.startswith(UNKNOWN_TASK_PREFIX):
            continue  # an older format's simulation without its task: nothing to check against
        if data and simulation.task_id not in embedded and simulation.task_id not in data:
            issues.append(
                RecordIssue(
                    simulation.id,
                    simulation.task_id,
                    Problem.UNKNOWN_TASK,
                    f"task {simulation.task_id!r} is neither in the file nor in the domain",
                )
            )
        own = tasks.get(simulation.task_id)
        issues += check_simulation(simulation, owners, _actions(own) if own else [])
        fields = differences.get(simulation.task_id)
        if fields:
            issues.append(
                RecordIssue(
                    simulation.id,
                    simulation.task_id,
                    Problem.TASK_DIFFERS,
                    f"task {simulation.task_id} differs from the domain's task of that id in "
                    f"{_listed(fields)} (the file's task is the one rescored)",
                    tuple(fields),
                )
            )
    return issues


def check_simulation(
    simulation: SimulationRun, owners: Mapping[str, set[str]], own: Sequence[str]
) -> list[RecordIssue]:
    """The inconsistencies of one simulation; `owners` maps every known action id to the tasks
    that have it (no action check is judged when it is empty), `own` are the action ids of the
    simulation's task."""
    issues = []

    def issue(problem: Problem, detail: str) -> None:
        issues.append(RecordIssue(simulation.id, simulation.task_id, problem, detail))

    if not simulation.messages:
        issue(Problem.NO_MESSAGES, "the simulation has no messages: nothing to replay or judge")
    info = simulation.reward_info
    checked = [c.action.action_id for c in (info.action_checks or [])] if info else []
    if not checked or not owners:
        return issues
    unknown = [a for a in checked if a not in owners]
    if unknown:
        issue(
            Problem.UNKNOWN_ACTION, f"action id(s) {_listed(unknown)} belong to no task in the data"
        )
    foreign = [a for a in checked if a in owners and a not in own]
    if foreign:
        # The tasks that have every foreign action, else any that has one.
        common = set.intersection(*(owners[a] for a in foreign))
        named = common or set.union(*(owners[a] for a in foreign))
        others = sorted(named - {simulation.task_id}, key=_order)
        issue(
            Problem.OTHER_TASKS_ACTIONS,
            f"its reward_info checks the actions of task {_listed(others)}, not those of task "
            f"{simulation.task_id} (action id(s) {_listed(foreign)})",
        )
    return issues


def task_differences(recorded: Task, current: Task) -> list[str]:
    """The fields (dotted, `evaluation_criteria.reward_basis`) in which two versions of a task
    differ; empty when they are the same."""
    a = recorded.model_dump(mode="json", exclude_none=True)
    b = current.model_dump(mode="json", exclude_none=True)
    fields: list[str] = []
    for key in sorted(set(a) | set(b)):
        left, right = a.get(key), b.get(key)
        if left == right:
            continue
        if isinstance(left, dict) and isinstance(right, dict):
            fields += [
                f"{key}.{sub}"
                for sub in sorted(set(left) | set(right))
                if left.get(sub) != right.get(sub)
            ]
        else:
            fields.append(key)
    return fields


def summary_lines(issues: Iterable[RecordIssue], simulations: int) -> list[str]:
    """One sentence per kind of finding: how many simulations it concerns, of how many."""
    per_problem: Counter[Problem] = Counter()
    seen: set[tuple[str, Problem]] = set()
    for found in issues:
        if (found.simulation_id, found.problem) not in seen:
            seen.add((found.simulation_id, found.problem))
            per_problem[found.problem] += 1
    return [
        f"{per_problem[p]} of {simulations} simulations: {p.summary}."
        for p in Problem
        if per_problem[p]
    ]


def _actions(task: Task) -> list[str]:
    criteria = task.evaluation_criteria
    return [a.action_id for a in (criteria.actions or [])] if criteria is not None else []


def _order(task_id: str) -> tuple[int, str]:
    return (int(task_id), "") if task_id.isdigit() else (1 << 30, task_id)


def _listed(values: Sequence[str]) -> str:
    shown = ", ".join(values[:_SHOWN])
    return shown + (f" and {len(values) - _SHOWN} more" if len(values) > _SHOWN else "")
