"""The reader tells the proxy's corrective re-ask rounds from the episode's own turns."""

from __future__ import annotations

import pytest

from evalkit.domains import get_domain
from evalkit.sim.conversation import (
    is_corrective_tool_text,
    is_corrective_user_text,
    read_conversation,
)
from proxy.guard.repair import NOT_EXECUTED, corrective_messages
from proxy.guard.toolcheck import compile_tools, validate
from tests.evalkit.sim.builders import OPENING, agent_tools, assistant_call, tool_answer


@pytest.fixture(scope="module")
def tools() -> list[dict[str, object]]:
    return agent_tools(get_domain("retail"))


def reask(message: dict[str, object], tools: list[dict[str, object]]) -> list[dict[str, object]]:
    """The messages the proxy appends to re-ask `message`."""
    return corrective_messages(message, validate(message, tools), compile_tools(tools))


@pytest.mark.parametrize(
    "message",
    [
        assistant_call("cancel_order", {"order_id": "#W1"}, "c1"),
        assistant_call("get_order_details", '{"order_id": "#W1"', "c1"),
        assistant_call("get_order_details", {}, "c1"),
        {
            "role": "assistant",
            "content": '<tool_call>\n{"name": "get_order_details", "arguments": {}}\n</tool_call>',
        },
        {"role": "assistant", "content": ""},
    ],
    ids=["unknown_tool", "malformed", "schema", "leaked", "empty"],
)
def test_every_corrective_round_of_the_proxy_is_recognised(
    message: dict[str, object], tools: list[dict[str, object]]
) -> None:
    request = [*OPENING, *reask(message, tools)]
    conversation = read_conversation(request)
    assert conversation.attempt == 1
    assert conversation.messages == OPENING[1:]
    assert conversation.turn == 1

    twice = [*request, *reask(message, tools)]
    assert read_conversation(twice).attempt == 2


def test_environment_errors_are_turns_of_the_episode_not_reasks() -> None:
    request = [
        *OPENING,
        assistant_call("cancel_order", {"order_id": "#W1"}, "c1"),
        tool_answer("c1", "Error: Tool 'cancel_order' not found."),
    ]
    conversation = read_conversation(request)
    assert conversation.attempt == 0
    assert conversation.turn == 2
    (executed,) = conversation.executed_calls()
    assert executed.name == "cancel_order"
    assert executed.error


def test_corrective_texts_are_told_from_environment_and_customer_texts() -> None:
    assert is_corrective_tool_text(NOT_EXECUTED)
    assert is_corrective_tool_text("Error: tool 'x' does not exist. Available tools: a, b.")
    assert not is_corrective_tool_text("Error: Tool 'x' not found.")
    assert not is_corrective_tool_text("Error: Order not found")
    assert not is_corrective_tool_text('{"order_id": "#W1"}')
    assert is_corrective_user_text("Your last reply was empty. Answer, or call a tool.")
    assert not is_corrective_user_text("Yes, please go ahead.")


def test_a_customer_reply_after_an_assistant_text_is_not_a_round() -> None:
    request = [
        *OPENING,
        {"role": "assistant", "content": "Shall I?"},
        {"role": "user", "content": "Yes."},
    ]
    assert read_conversation(request).attempt == 0


def test_answered_asks_count_only_asks_a_customer_replied_to() -> None:
    request = [
        *OPENING,
        {"role": "assistant", "content": "Please do X now."},
        {"role": "user", "content": "Done."},
        {"role": "assistant", "content": "Please do X now."},
    ]
    conversation = read_conversation(request)
    assert conversation.answered_asks("do X") == 1
    assert conversation.says("do X")
    assert not conversation.says("do Y")
