"""Conversations without a session header against a real `toolsentry serve`: two conversations
that open with the same words, played interleaved by the real openai SDK (chat completions, and
Responses with an input list and no `previous_response_id`) and the real anthropic SDK
(Messages), are two sessions, and each session counts its own failed tool results, once each.
Their identical openings cannot be told apart (the second is what a retry of the first would
send): it is counted in the first one's session, and from the first answers on, which differ,
each goes on in its own.

The scripted upstream answers every request by what its history holds: a call while fewer than
`CALLS` tool results came back, then a closing text.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from proxy.headers import SESSION_HEADER
from proxy.protocols.answer import Answer
from proxy.protocols.base import API
from proxy.testing import LoopbackServer, ScriptedUpstream, answer, call
from tests.processes import served_with
from tests.proxy.builders import make_tool

CALLS = 3
SYSTEM = "You are a retail agent."
TOOL = make_tool("get_order_details", {"order_id": {"type": "string"}}, ["order_id"])
# Which of its CALLS tool results fail, per conversation: A fails once, B twice.
FAILS = {"A": (True, False, False), "B": (False, True, True)}


def results_in(body: dict[str, Any], api: API) -> int:
    """How many tool results a request's history holds."""
    if api is API.CHAT:
        return sum(1 for m in body["messages"] if m.get("role") == "tool")
    if api is API.RESPONSES:
        return sum(1 for i in body["input"] if i.get("type") == "function_call_output")
    return sum(
        1
        for m in body["messages"]
        if isinstance(m["content"], list)
        for block in m["content"]
        if block.get("type") == "tool_result"
    )


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    script = ScriptedUpstream()

    def reply(body: dict[str, Any]) -> Answer:
        if results_in(body, script.apis[-1]) < CALLS:
            return answer(None, call("get_order_details", {"order_id": "#W1"}))
        return answer("Your order is on its way.")

    script.handler = reply
    with LoopbackServer(script.app) as upstream:
        entry = {"name": "scripted", "base_url": f"{upstream.url}/v1"}
        settings = {"upstreams": [entry], "retries": 0}
        with served_with(settings, tmp_path_factory.mktemp("conversations")) as (port, _):
            yield f"http://127.0.0.1:{port}"


def result_text(failed: bool) -> str:
    return "Error: order service unavailable" if failed else '{"status": "delivered"}'


class Chat:
    """One conversation through the openai SDK's chat completions, as a plain SDK user plays it."""

    def __init__(self, client: openai.OpenAI, opening: str) -> None:
        self.client = client
        self.messages: list[Any] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": opening},
        ]

    def turn(self, fails: bool) -> str:
        raw = self.client.chat.completions.with_raw_response.create(
            model="scripted-model", messages=self.messages, tools=[TOOL]
        )
        message = raw.parse().choices[0].message
        self.messages.append(message)  # the SDK's own object, sent back as the SDK writes it
        for tool_call in message.tool_calls or []:
            result = {"role": "tool", "tool_call_id": tool_call.id, "content": result_text(fails)}
            self.messages.append(result)
        return raw.headers[SESSION_HEADER]


class Responses:
    """One conversation through the openai SDK's Responses API: the whole input list every turn."""

    def __init__(self, client: openai.OpenAI, opening: str) -> None:
        self.client = client
        self.input: list[Any] = [{"role": "user", "content": opening}]

    def turn(self, fails: bool) -> str:
        raw = self.client.responses.with_raw_response.create(
            model="scripted-model",
            instructions=SYSTEM,
            input=self.input,
            tools=[{"type": "function", **TOOL["function"]}],
        )
        response = raw.parse()
        self.input += response.output
        for item in response.output:
            if item.type == "function_call":
                output = result_text(fails)
                self.input.append(
                    {"type": "function_call_output", "call_id": item.call_id, "output": output}
                )
        return raw.headers[SESSION_HEADER]


class Messages:
    """One conversation through the anthropic SDK's Messages API."""

    def __init__(self, client: anthropic.Anthropic, opening: str) -> None:
        self.client = client
        self.messages: list[Any] = [{"role": "user", "content": opening}]

    def turn(self, fails: bool) -> str:
        function = TOOL["function"]
        raw = self.client.messages.with_raw_response.create(
            model="scripted-model",
            max_tokens=256,
            system=SYSTEM,
            messages=self.messages,
            tools=[{"name": function["name"], "input_schema": function["parameters"]}],
        )
        message = raw.parse()
        self.messages.append({"role": "assistant", "content": message.content})
        results = [
            {"type": "tool_result", "tool_use_id": block.id, "content": result_text(fails),
             "is_error": fails}
            for block in message.content
            if block.type == "tool_use"
        ]  # fmt: skip
        if results:
            self.messages.append({"role": "user", "content": results})
        return raw.headers[SESSION_HEADER]


Conversation = Chat | Responses | Messages


def openai_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def anthropic_client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)


PLAYERS: dict[str, Callable[[str, str], Conversation]] = {
    "chat": lambda url, opening: Chat(openai_client(url), opening),
    "responses": lambda url, opening: Responses(openai_client(url), opening),
    "messages": lambda url, opening: Messages(anthropic_client(url), opening),
}


@pytest.mark.parametrize("api", list(PLAYERS))
def test_two_conversations_with_one_opening_are_two_sessions_counting_their_own_failures(
    proxy: str, api: str
) -> None:
    opening = f"Where is my order #W1? ({uuid.uuid4().hex[:6]})"  # apart from other tests'
    conversations = {name: PLAYERS[api](proxy, opening) for name in FAILS}
    seen: dict[str, list[str]] = {name: [] for name in FAILS}
    for turn in range(CALLS + 1):  # interleaved: A, B, A, B, …
        for name, conversation in conversations.items():
            fails = FAILS[name][turn] if turn < CALLS else False
            seen[name].append(conversation.turn(fails))
    a, b = seen["A"], seen["B"]
    assert b[0] == a[0]  # identical so far: one session
    assert set(a) == {a[0]}  # one session for every turn of A
    assert set(b[1:]) == {b[1]}  # and of B, from its first difference on
    assert b[1] != a[0]
    with httpx.Client(base_url=proxy, timeout=30) as http:
        for name, session, requests in (("A", a[0], CALLS + 2), ("B", b[1], CALLS)):
            record = http.get(f"/v1/sessions/{session}").json()
            assert record["requests"] == requests
            assert record["channels"].get("tool_error", 0) == sum(FAILS[name])
