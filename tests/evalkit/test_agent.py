"""The agent talks to a real OpenAI-compatible server over loopback with the real openai SDK."""

from __future__ import annotations

import asyncio
import json

from openai import AsyncOpenAI

from evalkit.agent import LLMAgent, OracleAgent, next_gold_action
from evalkit.domains.base import Domain
from evalkit.env import Environment
from evalkit.messages import AssistantMessage, ToolCall, UserMessage
from evalkit.orchestrator import run_episode
from evalkit.scoring import evaluate
from evalkit.users import ScriptedUser
from evalkit.wire import ChatWire
from tests.evalkit.conftest import Reply, ScriptedChatServer, completion


def make_agent(client: AsyncOpenAI, domain: Domain, task_id: str = "7") -> LLMAgent:
    tools, _ = domain.toolkit_classes()
    return LLMAgent(
        ChatWire(client),
        "scripted",
        policy=domain.policy,
        tools=tools.openai_tools(),
        session_id=f"session-{task_id}",
        task_id=task_id,
    )


async def test_agent_sends_policy_tools_and_episode_headers_and_keeps_proxy_headers(
    chat_server: ScriptedChatServer, chat_client: AsyncOpenAI, retail: Domain
) -> None:
    chat_server.replies.append(
        Reply(
            completion(tool_calls=[("call_1", "find_user_id_by_email", '{"email": "a@b.c"}')]),
            headers={"x-toolsentry-errors": "1", "x-toolsentry-violations": "unknown_tool"},
        )
    )
    agent = make_agent(chat_client, retail)
    history = [AssistantMessage(content="Hi!"), UserMessage(content="My email is a@b.c")]
    message = await agent.respond(history)

    assert message.tool_calls is not None
    assert message.tool_calls[0].name == "find_user_id_by_email"
    assert message.tool_calls[0].arguments == {"email": "a@b.c"}
    assert message.proxy_headers == {
        "x-toolsentry-errors": "1",
        "x-toolsentry-violations": "unknown_tool",
    }
    assert message.usage == {"completion_tokens": 5, "prompt_tokens": 10}
    (request,) = chat_server.requests
    assert request["headers"]["x-session-id"] == "session-7"
    assert request["headers"]["x-evalkit-task"] == "7"
    body = request["body"]
    assert body["messages"][0]["role"] == "system"
    assert retail.policy in body["messages"][0]["content"]
    assert [m["role"] for m in body["messages"][1:]] == ["assistant", "user"]
    names = {t["function"]["name"] for t in body["tools"]}
    assert "exchange_delivered_order_items" in names
    assert len(names) == 16


async def test_arguments_that_are_not_json_are_kept_and_answered_with_an_error(
    chat_server: ScriptedChatServer, chat_client: AsyncOpenAI, retail: Domain
) -> None:
    chat_server.replies.append(
        Reply(completion(tool_calls=[("call_1", "get_order_details", '{"order_id": "#W1')]))
    )
    message = await make_agent(chat_client, retail).respond([UserMessage(content="hi")])
    assert message.tool_calls is not None
    call = message.tool_calls[0]
    assert call.raw_arguments == '{"order_id": "#W1'
    env = Environment(retail)
    assert env.execute(call).error
    assert env.errors == 1


async def test_a_whole_episode_over_http_scores_one_and_records_the_proxy_turns(
    chat_server: ScriptedChatServer, chat_client: AsyncOpenAI, retail: Domain
) -> None:
    task = retail.tasks[0]
    for i, action in enumerate(task.gold_actions):
        chat_server.replies.append(
            Reply(
                completion(tool_calls=[(f"call_{i}", action.name, json.dumps(action.arguments))]),
                headers={"x-toolsentry-errors": "0", "x-toolsentry-session": "session-0"},
            )
        )
    chat_server.replies.append(Reply(completion("It is all done. Goodbye!")))
    agent = make_agent(chat_client, retail, task.id)
    sim = await run_episode(retail, task, agent, ScriptedUser(task))
    assert sim.termination_reason == "user_stop"
    info = evaluate(retail, task, sim.messages, sim.termination_reason)
    assert info.reward == 1.0
    assert sim.toolsentry is not None
    assert len(sim.toolsentry["turns"]) == len(task.gold_actions)
    assert sim.toolsentry["session"] == "session-0"
    # every request resends the conversation so far, with the tool answers in order
    last = chat_server.requests[-1]["body"]["messages"]
    assert [m["role"] for m in last].count("tool") == len(task.gold_actions)


async def test_the_proxys_budget_refusal_ends_the_episode_with_too_many_errors(
    chat_server: ScriptedChatServer, chat_client: AsyncOpenAI, retail: Domain
) -> None:
    refusal = {
        "error": {
            "message": "error budget exhausted",
            "type": "error_budget_exhausted",
            "param": None,
            "code": None,
        }
    }
    chat_server.replies.append(Reply(refusal, status=429, headers={"x-should-retry": "false"}))
    task = retail.tasks[0]
    sim = await run_episode(retail, task, make_agent(chat_client, retail), ScriptedUser(task))
    assert sim.termination_reason == "too_many_errors"
    assert sim.toolsentry is not None
    assert "refused the turn (error_budget_exhausted)" in sim.toolsentry["failure"]


async def test_a_failing_endpoint_ends_the_episode_with_infrastructure_error(
    chat_server: ScriptedChatServer, chat_client: AsyncOpenAI, retail: Domain
) -> None:
    chat_server.replies.append(Reply({"error": {"message": "boom", "type": "server_error"}}, 500))
    task = retail.tasks[0]
    sim = await run_episode(retail, task, make_agent(chat_client, retail), ScriptedUser(task))
    assert sim.termination_reason == "infrastructure_error"


async def test_episodes_run_concurrently_each_with_its_own_session(
    chat_server: ScriptedChatServer, chat_client: AsyncOpenAI, retail: Domain
) -> None:
    # Every reply is the server's default "Goodbye!", so each episode is a short exchange.
    tasks = retail.tasks[:6]
    sims = await asyncio.gather(
        *(
            run_episode(retail, t, make_agent(chat_client, retail, t.id), ScriptedUser(t))
            for t in tasks
        )
    )
    assert [s.task_id for s in sims] == [t.id for t in tasks]
    assert all(s.termination_reason == "user_stop" for s in sims)
    sessions = {r["headers"]["x-session-id"] for r in chat_server.requests}
    assert sessions == {f"session-{t.id}" for t in tasks}
    for request in chat_server.requests:
        session = request["headers"]["x-session-id"]
        assert session == f"session-{request['headers']['x-evalkit-task']}"


async def test_oracle_agent_asks_the_user_for_the_users_gold_actions(tau2_telecom: Domain) -> None:
    task = tau2_telecom.tasks[0]  # gold: user toggle_data, then agent refuel_data
    agent = OracleAgent(task)
    history: list[object] = [AssistantMessage(content="Hi!"), UserMessage(content="Help.")]
    ask = await agent.respond(history)
    assert ask.content == "Please do this on your device: toggle_data({})"
    assert next_gold_action(task.gold_actions, history) == task.gold_actions[0]
    history += [
        ask,
        UserMessage(tool_calls=[ToolCall(id="u", name="toggle_data", requestor="user")]),
    ]
    call = await agent.respond(history)
    assert [(c.name, c.arguments) for c in call.tool_calls or []] == [
        ("refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": 2.0})
    ]
    history += [call]
    assert next_gold_action(task.gold_actions, history) is None
    assert (await agent.respond(history)).content == "All done. Goodbye!"
