"""The episode loop's endings and error budget follow τ²-bench."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from evalkit.agent import OracleAgent
from evalkit.domains.base import Domain
from evalkit.errors import AgentError, EndpointError
from evalkit.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from evalkit.orchestrator import GREETING, run_episode
from evalkit.scoring import evaluate
from evalkit.termination import TerminationReason
from evalkit.users import ScriptedUser


class ScriptAgent:
    """Plays a fixed list of replies, then repeats the last one."""

    def __init__(self, replies: Sequence[AssistantMessage | Exception]) -> None:
        self.replies = list(replies)
        self.turns = 0

    async def respond(self, history: Sequence[Any]) -> AssistantMessage:
        reply = self.replies[min(self.turns, len(self.replies) - 1)]
        self.turns += 1
        if isinstance(reply, Exception):
            raise reply
        return reply.model_copy(deep=True)


class ChattyUser:
    async def respond(self, history: Sequence[Any]) -> UserMessage:
        return UserMessage(content="Please go on.")


def bad_call(name: str = "get_weather") -> AssistantMessage:
    return AssistantMessage(tool_calls=[ToolCall(id="c", name=name, arguments={})])


@pytest.mark.parametrize("max_errors", [1, 2, 5, 10])
async def test_episode_ends_with_too_many_errors_exactly_at_the_max_errors_th_error(
    retail: Domain, max_errors: int
) -> None:
    task = retail.tasks[0]
    sim = await run_episode(
        retail, task, ScriptAgent([bad_call()]), ChattyUser(), max_errors=max_errors
    )
    assert sim.termination_reason == TerminationReason.TOO_MANY_ERRORS
    errors = [m for m in sim.messages if isinstance(m, ToolMessage) and m.error]
    assert len(errors) == max_errors
    assert isinstance(sim.messages[-1], ToolMessage)
    assert sim.toolsentry is not None
    assert sim.toolsentry["episode_errors"] == max_errors


async def test_errors_in_one_message_all_count_before_the_check(retail: Domain) -> None:
    calls = [ToolCall(id=f"c{i}", name="nope", arguments={}) for i in range(3)]
    sim = await run_episode(
        retail,
        retail.tasks[0],
        ScriptAgent([AssistantMessage(tool_calls=calls)]),
        ChattyUser(),
        max_errors=2,
    )
    assert sim.termination_reason == "too_many_errors"
    assert sum(1 for m in sim.messages if isinstance(m, ToolMessage) and m.error) == 3


async def test_episode_ends_with_max_steps(retail: Domain) -> None:
    sim = await run_episode(
        retail,
        retail.tasks[0],
        ScriptAgent([AssistantMessage(content="Tell me more.")]),
        ChattyUser(),
        max_steps=7,
    )
    assert sim.termination_reason == "max_steps"
    assert len(sim.messages) == 8  # the greeting and one message per step


async def test_greeting_comes_first_and_turns_are_numbered(retail: Domain) -> None:
    task = retail.tasks[0]
    sim = await run_episode(retail, task, OracleAgent(task), ScriptedUser(task))
    assert sim.messages[0].content == GREETING
    assert [m.turn_idx for m in sim.messages] == list(range(len(sim.messages)))
    assert sim.termination_reason == "user_stop"
    assert sim.task_id == task.id
    assert sim.trial == 0
    assert sim.duration is not None


async def test_agent_stop_token_ends_the_episode(retail: Domain) -> None:
    sim = await run_episode(
        retail, retail.tasks[0], ScriptAgent([AssistantMessage(content="###STOP###")]), ChattyUser()
    )
    assert sim.termination_reason == "agent_stop"


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (AgentError("broken"), "agent_error"),
        (AssistantMessage(content="  "), "agent_error"),
        (EndpointError("down", status=502), "infrastructure_error"),
        (
            EndpointError("budget", status=429, error_type="error_budget_exhausted"),
            "too_many_errors",
        ),
    ],
)
async def test_agent_failures_end_the_episode_with_their_reason(
    retail: Domain, failure: AssistantMessage | Exception, reason: str
) -> None:
    sim = await run_episode(retail, retail.tasks[0], ScriptAgent([failure]), ChattyUser())
    assert sim.termination_reason == reason
    if isinstance(failure, Exception):
        assert sim.toolsentry is not None
        assert sim.toolsentry["failure"]


async def test_premature_endings_score_zero(retail: Domain) -> None:
    task = retail.tasks[0]
    sim = await run_episode(retail, task, ScriptAgent([bad_call()]), ChattyUser(), max_errors=1)
    info = evaluate(retail, task, sim.messages, sim.termination_reason)
    assert info.reward == 0.0
    assert info.db_check is None
    assert info.info is not None
    assert "too_many_errors" in info.info["note"]


async def test_oracle_scores_one_on_every_shipped_task(retail: Domain) -> None:
    failures = {}
    for task in retail.tasks:
        sim = await run_episode(retail, task, OracleAgent(task), ScriptedUser(task))
        info = evaluate(retail, task, sim.messages, sim.termination_reason)
        if info.reward != 1.0 or sim.termination_reason != "user_stop":
            failures[task.id] = (sim.termination_reason, info.reward_breakdown)
    assert failures == {}


async def test_oracle_scores_one_on_every_tau2_retail_task(tau2_retail: Domain) -> None:
    assert len(tau2_retail.tasks) == 114
    failures = {}
    for task in tau2_retail.tasks:
        sim = await run_episode(tau2_retail, task, OracleAgent(task), ScriptedUser(task))
        info = evaluate(tau2_retail, task, sim.messages, sim.termination_reason)
        if info.reward != 1.0:
            failures[task.id] = (sim.termination_reason, info.reward_breakdown)
    assert failures == {}
