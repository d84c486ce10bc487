"""The Responses adapter's translation, without a network: tools, tool_choice, input items, output
items and re-asks."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.errors import BadRequestError, UpstreamProtocolError
from proxy.guard.toolcheck import validate
from proxy.protocols.responses.adapter import ResponsesProtocol
from proxy.protocols.responses.reply import ITEMS, guard_message, output_items
from proxy.sse import SSEEvent

PROTOCOL = ResponsesProtocol()
FUNCTION = {"type": "function", "name": "get", "parameters": {"type": "object"}}
NAMESPACE = {"type": "namespace", "name": "crm", "tools": [{"type": "function", "name": "find"}]}


def call_item(name: str, call_id: str, arguments: str = "{}", **extra: Any) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": "completed", **extra}  # fmt: skip


def test_a_namespaced_call_is_checked_under_its_namespace() -> None:
    index = PROTOCOL.compile_tools([FUNCTION, NAMESPACE])
    good = guard_message([call_item("find", "c1", namespace="crm")], None)
    flat = guard_message([call_item("find", "c2")], None)
    assert validate(good, None, index=index) == []
    assert [v.channel.value for v in validate(flat, None, index=index)] == ["unknown_tool"]


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


@pytest.mark.parametrize("body", [{}, {"input": 3}, {"input": "x", "tools": {}}])
def test_a_body_the_protocol_cannot_serve_is_a_bad_request(body: dict[str, Any]) -> None:
    with pytest.raises(BadRequestError):
        PROTOCOL.view(body, None)


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


LEAK = '<tool_call>\n{"name": "get", "arguments": {}}\n</tool_call>'


def leaks_in_reasoning(message: dict[str, Any]) -> list[tuple[str, bool, str | None]]:
    found = validate(message, None, index=PROTOCOL.compile_tools([FUNCTION]))
    return [(v.channel.value, v.in_reasoning, v.format) for v in found]


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


@pytest.mark.parametrize(
    "delta", ["response.reasoning_text.delta", "response.reasoning_summary_text.delta"]
)
def test_a_streams_reasoning_deltas_pass_at_once_and_are_scanned_where_its_items_have_no_text(
    delta: str,
) -> None:
    assembly = PROTOCOL.assembly({})
    bare = {"type": "reasoning", "id": "rs_1", "summary": []}  # done events without the text
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "resp_1", "output": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": bare},
        *({"type": delta, "output_index": 0, "item_id": "rs_1", "content_index": 0,
           "summary_index": 0, "delta": piece} for piece in ("I think. ", LEAK[:12], LEAK[12:])),
        {"type": "response.output_item.done", "output_index": 0, "item": bare},
        {"type": "response.completed", "response": {"id": "resp_1", "status": "completed"}},
    ]  # fmt: skip
    sent = [assembly.add(SSEEvent(orjson.dumps(e).decode(), e, e["type"])) for e in events]
    assert [len(out) for out in sent] == [1, 1, 1, 1, 1, 1, 0]  # each delta passed as it came
    assert orjson.loads(sent[3][0].split(b"data: ")[1])["delta"] == LEAK[:12]
    (choice,) = assembly.take_finished()
    assert choice.message["reasoning"] == "I think. " + LEAK
    assert leaks_in_reasoning(choice.message) == [("leaked_tool_call", True, "hermes")]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"output": [call_item("get", "c1"), "stray"]}, "output item that is not an object"),
        ({"output": [[call_item("get", "c1")]]}, "output item that is not an object"),
        ({"output": None}, "not a response"),
        (["not", "a", "body"], "not a response"),
    ],
)
def test_an_answer_that_is_not_a_response_is_the_upstreams_protocol_error(
    body: Any, says: str
) -> None:
    with pytest.raises(UpstreamProtocolError, match=f"upstream 'up'.*{says}"):
        PROTOCOL.read(body, "up")
    assert PROTOCOL.read({"output": [call_item("get", "c1")]}, "up").choices
