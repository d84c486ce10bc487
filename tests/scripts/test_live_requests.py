"""Tests for scripts/live_requests.py's judge: which failures a client received, by channel,
independent of the proxy's own reading (the live suite compares the two)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scripts.live_requests import TOOLS, Received, failures, written_call


def received(content: str = "", *calls: tuple[str, object], finish: str = "stop") -> Received:
    """What a client got: `content` and tool calls (name, arguments: a str sent as it is, else
    JSON)."""
    tool_calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {
                "name": name,
                "arguments": args if isinstance(args, str) else json.dumps(args),
            },
        }
        for i, (name, args) in enumerate(calls)
    ]
    message = {"role": "assistant", "content": content, "tool_calls": tool_calls or None}
    return Received({}, message, finish)


def channels(got: Received, tool_choice: str | dict[str, Any] = "auto") -> list[str]:
    return [failure.channel for failure in failures(got, TOOLS, tool_choice)]


@pytest.mark.parametrize(
    "content",
    [
        '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}</tool_call>',
        'Let me look.\n<tool_call>\n{"name": "get_order_details", "argu',
        "Looking it up.\n<tool_call>\nget_order_details #W1\n</tool_call>",
        'What is in it?<tool_call> {"name": "x"}',
    ],
)
def test_a_call_written_as_text_is_found(content: str) -> None:
    assert written_call(content) is not None
    assert channels(received(content)) == ["leaked_tool_call"]


@pytest.mark.parametrize(
    "content",
    [
        "You are provided with function signatures within <tool_call></tool_call> XML tags.",
        "I ordered from <tool_call>#W2373251</tool_call> last week.",
        "what do you think about <tool_call>?\nNothing.",
        "Details:\n<tool_call>\n産の：?\n<tool_call>ranaway=?",
        "Your order #W2378156 holds a desk lamp.",
    ],
)
def test_a_tag_named_in_prose_is_not_a_call(content: str) -> None:
    assert written_call(content) is None
    assert channels(received(content)) == []


def test_each_kind_of_bad_call_is_judged_under_its_channel() -> None:
    assert channels(received("", ("refund_order", {}))) == ["unknown_tool"]
    assert channels(received("", ("get_order_details", "{'order_id': 1"))) == [
        "malformed_arguments"
    ]
    assert channels(received("", ("get_order_details", {"order": "#W1"}))) == ["schema_violation"]
    assert channels(received("", ("get_order_details", {"order_id": "#W1"}))) == []


def test_a_required_call_that_was_not_made_is_a_tool_choice_violation() -> None:
    named = {"type": "function", "function": {"name": "cancel_pending_order"}}
    assert channels(received("Sure."), "required") == ["tool_choice_violation"]
    assert channels(received("", ("get_order_details", {"order_id": "#W1"})), named) == [
        "tool_choice_violation"
    ]


def test_a_cut_off_answer_may_be_reported_as_truncated() -> None:
    (failure,) = failures(
        received("", ("get_order_details", '{"order_'), finish="length"), TOOLS, "auto"
    )
    assert failure.accepted == {"malformed_arguments", "truncated"}


def test_an_empty_answer_may_be_an_undeclared_call_the_proxy_stripped() -> None:
    # The default on_unrepaired strips an unrepaired undeclared tool's call: the message it was
    # the only call of arrives empty, reported as unknown_tool.
    (empty,) = failures(received(""), TOOLS, "auto")
    assert empty.channel == "empty_response"
    assert "unknown_tool" in empty.accepted
    required = failures(received(""), TOOLS, "required")
    assert [f.channel for f in required] == ["tool_choice_violation", "empty_response"]
    assert all("unknown_tool" in f.accepted for f in required)
