"""Rewards of a finished episode (τ²-bench's evaluators) and pass^k.

The reward is the product of the checks named in the task's `reward_basis`:

- DB: the hash of the database after replaying the episode's tool calls on a fresh environment
  equals the hash after replaying the gold actions on another (agent and user databases);
- ENV_ASSERTION: every assertion function of the task holds on the replayed environment;
- ACTION: every gold action was called (τ²-bench's argument comparison);
- COMMUNICATE: every required string appears in an agent message (case-insensitive, commas
  removed from the message);
- NL_ASSERTION: an LLM judge says every natural-language assertion holds. Without a judge these
  are *not evaluated*: left out of the reward and listed in `reward_info.info["not_evaluated"]`.

An episode that did not end with `agent_stop` or `user_stop` scores 0 without any check.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from evalkit.domains.base import Domain
from evalkit.env import Environment
from evalkit.messages import AssistantMessage, ToolCall, UserMessage
from evalkit.tasks import Action, EnvAssertion, EvaluationCriteria, RewardType, Task
from evalkit.termination import NORMAL_ENDINGS

SUCCESS_TOLERANCE = 1e-6


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class DBCheck(_Model):
    db_match: bool
    db_reward: float


class ActionCheck(_Model):
    action: Action
    action_match: bool
    action_reward: float


class CommunicateCheck(_Model):
    info: str
    met: bool
    justification: str


class EnvAssertionCheck(_Model):
    env_assertion: EnvAssertion
    met: bool
    reward: float


class NLAssertionCheck(_Model):
    nl_assertion: str
    met: bool
    justification: str


class RewardInfo(_Model):
    """τ²-bench's `reward_info` block of a simulation."""

    reward: float
    db_check: DBCheck | None = None
    env_assertions: list[EnvAssertionCheck] | None = None
    action_checks: list[ActionCheck] | None = None
    nl_assertions: list[NLAssertionCheck] | None = None
    communicate_checks: list[CommunicateCheck] | None = None
    reward_basis: list[RewardType] | None = None
    reward_breakdown: dict[str, float] | None = None
    info: dict[str, Any] | None = Field(default=None)


class NLJudge(Protocol):
    """Judges natural-language assertions against a conversation (an LLM behind an endpoint)."""

    info: dict[str, Any]
    """What the judge is (model, endpoint), kept in `reward_info.info["judge"]`."""

    async def judge(
        self, assertions: Sequence[str], messages: Sequence[Any], *, task_id: str | None = None
    ) -> list[NLAssertionCheck]:
        """One verdict per assertion, in order.

        Raises:
            JudgeError: when the judge cannot give them.
        """
        ...


# -- the environment checks ------------------------------------------------------------------


def tool_calls_of(messages: Iterable[Any]) -> list[ToolCall]:
    """Every tool call of the agent and the user, in order."""
    calls: list[ToolCall] = []
    for message in messages:
        if isinstance(message, AssistantMessage | UserMessage) and message.tool_calls:
            calls.extend(message.tool_calls)
    return calls


def replay_episode(domain: Domain, task: Task, messages: Iterable[Any]) -> Environment:
    """A fresh environment in the task's initial state with the episode's tool calls replayed."""
    env = Environment(domain, task)
    for call in tool_calls_of(messages):
        env.replay(call)
    return env


def replay_gold(domain: Domain, task: Task) -> tuple[Environment, list[dict[str, Any]]]:
    """A fresh environment with the gold actions applied in order.

    As in τ²-bench's evaluator, the gold actions are applied without the domain's sync step
    between them (a no-op outside telecom): in telecom the gold databases hold only the direct
    effects of the gold calls, which is why telecom tasks are scored on ENV assertions.

    Returns the environment and one record per state-changing gold action that failed (the
    gold state is then incomplete; τ²-bench logs the same and carries on).
    """
    env = Environment(domain, task)
    failed: list[dict[str, Any]] = []
    for action in task.gold_actions:
        message = env.replay(
            ToolCall(
                id=action.action_id,
                name=action.name,
                arguments=action.arguments,
                requestor=action.requestor,
            ),
            sync=False,
        )
        toolkit = env.user_tools if action.requestor == "user" else env.agent_tools
        if message.error and toolkit is not None and toolkit.mutates(action.name):
            failed.append(
                {"action_id": action.action_id, "name": action.name, "error": message.content}
            )
    return env, failed


def state_changes(domain: Domain, calls: Iterable[ToolCall]) -> list[tuple[str, str, str]]:
    """The calls that can change a database, as comparable (requestor, name, arguments) keys."""
    agent_tools, user_tools = domain.toolkit_classes()
    out: list[tuple[str, str, str]] = []
    for call in calls:
        toolkit = user_tools if call.requestor == "user" else agent_tools
        if toolkit is not None and toolkit.mutates(call.name):
            arguments = call.raw_arguments if call.raw_arguments is not None else call.arguments
            out.append((call.requestor, call.name, json.dumps(arguments, sort_keys=True)))
    return out


def _same_state_changes(domain: Domain, task: Task, messages: Sequence[Any]) -> bool:
    # The tools are deterministic and only the state-changing ones change a database: the same
    # state-changing calls, in the same order, from the same initial state, end in the same state.
    gold = [
        ToolCall(name=a.name, arguments=a.arguments, requestor=a.requestor)
        for a in task.gold_actions
    ]
    return state_changes(domain, tool_calls_of(messages)) == state_changes(domain, gold)


def db_check(
    domain: Domain, task: Task, messages: Sequence[Any], *, shortcut: bool = True
) -> DBCheck:
    """The DB check: replayed episode against replayed gold actions, by canonical hash.

    With `shortcut`, an episode whose state-changing calls are exactly the gold ones matches
    without replaying (the verdict a replay gives, only faster).
    """
    if shortcut and _same_state_changes(domain, task, messages):
        return DBCheck(db_match=True, db_reward=1.0)
    predicted = replay_episode(domain, task, messages)
    gold, _ = replay_gold(domain, task)
    match = predicted.db_hashes() == gold.db_hashes()
    return DBCheck(db_match=match, db_reward=1.0 if match else 0.0)


def action_checks(task: Task, messages: Iterable[Any]) -> list[ActionCheck]:
    """One check per gold action: whether some tool call of the episode performs it."""
    calls = tool_calls_of(messages)
    checks = []
    for action in task.gold_actions:
        matched = any(action.matches(call) for call in calls)
        checks.append(
            ActionCheck(action=action, action_match=matched, action_reward=float(matched))
        )
    return checks


def communicate_checks(task: Task, messages: Iterable[Any]) -> list[CommunicateCheck]:
    """One check per required string: whether an agent message contains it."""
    required = (
        task.evaluation_criteria.communicate_info if task.evaluation_criteria else None
    ) or []
    texts = [
        m.content
        for m in messages
        if isinstance(m, AssistantMessage) and m.has_text() and m.content is not None
    ]
    checks = []
    for info in required:
        found = next((t for t in texts if info.lower() in t.lower().replace(",", "")), None)
        if found is None:
            checks.append(
                CommunicateCheck(
                    info=info, met=False, justification=f"Information '{info}' not communicated."
                )
            )
        else:
            checks.append(
                CommunicateCheck(
                    info=info,
                    met=True,
                    justification=f"Information '{info}' communicated in the message:\n '{found}'",
                )
            )
    return checks


# -- the reward --------------------------------------------------------------------------


def evaluate(
    domain: Domain,
    task: Task,
    messages: Sequence[Any],
    termination_reason: str,
    *,
    nl_checks: list[NLAssertionCheck] | None = None,
    shortcut: bool = True,
) -> RewardInfo:
    """The reward of one episode.

    `nl_checks` are the judge's verdicts on the task's NL assertions; None means no judge ran
    (the assertions are then flagged as not evaluated and left out of the reward). `shortcut`
    is `db_check`'s.
    """
    if termination_reason not in NORMAL_ENDINGS:
        return RewardInfo(
            reward=0.0,
            info={
                "note": f"Simulation terminated prematurely. Termination reason: {termination_reason}"
            },
        )
    criteria = task.evaluation_criteria
    if criteria is None:
        return RewardInfo(reward=1.0, info={"note": "No evaluation criteria"})
    basis = set(criteria.reward_basis)
    breakdown: dict[str, float] = {}
    info: dict[str, Any] = {}
    reward = 1.0

    db, assertions = _environment_checks(domain, task, criteria, messages, info, shortcut=shortcut)
    if RewardType.DB in basis:
        breakdown[RewardType.DB] = db.db_reward
        reward *= db.db_reward
    if RewardType.ENV_ASSERTION in basis:
        value = math.prod(a.reward for a in assertions)
        breakdown[RewardType.ENV_ASSERTION] = value
        reward *= value

    actions = action_checks(task, messages)
    if RewardType.ACTION in basis:
        value = 1.0 if all(a.action_match for a in actions) else 0.0
        breakdown[RewardType.ACTION] = value
        reward *= value

    communicated = communicate_checks(task, messages)
    if RewardType.COMMUNICATE in basis:
        value = 1.0 if all(c.met for c in communicated) else 0.0
        breakdown[RewardType.COMMUNICATE] = value
        reward *= value

    if RewardType.NL_ASSERTION in basis:
        nl_value = _nl_value(criteria.nl_assertions or [], nl_checks, info)
        if nl_value is not None:
            breakdown[RewardType.NL_ASSERTION] = nl_value
            reward *= nl_value

    return RewardInfo(
        reward=reward,
        db_check=db,
        env_assertions=assertions,
        action_checks=actions,
        nl_assertions=nl_checks if nl_checks is not None else [],
        communicate_checks=communicated,
        reward_basis=criteria.reward_basis,
        reward_breakdown=breakdown,
        info=info,
    )


def _environment_checks(
    domain: Domain,
    task: Task,
    criteria: EvaluationCriteria,
    messages: Sequence[Any],
    info: dict[str, Any],
    *,
    shortcut: bool,
) -> tuple[DBCheck, list[EnvAssertionCheck]]:
    """The database check and the checks of the task's environment assertions (on the episode's
    replayed environment); gold actions that fail on replay are noted in `info`."""
    if criteria.actions is None and criteria.env_assertions is None:
        return DBCheck(db_match=True, db_reward=1.0), []
    if not criteria.env_assertions:
        return db_check(domain, task, messages, shortcut=shortcut), []
    predicted = replay_episode(domain, task, messages)
    gold, failed = replay_gold(domain, task)
    match = predicted.db_hashes() == gold.db_hashes()
    if failed:
        info["gold_replay_failures"] = failed
    assertions = []
    for assertion in criteria.env_assertions:
        met = predicted.check_assertion(assertion)
        assertions.append(EnvAssertionCheck(env_assertion=assertion, met=met, reward=float(met)))
    return DBCheck(db_match=match, db_reward=1.0 if match else 0.0), assertions


def _nl_value(
    nl_assertions: list[str], nl_checks: list[NLAssertionCheck] | None, info: dict[str, Any]
) -> float | None:
    """The NL assertions' part of the reward, or None when no judge ran (noted in `info`)."""
    if not nl_assertions:
        info["nl"] = {"note": "No nl_assertions to evaluate"}
        return 1.0
    if nl_checks is None:
        info["not_evaluated"] = [RewardType.NL_ASSERTION.value]
        info["nl"] = {"note": "NL assertions not evaluated: no judge endpoint was given"}
        return None
    return 1.0 if all(c.met for c in nl_checks) else 0.0


async def evaluate_with_judge(
    domain: Domain,
    task: Task,
    messages: Sequence[Any],
    termination_reason: str,
    judge: NLJudge | None,
) -> RewardInfo:
    """`evaluate`, asking `judge` first about the task's NL assertions when it has any; the
    verdicts (with their justifications) are the reward's `nl_assertions`, and what the judge
    was goes in `info["judge"]`.

    Raises:
        JudgeError: when the judge fails after its retries (the caller reports the episode as an
            infrastructure error).
    """
    nl_checks = None
    criteria = task.evaluation_criteria
    if (
        judge is not None
        and termination_reason in NORMAL_ENDINGS
        and criteria is not None
        and criteria.nl_assertions
        and RewardType.NL_ASSERTION in criteria.reward_basis
    ):
        nl_checks = await judge.judge(criteria.nl_assertions, messages, task_id=task.id)
    info = evaluate(domain, task, messages, termination_reason, nl_checks=nl_checks)
    if nl_checks is not None and judge is not None:
        info.info = {**(info.info or {}), "judge": dict(judge.info)}
    return info


# -- pass^k ------------------------------------------------------------------------------


def is_success(reward: float) -> bool:
    """Whether a reward counts as a success (reward ≈ 1)."""
    return abs(reward - 1.0) <= SUCCESS_TOLERANCE


def pass_hat_k(rewards_by_task: Mapping[str, Sequence[float]], k: int) -> float:
    """pass^k: the mean over tasks of C(successes, k) / C(trials, k).

    Raises:
        ValueError: when `k` < 1, there are no tasks, or a task has fewer than `k` trials.
    """
    if k < 1:
        raise ValueError("k must be at least 1")
    if not rewards_by_task:
        raise ValueError("pass^k needs at least one task")
    total = 0.0
    for task_id, rewards in rewards_by_task.items():
        trials = len(rewards)
        if trials < k:
            raise ValueError(f"task {task_id} has {trials} trials, fewer than k={k}")
        successes = sum(1 for r in rewards if is_success(r))
        total += math.comb(successes, k) / math.comb(trials, k)
    return total / len(rewards_by_task)
