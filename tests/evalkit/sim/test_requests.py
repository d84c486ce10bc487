"""Responses and Messages requests read back as the chat conversation they carry."""

from __future__ import annotations

from typing import Any

import pytest

from evalkit.sim.conversation import read_conversation
from evalkit.sim.requests import (
    RequestShapeError,
    chat_tools,
    messages_conversation,
    responses_conversation,
)
from tests.evalkit.sim.builders import (
    OPENING,
    assistant_call,
    messages_request,
    messages_tools,
    responses_request,
    responses_tools,
    tool_answer,
)

CORRECTIVE = "Error: tool 'find_user' does not exist. Available tools: a, b. Call one of these, or answer without a tool."
EPISODE: list[dict[str, Any]] = [
    *OPENING,
    {
        "role": "assistant",
        "content": "Let me look you up.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "b", "arguments": "{}"}},
        ],
    },
    tool_answer("c1", "found"),
    tool_answer("c2", "Error: Tool 'b' failed."),
    {"role": "user", "content": "Thanks."},
    assistant_call("find_user", '{"name": "Yusuf"}', "c3"),
    tool_answer("c3", CORRECTIVE),
]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "a", "description": "A.", "parameters": {"type": "object"}},
    }
]


def test_a_responses_request_reads_as_its_chat_conversation() -> None:
    instructions, items = responses_request(EPISODE)
    read = responses_conversation({"instructions": instructions, "input": items})
    assert read == EPISODE
    assert read_conversation(read).attempt == 1  # the proxy's re-ask is seen as one


def test_a_messages_request_reads_as_its_chat_conversation() -> None:
    system, messages = messages_request(EPISODE)
    read = messages_conversation({"system": system, "messages": messages})
    assert read == EPISODE
    assert read_conversation(read).attempt == 1


def test_input_text_system_blocks_and_developer_items_are_read_as_plain_messages() -> None:
    assert responses_conversation({"input": "Hi"}) == [{"role": "user", "content": "Hi"}]
    items = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "Be kind."}],
        },
        {"type": "reasoning", "summary": []},
    ]
    assert responses_conversation({"input": items}) == [{"role": "system", "content": "Be kind."}]
    system = [{"type": "text", "text": "Policy."}]
    turn = {
        "role": "user",
        "content": [{"type": "image", "source": {}}, {"type": "text", "text": "Hi"}],
    }
    assert messages_conversation({"system": system, "messages": [turn]}) == [
        {"role": "system", "content": "Policy."},
        {"role": "user", "content": "Hi"},
    ]


def test_a_malformed_tool_use_input_repeats_as_the_text_it_was() -> None:
    turn = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "c", "name": "a", "input": "{'x': 1}"}],
    }
    (read,) = messages_conversation({"messages": [turn]})
    assert read["tool_calls"][0]["function"]["arguments"] == "{'x': 1}"


def test_tools_of_both_protocols_read_as_chat_tools_and_built_ins_are_left_out() -> None:
    assert chat_tools(responses_tools(TOOLS)) == TOOLS
    assert chat_tools(messages_tools(TOOLS)) == TOOLS
    namespaced = [
        {"type": "namespace", "name": "ns", "tools": responses_tools(TOOLS)},
        {"type": "web_search"},
        {"type": "web_search_20250305", "name": "web_search"},
    ]
    assert chat_tools(namespaced) == TOOLS
    assert chat_tools(None) is None


def test_a_conversation_that_is_not_a_list_is_refused() -> None:
    with pytest.raises(RequestShapeError, match="'input'"):
        responses_conversation({"input": 3})
    with pytest.raises(RequestShapeError, match="'messages'"):
        messages_conversation({"messages": "Hi"})
