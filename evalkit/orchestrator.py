"""The episode loop: agent ↔ user ↔ environment, with τ²-bench's turn rules and endings.

The agent greets first ("Hi! How can I help you today?"). Each step passes one message on: a
user or agent text goes to the other side, a message with tool calls goes to the environment,
whose answers go back to the caller. After every step that does not wait for the environment,
the episode ends with `max_steps` when the step count reaches `max_steps`, and with
`too_many_errors` when the environment's error count reaches `max_errors` (these override a
stop in the same step, as in τ²-bench). A user message with `###STOP###`, `###TRANSFER###` or
`###OUT-OF-SCOPE###` ends it with `user_stop`; an agent message with `###STOP###` with
`agent_stop`. An agent or user that breaks the protocol ends it with `agent_error` or
`user_error`, a failing endpoint with `infrastructure_error` — except the proxy's
`error_budget_exhausted`, which is its error budget running out: `too_many_errors`.

`run_episode` is a coroutine, so many episodes run concurrently on one event loop.
"""

from __future__ import annotations

import enum
import time
import uuid
from typing import Any, NamedTuple

from evalkit.agent import Agent
from evalkit.domains.base import Domain
from evalkit.env import Environment
from evalkit.errors import AgentError, EndpointError, UserSimulatorError
from evalkit.formats import SimulationRun, toolsentry_block
from evalkit.messages import (
    AssistantMessage,
    ToolMessage,
    UserMessage,
    is_agent_stop,
    is_user_stop,
    now_iso,
)
from evalkit.tasks import Task
from evalkit.termination import TerminationReason
from evalkit.users import UserSimulator

DEFAULT_MAX_STEPS = 200
DEFAULT_MAX_ERRORS = 10
GREETING = "Hi! How can I help you today?"
BUDGET_EXHAUSTED = "error_budget_exhausted"


class _Role(enum.Enum):
    AGENT = "agent"
    USER = "user"
    ENV = "env"


async def run_episode(
    domain: Domain,
    task: Task,
    agent: Agent,
    user: UserSimulator,
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
    max_errors: int = DEFAULT_MAX_ERRORS,
    trial: int = 0,
    seed: int | None = None,
    simulation_id: str | None = None,
) -> SimulationRun:
    """Play one episode of `task` and return it as a simulation (without `reward_info`).

    The simulation's `toolsentry` block is filled from the proxy headers the agent recorded,
    and carries `episode_errors` (the environment's count) and `failure` (what ended an
    `*_error` episode). Never raises for anything the agent, user or endpoints do.
    """
    env = Environment(domain, task)
    start_time = now_iso()
    started = time.perf_counter()
    greeting = AssistantMessage(content=GREETING, timestamp=now_iso(), cost=0.0)
    trajectory: list[Any] = [greeting]
    message: Any = greeting
    sender, receiver = _Role.AGENT, _Role.USER
    steps = 0
    reason: TerminationReason | None = None
    failure: str | None = None

    while reason is None:
        if receiver is _Role.USER:
            reply = await _ask_user(user, trajectory)
            if isinstance(reply, _Ended):
                reason, failure = reply
                break
            if is_user_stop(reply):
                reason = TerminationReason.USER_STOP
            trajectory.append(reply)
            message, sender = reply, _Role.USER
            receiver = _Role.ENV if reply.is_tool_call() else _Role.AGENT
        elif receiver is _Role.AGENT:
            answer = await _ask_agent(agent, trajectory)
            if isinstance(answer, _Ended):
                reason, failure = answer
                break
            if is_agent_stop(answer):
                reason = TerminationReason.AGENT_STOP
            trajectory.append(answer)
            message, sender = answer, _Role.AGENT
            receiver = _Role.ENV if answer.is_tool_call() else _Role.USER
        else:
            trajectory.extend(_run_tools(env, message, sender))
            sender, receiver = _Role.ENV, sender
        steps += 1
        if receiver is not _Role.ENV:
            if steps >= max_steps:
                reason = TerminationReason.MAX_STEPS
            if env.errors >= max_errors:
                reason = TerminationReason.TOO_MANY_ERRORS

    block = _finish_trajectory(trajectory, env.errors, failure)
    end_time = now_iso()
    return SimulationRun(
        id=simulation_id or str(uuid.uuid4()),
        task_id=task.id,
        timestamp=end_time,
        start_time=start_time,
        end_time=end_time,
        duration=time.perf_counter() - started,
        termination_reason=reason.value,
        agent_cost=_cost(trajectory, AssistantMessage),
        user_cost=_cost(trajectory, UserMessage),
        messages=trajectory,
        trial=trial,
        seed=seed,
        toolsentry=block,
    )


class _Ended(NamedTuple):
    """Why an episode ends without the next message, and what failed."""

    reason: TerminationReason
    failure: str


def _finish_trajectory(trajectory: list[Any], errors: int, failure: str | None) -> dict[str, Any]:
    """Number the turns of an ended `trajectory` and return its `toolsentry` block, with the
    environment's error count and what failed."""
    for index, m in enumerate(trajectory):
        m.turn_idx = index
    block = toolsentry_block(trajectory)
    block["episode_errors"] = errors
    block["failure"] = failure
    return block


async def _ask_user(user: UserSimulator, trajectory: list[Any]) -> Any:
    """The user's next message, or why the episode ends (`_Ended`)."""
    try:
        reply = await user.respond(list(trajectory))
        if not reply.is_tool_call() and not reply.has_text():
            raise UserSimulatorError("the user sent an empty message")
    except UserSimulatorError as exc:
        return _Ended(TerminationReason.USER_ERROR, exc.message)
    except EndpointError as exc:
        return _Ended(TerminationReason.INFRASTRUCTURE_ERROR, exc.message)
    return reply


async def _ask_agent(agent: Agent, trajectory: list[Any]) -> Any:
    """The agent's next message, or why the episode ends (`_Ended`; the proxy's exhausted error
    budget ends it as too many errors)."""
    try:
        answer = await agent.respond(list(trajectory))
        if not answer.is_tool_call() and not answer.has_text():
            raise AgentError("the agent sent an empty message")
    except AgentError as exc:
        return _Ended(TerminationReason.AGENT_ERROR, exc.message)
    except EndpointError as exc:
        reason = (
            TerminationReason.TOO_MANY_ERRORS
            if exc.error_type == BUDGET_EXHAUSTED
            else TerminationReason.INFRASTRUCTURE_ERROR
        )
        return _Ended(reason, exc.message)
    return answer


def _run_tools(env: Environment, message: Any, sender: _Role) -> list[ToolMessage]:
    """The environment's results of the tool calls in `message`, which `sender` made."""
    requestor = "user" if sender is _Role.USER else "assistant"
    results: list[ToolMessage] = []
    for call in message.tool_calls or []:
        call.requestor = requestor
        results.append(env.execute(call))
    return results


def _cost(messages: list[Any], kind: type) -> float | None:
    costs = [getattr(m, "cost", None) for m in messages if isinstance(m, kind)]
    known = [c for c in costs if isinstance(c, int | float)]
    return float(sum(known)) if known else None
