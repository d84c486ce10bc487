"""Tests for proxy/protocols/responses/request.py: a request's input read, and continued by a re-ask."""

from __future__ import annotations

from proxy.guard.toolcheck import validate
from proxy.protocols.responses.reply import guard_message
from proxy.protocols.responses.request import history
from tests.proxy.protocols.responses.test_adapter import FUNCTION, PROTOCOL, call_item


def test_a_function_call_output_is_a_tool_result_and_a_string_input_is_a_user_message() -> None:
    body = {
        "model": "m",
        "input": [
            {"type": "function_call_output", "call_id": "c1", "output": "Error: no such order"},
            {"type": "function_call_output", "call_id": "c2",
             "output": [{"type": "input_text", "text": "fine"}]},
        ],
    }  # fmt: skip
    view = PROTOCOL.view(body, None)
    assert [(r.call_id, r.text) for r in view.tool_results] == [
        ("c1", "Error: no such order"),
        ("c2", "fine"),
    ]
    plain = PROTOCOL.view({"model": "m", "input": "hello", "instructions": "be brief"}, None)
    assert plain.hints.fingerprint == ("m", "be brief", "hello")


def test_a_reask_continues_the_input_with_the_calls_and_one_output_per_call() -> None:
    index = PROTOCOL.compile_tools([FUNCTION])
    output = [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        call_item("nope", "c1"),
        call_item("get", "c2"),
    ]
    message = guard_message(output, "resp_1")
    body = {"model": "m", "input": "do it", "stream": True, "store": False}
    reask = PROTOCOL.reask(body, message, validate(message, None, index=index), index)
    assert "stream" not in reask
    assert reask["store"] is False
    kinds = [(i["type"], i.get("call_id")) for i in reask["input"]]
    assert kinds == [
        ("message", None),
        ("reasoning", None),
        ("function_call", "c1"),
        ("function_call", "c2"),
        ("function_call_output", "c1"),
        ("function_call_output", "c2"),
    ]
    assert reask["input"][4]["output"].startswith("Error: tool 'nope' does not exist.")
    assert "status" not in reask["input"][2]


def test_the_history_of_a_responses_input_is_extended_by_its_next_turn() -> None:
    opening = {"model": "m", "instructions": "Be brief.", "input": "Where is my order?"}
    output = [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "status": "completed", "call_id": "c1",
         "name": "get_order", "arguments": "{}"},
    ]  # fmt: skip
    result = {"type": "function_call_output", "call_id": "c1", "output": "Error: no such order"}
    user = {"role": "user", "content": [{"type": "input_text", "text": "Where is my order?"}]}
    first = history(opening)
    second = history({**opening, "input": [user, *output, result]})
    assert second.prefixes == (first.tip,)
    # A client that drops the reasoning item and the ids and statuses the server gave.
    stripped = [{k: v for k, v in item.items() if k not in ("id", "status")} for item in output[1:]]
    assert history({**opening, "input": [user, *stripped, result]}) == second
    assert history({**opening, "input": [user, *output, {**result, "output": "{}"}]}) != second
    assert history({**opening, "instructions": "Be long."}) != first
