"""Tests for proxy/protocols/responses/reply.py: a response read into the guard's message and written back."""

from __future__ import annotations

import orjson

from proxy.guard.toolcheck import validate
from proxy.protocols.responses.reply import ITEMS, guard_message, output_items
from tests.proxy.protocols.responses.test_adapter import (
    FUNCTION,
    LEAK,
    NAMESPACE,
    PROTOCOL,
    call_item,
    leaks_in_reasoning,
)


def test_a_namespaced_call_is_checked_under_its_namespace() -> None:
    index = PROTOCOL.compile_tools([FUNCTION, NAMESPACE])
    good = guard_message([call_item("find", "c1", namespace="crm")], None)
    flat = guard_message([call_item("find", "c2")], None)
    assert validate(good, None, index=index) == []
    assert [v.channel.value for v in validate(flat, None, index=index)] == ["unknown_tool"]


def test_a_message_written_back_keeps_its_items_without_the_stripped_calls() -> None:
    output = [
        {"type": "message", "id": "m1", "content": []},
        call_item("a", "c1"),
        call_item("b", "c2"),
    ]
    message = guard_message(output, None)
    message["tool_calls"] = message["tool_calls"][1:]  # as on_unrepaired: strip leaves it
    message["tool_calls"][0]["function"]["arguments"] = '{"fixed": true}'  # as a local fix
    assert [i.get("call_id") for i in output_items(message)] == [None, "c2"]
    assert output_items(message)[1]["arguments"] == '{"fixed": true}'
    assert message[ITEMS] is output


def test_the_finish_is_length_when_the_response_stopped_at_max_output_tokens() -> None:
    body = {
        "id": "resp_1",
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
        "output": [call_item("get", "c1", arguments='{"a": ')],
    }
    (choice,) = PROTOCOL.read(body, "u").choices
    assert choice.finish_reason == "length"
    index = PROTOCOL.compile_tools([FUNCTION])
    found = validate(choice.message, None, finish_reason=choice.finish_reason, index=index)
    assert [v.channel.value for v in found] == ["truncated"]


def test_reasoning_items_are_the_reasoning_the_guard_scans_and_go_back_unchanged() -> None:
    output = [
        {"type": "reasoning", "id": "rs_1",
         "summary": [{"type": "summary_text", "text": "In short: " + LEAK}],
         "content": [{"type": "reasoning_text", "text": "I think. " + LEAK}]},
        {"type": "reasoning", "id": "rs_2",
         "summary": [{"type": "summary_text", "text": "Only a summary."}]},
        {"type": "reasoning", "id": "rs_3", "summary": [], "encrypted_content": "gAAAAB"},
    ]  # fmt: skip
    copy = orjson.loads(orjson.dumps(output))
    message = guard_message(output, None)
    # The content, not its summary too: one call is found once.
    assert message["reasoning"] == "I think. " + LEAK + "\nOnly a summary."
    assert leaks_in_reasoning(message) == [("leaked_tool_call", True, "hermes")]
    assert output_items(message) == copy
    assert "reasoning" not in guard_message([{"type": "reasoning", "summary": []}], None)
