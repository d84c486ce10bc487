"""Tests for proxy/protocols/base.py: the shared enums and what every adapter shares."""

from __future__ import annotations

import pytest

from proxy.errors import BadRequestError
from proxy.guard.strict import strict_form
from proxy.protocols.base import API, Adapter, Finish, strict_tool

SCHEMA = {"type": "object", "properties": {"id": {"type": "string"}}}


def test_the_enums_are_the_words_on_the_wire() -> None:
    assert [str(a) for a in API] == ["chat", "responses", "messages"]
    assert [str(f) for f in Finish] == ["stop", "tool_calls", "length"]
    assert {"chat": 1}[API.CHAT] == 1  # a label lookup by the enum finds the plain word


def test_a_body_without_a_conversation_or_with_tools_not_a_list_is_a_bad_request() -> None:
    assert Adapter.declared_tools({}) == []
    with pytest.raises(BadRequestError, match="'tools'"):
        Adapter.declared_tools({"tools": {}})
    with pytest.raises(BadRequestError, match="'messages'"):
        Adapter.conversation({"messages": []})


def test_a_top_level_tool_is_declared_strict_in_its_strict_form_and_others_are_left_alone() -> None:
    form = strict_form(SCHEMA)
    tool = {"type": "function", "name": "get", "parameters": SCHEMA}
    assert strict_tool(tool, {"get": form}, "parameters") == {
        **tool,
        "parameters": form.schema,
        "strict": True,
    }
    assert strict_tool(tool, {}, "parameters") == tool
    assert strict_tool({"type": "web_search"}, {"get": form}, "parameters") == {
        "type": "web_search"
    }
