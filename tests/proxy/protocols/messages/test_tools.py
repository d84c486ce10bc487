"""Tests for proxy/protocols/messages/tools.py: a Messages request's tools and `tool_choice` in the
guard's chat form."""

from __future__ import annotations

import pytest

from proxy.errors import BadRequestError
from proxy.guard.toolcheck import validate
from proxy.protocols.messages.tools import chat_tools, tool_choice
from tests.proxy.protocols.messages.test_adapter import PROTOCOL, TOOLS, guard_call


def test_custom_tools_read_as_functions_and_server_tools_are_left_out() -> None:
    assert chat_tools([*TOOLS, {"name": "Read", "description": "Read a file", "type": "custom"}]) == [
        {"type": "function", "function": {"name": "Bash", "parameters": TOOLS[0]["input_schema"]}},
        {"type": "function", "function": {"name": "Read", "parameters": {}, "description": "Read a file"}},
    ]  # fmt: skip


@pytest.mark.parametrize("tools", [["Bash"], [{"input_schema": {}}], [{"name": ""}]])
def test_a_tool_that_is_not_an_object_or_has_no_name_is_refused(tools: list[object]) -> None:
    with pytest.raises(BadRequestError) as raised:
        chat_tools(tools)
    assert raised.value.param == "tools"


@pytest.mark.parametrize(
    ("choice", "guard"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "Bash"}, {"type": "function", "function": {"name": "Bash"}}),
        ({"type": "tool"}, None),
        ("auto", None),
    ],
)
def test_tool_choice_is_read_in_the_guards_form(choice: object, guard: object) -> None:
    assert tool_choice(choice) == guard


def test_server_tools_are_not_declared_functions_and_a_tool_without_a_name_is_refused() -> None:
    index = PROTOCOL.compile_tools(TOOLS)
    found = validate(
        {"role": "assistant", "content": None, "tool_calls": [guard_call("web_search", "{}")]},
        None,
        index=index,
    )
    assert [v.channel.value for v in found] == [
        "unknown_tool"
    ]  # called as a function, it is not one
    with pytest.raises(BadRequestError, match="needs a 'name'"):
        PROTOCOL.compile_tools([{"input_schema": {}}])
