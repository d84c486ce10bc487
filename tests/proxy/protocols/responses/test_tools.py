"""Tests for proxy/protocols/responses/tools.py: a Responses request's tools, `tool_choice` and call
names in the guard's chat form."""

from __future__ import annotations

import pytest

from proxy.guard.toolcheck import validate
from proxy.protocols.responses.reply import guard_message
from proxy.protocols.responses.tools import call_name, chat_tools, guard_tool_choice
from tests.proxy.protocols.responses.test_adapter import FUNCTION, NAMESPACE, PROTOCOL


def test_functions_inside_a_namespace_are_known_by_their_namespace_and_name() -> None:
    index = PROTOCOL.compile_tools([FUNCTION, NAMESPACE, {"type": "web_search"}])
    assert index.names == ("get", "crm.find")


def test_built_in_tools_are_not_declared_names_and_their_calls_are_never_flagged() -> None:
    tools = [{"type": "web_search"}, {"type": "mcp", "server_label": "x"}]
    assert chat_tools(tools) == []
    message = guard_message(
        [{"type": "web_search_call", "id": "ws_1", "status": "completed"}], None
    )
    index = PROTOCOL.compile_tools([FUNCTION, *tools])
    assert validate(message, None, "required", index=index) == []


@pytest.mark.parametrize(
    ("choice", "guard"),
    [
        ("auto", "auto"),
        ("required", "required"),
        ({"type": "function", "name": "get"}, {"type": "function", "function": {"name": "get"}}),
        ({"type": "web_search"}, "auto"),
        (
            {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get"}]},
            {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "get"}}]}},
        ),
    ],
)  # fmt: skip
def test_tool_choice_is_read_in_the_guards_form(choice: object, guard: object) -> None:
    assert guard_tool_choice(choice) == guard


def test_a_namespaced_function_may_be_named_another_way_and_its_call_is_named_so() -> None:
    (tool,) = chat_tools([NAMESPACE], in_namespace=lambda namespace, name: name)
    assert tool == {"type": "function", "function": {"name": "find"}}
    assert call_name({"name": "find", "namespace": "crm"}) == "crm.find"
    assert call_name({"name": "find"}) == "find"


def test_a_custom_tool_is_a_name_without_a_schema() -> None:
    assert chat_tools([{"type": "custom", "name": "patch"}]) == [
        {"type": "custom", "custom": {"name": "patch"}}
    ]
