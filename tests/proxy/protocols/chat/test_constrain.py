"""Tests for proxy/protocols/chat/constrain.py."""

from __future__ import annotations

import copy

from proxy.protocols.chat.constrain import constrain
from tests.proxy.protocols.constrain_plans import NAMED, NONE, STRICT, chat_body


def test_chat_gets_the_named_choice_strict_tools_and_one_call() -> None:
    body = chat_body()
    before = copy.deepcopy(body)
    out = constrain(body, NAMED)
    assert body == before
    assert out["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert out["parallel_tool_calls"] is False
    lookup, free = out["tools"]
    assert lookup["function"]["strict"] is True
    assert lookup["function"]["parameters"] == STRICT.schema
    assert free == before["tools"][1]


def test_chat_none_changes_only_the_choice() -> None:
    out = constrain(chat_body(), NONE)
    assert out == {**chat_body(), "tool_choice": "none"}
