"""The agent's wire protocols, without a network: each protocol's request reads back as the same chat
conversation, tool errors are written as each protocol writes them, and answers read back in chat's
words. (`test_replay_api.py` runs whole episodes over each protocol through the real proxy.)"""

from __future__ import annotations

import itertools
from typing import Any

from evalkit.agent import to_openai_messages
from evalkit.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from evalkit.sim.requests import messages_conversation, responses_conversation
from evalkit.wire import (
    messages_tools,
    messages_turns,
    read_messages,
    read_responses,
    responses_input,
    responses_tools,
)

SYSTEM = "You are a customer service agent."


def make_history() -> list[Any]:
    """An episode with a valid call, two calls at once (one malformed, one failing in the
    environment), text beside a call, and the customer's replies."""
    return [
        AssistantMessage(content="Hi! How can I help you today?"),
        UserMessage(content="My email is a@b.c"),
        AssistantMessage(
            tool_calls=[
                ToolCall(id="c1", name="find_user_id_by_email", arguments={"email": "a@b.c"})
            ]
        ),
        ToolMessage(id="c1", content="user_1"),
        AssistantMessage(
            tool_calls=[
                ToolCall(id="c2", name="get_user_details", raw_arguments='{"user_id": "user_1"'),
                ToolCall(id="c3", name="cancel_pending_order", arguments={"order_id": "#W1"}),
            ]
        ),
        ToolMessage(id="c2", content="Error: Arguments of tool 'get_user_details' …", error=True),
        ToolMessage(id="c3", content="Error: Non-pending order cannot be cancelled", error=True),
        AssistantMessage(
            content="Let me look again.",
            tool_calls=[ToolCall(id="c4", name="get_order_details", arguments={"order_id": "#W1"})],
        ),
        ToolMessage(id="c4", content='{"status": "delivered"}'),
        AssistantMessage(content="The order was delivered. Anything else?"),
        UserMessage(content="No, thanks. ###STOP###"),
    ]


def test_a_responses_request_reads_back_as_the_chat_conversation() -> None:
    history = make_history()
    body = {"instructions": SYSTEM, "input": responses_input(history)}
    assert responses_conversation(body) == to_openai_messages(SYSTEM, history)


def test_a_messages_request_reads_back_as_the_chat_conversation() -> None:
    history = make_history()
    body = {"system": SYSTEM, "messages": messages_turns(history)}
    assert messages_conversation(body) == to_openai_messages(SYSTEM, history)


def test_messages_answers_to_one_turns_calls_share_a_user_turn_with_is_error_on_failures() -> None:
    turns = messages_turns(make_history())
    roles = [t["role"] for t in turns]
    assert all(a != b for a, b in itertools.pairwise(roles)), roles
    results = [b for t in turns for b in t["content"] if b["type"] == "tool_result"]
    assert [(b["tool_use_id"], b["is_error"]) for b in results] == [
        ("c1", False),
        ("c2", True),
        ("c3", True),
        ("c4", False),
    ]
    (both,) = [t for t in turns if {b.get("tool_use_id") for b in t["content"]} == {"c2", "c3"}]
    assert len(both["content"]) == 2
    # A malformed call goes back as the model wrote it.
    uses = {b["id"]: b["input"] for t in turns for b in t["content"] if b["type"] == "tool_use"}
    assert uses["c2"] == '{"user_id": "user_1"'
    assert uses["c3"] == {"order_id": "#W1"}


def test_responses_tool_errors_are_output_text_starting_with_error() -> None:
    items = responses_input(make_history())
    outputs = {i["call_id"]: i["output"] for i in items if i["type"] == "function_call_output"}
    assert outputs["c3"].startswith("Error")
    assert not outputs["c1"].startswith("Error")
    calls = [i for i in items if i["type"] == "function_call"]
    assert [c["call_id"] for c in calls] == ["c1", "c2", "c3", "c4"]
    assert calls[1]["arguments"] == '{"user_id": "user_1"'


def test_tools_are_declared_in_each_protocols_shape() -> None:
    chat = [
        {
            "type": "function",
            "function": {
                "name": "get_order_details",
                "description": "Details of an order.",
                "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
            },
        }
    ]
    parameters = chat[0]["function"]["parameters"]
    assert responses_tools(chat) == [
        {
            "type": "function",
            "name": "get_order_details",
            "description": "Details of an order.",
            "parameters": parameters,
            "strict": False,
        }
    ]
    assert messages_tools(chat) == [
        {
            "name": "get_order_details",
            "description": "Details of an order.",
            "input_schema": parameters,
        }
    ]


def test_answers_read_back_in_chat_words() -> None:
    responses = read_responses(
        {
            "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
            "output": [
                {"type": "reasoning", "summary": []},
                {"type": "message", "content": [{"type": "output_text", "text": "Let me"}]},
                {"type": "function_call", "call_id": "c9", "name": "f", "arguments": '{"a": '},
            ],
            "usage": {"input_tokens": 10, "output_tokens": 3},
        }
    )
    assert responses.content == "Let me"
    assert responses.calls == [("c9", "f", '{"a": ')]
    assert responses.finish_reason == "length"
    assert responses.usage == {"completion_tokens": 3, "prompt_tokens": 10}
    messages = read_messages(
        {
            "content": [
                {"type": "thinking", "thinking": "…", "signature": "s"},
                {"type": "text", "text": "On it."},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
                {"type": "tool_use", "id": "t2", "name": "g", "input": "{'a': 1}"},
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 7, "output_tokens": 2},
        }
    )
    assert messages.content == "On it."
    assert messages.calls == [("t1", "f", '{"a": 1}'), ("t2", "g", "{'a': 1}")]
    assert messages.finish_reason == "tool_calls"
    assert read_messages({"content": [], "stop_reason": "end_turn"}).content is None
