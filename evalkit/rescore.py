"""Recompute the rewards of every simulation of a results file and compare them with the recorded ones.

Each simulation's recorded tool calls (the agent's and the user's) are replayed on fresh
databases and compared, by canonical hash, with the gold actions replayed on others (τ²-bench's
DB check); the task's ENV assertions are run on the replayed environment (telecom), and the
reward is recomputed from the checks of its `reward_basis`. Three verdicts per simulation:

- DB: the DB reward (None on both sides for a simulation that did not end normally);
- ENV: the product of the ENV assertions (None when the task has none);
- reward: the whole reward, compared when the file records one and it can be recomputed: a
  task whose basis holds NL assertions needs their verdicts, from a judge
  (`judge_simulations`, before `rescore`); a judge that fails leaves the reward unknown and the
  simulation in disagreement, never a silent agreement.

A disagreement is *explained* when the simulation's records are inconsistent or its task is
another version of the data (`evalkit.records`); it is *real* otherwise. The report's `status`
is 0 when every simulation agrees, 1 when a disagreement is real, 3 when every disagreement is
explained or a record is inconsistent (the CLI's exit status).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from evalkit.domains.base import Domain
from evalkit.env import Environment
from evalkit.errors import DataError, JudgeError, ResultsFileError, WrongDataError
from evalkit.formats import Results, SimulationRun, solo_mode
from evalkit.messages import AssistantMessage
from evalkit.records import RecordIssue, check_records, summary_lines
from evalkit.scoring import NLAssertionCheck, NLJudge, RewardInfo, evaluate
from evalkit.tasks import RewardType, Task
from evalkit.termination import NORMAL_ENDINGS


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
    issues: tuple[RecordIssue, ...] = ()
    judge_error: str | None = None

    @property
    def inconsistent(self) -> bool:
        """Whether the simulation's records cannot be compared (see `evalkit.records`)."""
        return any(i.problem.inconsistent for i in self.issues)

    @property
    def explained(self) -> bool:
        """Whether it disagrees for a reason its records give."""
        if self.agrees:
            return False
        wrong = {
            "db": not self.db_agrees,
            "env": not self.env_agrees,
            "reward": not self.reward_agrees,
        }
        return any(i.explains(**wrong) for i in self.issues)

    @property
    def real_disagreement(self) -> bool:
        """Whether it disagrees for no reason its records give."""
        return not self.agrees and not self.explained

    @property
    def explaining(self) -> list[RecordIssue]:
        """The findings that explain its disagreement."""
        wrong = {
            "db": not self.db_agrees,
            "env": not self.env_agrees,
            "reward": not self.reward_agrees,
        }
        return [i for i in self.issues if not self.agrees and i.explains(**wrong)]

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
        """Whether the DB reward, the ENV assertions and the reward all agree (never when the
        judge failed: the reward is then unknown)."""
        return self.db_agrees and self.env_agrees and self.reward_agrees and not self.judge_error


AGREE = 0
REAL_DISAGREEMENT = 1
INCONSISTENT_RECORDS = 3


@dataclass
class RescoreReport:
    simulations: list[RescoredSimulation] = field(default_factory=list)

    @property
    def issues(self) -> list[RecordIssue]:
        """Every finding about the records, in simulation order."""
        return [i for s in self.simulations for i in s.issues]

    @property
    def status(self) -> int:
        """0: every simulation agrees; 1: a disagreement that the records do not explain;
        3: the records are inconsistent, or explain every disagreement."""
        if any(s.real_disagreement for s in self.simulations):
            return REAL_DISAGREEMENT
        if any(s.inconsistent or s.explained for s in self.simulations):
            return INCONSISTENT_RECORDS
        return AGREE

    def summary(self) -> list[str]:
        """The findings in sentences, one per kind, then the verdict."""
        lines = summary_lines(self.issues, len(self.simulations))
        failed = sum(1 for s in self.simulations if s.judge_error)
        if failed:
            lines.append(
                f"{failed} of {len(self.simulations)} simulations: the judge failed, so their "
                "reward could not be recomputed."
            )
        real = sum(1 for s in self.simulations if s.real_disagreement)
        explained = sum(1 for s in self.simulations if s.explained)
        verdict = f"{self.agree} of {len(self.simulations)} simulations agree"
        if real or explained:
            verdict += (
                f"; {real} disagree for no reason the records give, {explained} for one they give"
            )
        return [*lines, verdict + "."]

    @property
    def agree(self) -> int:
        """How many simulations agree."""
        return sum(1 for s in self.simulations if s.agrees)

    @property
    def disagreements(self) -> list[RescoredSimulation]:
        """The simulations whose recomputed DB reward differs from the recorded one."""
        return [s for s in self.simulations if not s.agrees]

    def to_dict(self) -> dict[str, Any]:
        """`{"simulations": n, "agree": m, "disagree": [...]}`, plus `"status"` and
        `"issues"` (every finding about the records) when the records are not all consistent.

        A disagreement is `{id, task_id, recorded, recomputed}` (the DB rewards), plus
        `"env": {recorded, recomputed}` and `"reward": {recorded, recomputed}` when those
        disagree, and `"explained_by"` (the findings' problems) when the records explain it.
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
            if s.judge_error:
                entry["judge_error"] = s.judge_error
            if s.explained:
                entry["explained_by"] = sorted({i.problem.value for i in s.explaining})
            disagree.append(entry)
        out: dict[str, Any] = {
            "simulations": len(self.simulations),
            "agree": self.agree,
            "disagree": disagree,
        }
        if self.issues:
            out["status"] = self.status
            out["issues"] = [i.to_dict() for i in self.issues]
        return out


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


def needs_judge(task: Task, simulation: SimulationRun) -> bool:
    """Whether the simulation's reward needs verdicts on its task's NL assertions."""
    criteria = task.evaluation_criteria
    return (
        simulation.termination_reason in NORMAL_ENDINGS
        and criteria is not None
        and bool(criteria.nl_assertions)
        and RewardType.NL_ASSERTION in criteria.reward_basis
    )


Verdicts = Mapping[str, "list[NLAssertionCheck] | JudgeError"]


async def judge_simulations(
    results: Results, domain: Domain, judge: NLJudge, *, concurrency: int = 4
) -> dict[str, list[NLAssertionCheck] | JudgeError]:
    """Ask `judge` about the NL assertions of every simulation that needs them, `concurrency`
    at a time: by simulation id, the verdicts or the judge's error."""
    tasks = {t.id: t for t in domain.tasks} | {t.id: t for t in results.tasks}
    gate = asyncio.Semaphore(concurrency)
    verdicts: dict[str, list[NLAssertionCheck] | JudgeError] = {}

    async def ask(simulation: SimulationRun, assertions: list[str]) -> None:
        async with gate:
            try:
                verdicts[simulation.id] = await judge.judge(
                    assertions, simulation.messages, task_id=simulation.task_id
                )
            except JudgeError as exc:
                verdicts[simulation.id] = exc

    pending = []
    for simulation in results.simulations:
        task = tasks.get(simulation.task_id)
        if task is not None and task.evaluation_criteria and needs_judge(task, simulation):
            pending.append(ask(simulation, task.evaluation_criteria.nl_assertions or []))
    await asyncio.gather(*pending)
    return verdicts


def rescore_simulation(
    domain: Domain,
    task: Task,
    simulation: SimulationRun,
    *,
    shortcut: bool = True,
    verdicts: list[NLAssertionCheck] | JudgeError | None = None,
) -> RescoredSimulation:
    """Recompute one simulation's DB check, ENV assertions and reward.

    `shortcut` is `scoring.db_check`'s. `verdicts` are the judge's on the task's NL assertions
    (or its error); without them the reward is not recomputed when the task's basis needs them.
    """
    recorded = simulation.reward_info
    recomputed_db = recomputed_env = recomputed_reward = None
    judge_error = verdicts.message if isinstance(verdicts, JudgeError) else None
    nl_checks = verdicts if isinstance(verdicts, list) else None
    if simulation.termination_reason in NORMAL_ENDINGS:
        info = evaluate(
            domain,
            task,
            simulation.messages,
            simulation.termination_reason,
            nl_checks=nl_checks,
            shortcut=shortcut,
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
        judge_error=judge_error,
    )


def check_complete(results: Results, *, source: str) -> None:
    """Refuse `results` when its simulations lack what rescoring needs (an older τ²-bench
    format without each simulation's `task_id` or `termination_reason`, `Results.missing`):
    without the task there is nothing to replay it against.

    Raises:
        ResultsFileError: naming the missing fields and what `analyze` still computes.
    """
    if results.missing:
        lacking = ", ".join(
            f"{field} ({n} of {len(results.simulations)} simulations)"
            for field, n in results.missing.items()
        )
        raise ResultsFileError(
            f"{source}: an older τ²-bench format without {lacking}: rescoring needs each "
            "simulation's task and ending; evalkit analyze computes what needs neither (budget "
            "curves, channels)"
        )


def check_data(results: Results, domain: Domain, *, source: str) -> None:
    """Refuse `results` when it was run on other data than `domain`'s (loaded from `source`,
    a directory or "shipped"): a verdict from the wrong data would be a coincidence.

    The file was run on other data when it holds a task (embedded in the file) whose id is not
    among the domain's tasks, or when a simulated task cannot be put in its initial state on the
    domain's databases (a set-up function names an id they do not have). A task id in neither the
    file nor the domain is a record finding (`unknown_task`), not a refusal.

    Raises:
        WrongDataError: naming the first such task and `--data-dir`.
    """
    known = {t.id for t in domain.tasks}
    embedded = {t.id: t for t in results.tasks}
    simulated = list(dict.fromkeys(s.task_id for s in results.simulations))
    absent = [i for i in simulated if i in embedded and i not in known]
    fix = (
        f"pass --data-dir with the {domain.name} domain directory the file was run on "
        f"(τ²-bench's data/tau2/domains/{domain.name})"
    )
    if absent:
        raise WrongDataError(
            f"{len(absent)} of the file's {len(simulated)} tasks are not in the {domain.name} "
            f"data loaded from {source} (task {absent[0]!r}): the file was run on other data; "
            + fix
        )
    for task_id in simulated:
        task = embedded.get(task_id) or _domain_task(domain, task_id)
        if task is None:
            continue
        try:
            Environment(domain, task)
        except Exception as exc:  # a set-up function failing on these databases
            raise WrongDataError(
                f"task {task_id!r} cannot be set up on the {domain.name} data loaded from "
                f"{source} ({exc}): the file was run on other data; " + fix
            ) from None


def _domain_task(domain: Domain, task_id: str) -> Task | None:
    try:
        return domain.get_task(task_id)
    except DataError:
        return None


def solo_as_user_calls(results: Results, domain: Domain) -> Results:
    """`results` of a solo-mode run with every agent call of a user tool replayed on the user's
    side, as τ²-bench's solo environment runs it (tool names of the two sides never overlap)."""
    _, user_toolkit = domain.toolkit_classes()
    if user_toolkit is None:
        return results
    simulations = []
    for simulation in results.simulations:
        messages = []
        for message in simulation.messages:
            if isinstance(message, AssistantMessage) and message.tool_calls:
                calls = [
                    c.model_copy(update={"requestor": "user"})
                    if user_toolkit.has_tool(c.name)
                    else c
                    for c in message.tool_calls
                ]
                message = message.model_copy(update={"tool_calls": calls})
            messages.append(message)
        simulations.append(simulation.model_copy(update={"messages": messages}))
    return results.model_copy(update={"simulations": simulations})


def rescore(
    results: Results, domain: Domain, *, shortcut: bool = True, verdicts: Verdicts | None = None
) -> RescoreReport:
    """Recompute the rewards of every simulation of `results`, each with the findings about its
    records (`evalkit.records.check_records` against `domain`'s tasks) and, by simulation id,
    the judge's `verdicts` on its NL assertions (`judge_simulations`).

    Tasks come from the file itself (the versions the run used), else from `domain`; a
    simulation whose task is in neither is reported (`unknown_task`) with nothing recomputed.
    A solo-mode file (`formats.solo_mode`) is replayed as τ²-bench's solo environment runs it.

    Raises:
        WrongDataError: when a task's set-up or assertion functions fail on `domain`'s data
            (`check_data` refuses most such files before).
    """
    if solo_mode(results):
        results = solo_as_user_calls(results, domain)
    tasks = {t.id: t for t in results.tasks}
    findings: dict[str, list[RecordIssue]] = {}
    for found in check_records(results, domain.tasks):
        findings.setdefault(found.simulation_id, []).append(found)
    report = RescoreReport()
    for simulation in results.simulations:
        issues = tuple(findings.get(simulation.id, ()))
        task = tasks.get(simulation.task_id)
        if task is None:
            try:
                task = domain.get_task(simulation.task_id)
            except DataError:
                task = None
        if task is None:
            rescored = RescoredSimulation(
                id=simulation.id,
                task_id=simulation.task_id,
                trial=simulation.trial,
                termination_reason=simulation.termination_reason,
                recorded=recorded_db_reward(simulation),
                recomputed=None,
            )
        else:
            try:
                rescored = rescore_simulation(
                    domain,
                    task,
                    simulation,
                    shortcut=shortcut,
                    verdicts=(verdicts or {}).get(simulation.id),
                )
            except (ValueError, LookupError, TypeError) as exc:  # a task function on this data
                raise WrongDataError(
                    f"task {task.id!r} cannot be scored on the {domain.name} data ({exc}): "
                    "the file's tasks do not fit it; pass --data-dir with the data the file "
                    "was run on"
                ) from None
        report.simulations.append(replace(rescored, issues=issues))
    return report
