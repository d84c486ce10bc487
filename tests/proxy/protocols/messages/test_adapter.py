"""The Messages adapter's pure translation: answers read and written, re-asks, views, errors, and
the stream assembly, without a network."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from proxy.errors import (
    BadRequestError,
    BudgetExhaustedError,
    PayloadTooLargeError,
    ToolsentryError,
    UpstreamProtocolError,
    UpstreamStatusError,
)
from proxy.guard.toolcheck import validate
from proxy.protocols.base import Settled
from proxy.protocols.messages import answer as wire
from proxy.protocols.messages.adapter import MessagesProtocol
from proxy.protocols.messages.reply import THINKING_KEY
from proxy.session.budget import content_text, fingerprint_of, resolve_session
from proxy.sse import SSEDecoder, SSEEvent
from proxy.testing import answer, call, thinking

PROTOCOL = MessagesProtocol()
TOOLS: list[Any] = [
    {
        "name": "Bash",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
    {"type": "web_search_20250305", "name": "web_search"},
]
BODY: dict[str, Any] = {
    "model": "m",
    "max_tokens": 64,
    "stream": True,
    "messages": [{"role": "user", "content": "List files."}],
    "tools": TOOLS,
}


def test_an_answer_reads_as_the_guards_message_with_its_thinking_kept_apart() -> None:
    body = wire.body(
        answer("Looking.", call("Bash", {"command": "ls"}, id="t1"), thoughts=[thinking("p", "s")])
    )
    (choice,) = PROTOCOL.read(body, "up").choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message["content"] == "Looking."
    (tool_call,) = choice.message["tool_calls"]
    assert tool_call["id"] == "t1"
    assert json.loads(tool_call["function"]["arguments"]) == {"command": "ls"}
    assert choice.message[THINKING_KEY] == [{"type": "thinking", "thinking": "p", "signature": "s"}]
    cut = wire.body(answer(None, call("Bash", '{"command": "l', id="t2"), finish="length"))
    (choice,) = PROTOCOL.read(cut, "up").choices
    assert choice.finish_reason == "length"
    assert choice.message["tool_calls"][0]["function"]["arguments"] == '{"command": "l'
    (empty,) = PROTOCOL.read(wire.body(answer()), "up").choices
    assert (empty.message["content"], empty.finish_reason) == (None, "stop")
    with pytest.raises(UpstreamProtocolError, match="'up'"):
        PROTOCOL.read({"choices": []}, "up")


def test_server_tools_are_not_declared_functions_and_a_tool_without_a_name_is_refused() -> None:
    index = PROTOCOL.compile_tools(TOOLS)
    found = validate(
        {"role": "assistant", "content": None, "tool_calls": [_call("web_search", "{}")]},
        None,
        index=index,
    )
    assert [v.channel.value for v in found] == [
        "unknown_tool"
    ]  # called as a function, it is not one
    with pytest.raises(BadRequestError, match="needs a 'name'"):
        PROTOCOL.compile_tools([{"input_schema": {}}])


def test_the_view_translates_tool_choice_session_hints_and_tool_errors() -> None:
    user_id = json.dumps({"device_id": "d", "session_id": "cc-1"})
    body = {
        **BODY,
        "system": [{"type": "text", "text": "You are Claude Code."}],
        "tool_choice": {"type": "any"},
        "metadata": {"user_id": user_id},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "List files."}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": "boom",
                        "is_error": True,
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": "Error-looking but fine",
                    },
                ],
            },
        ],
    }
    view = PROTOCOL.view(body, None)
    assert view.tool_choice == "required"
    assert view.stream
    assert view.hints.declared == "cc-1"
    assert view.hints.fingerprint == ("m", "You are Claude Code.", "List files.")
    assert [(r.call_id, r.is_error) for r in view.tool_results] == [("t1", True), ("t2", False)]
    named = PROTOCOL.view({**BODY, "tool_choice": {"type": "tool", "name": "Bash"}}, None)
    assert named.tool_choice == {"type": "function", "function": {"name": "Bash"}}
    plain_user = PROTOCOL.view({**BODY, "metadata": {"user_id": "user-7"}}, None)
    assert (plain_user.hints.declared, plain_user.hints.user) == (None, "user-7")
    with pytest.raises(BadRequestError, match="'messages'"):
        PROTOCOL.view({**BODY, "messages": []}, None)


@pytest.mark.parametrize(
    ("user_id", "declared", "user"),
    [
        # JSON only Python's parser takes: the session inside is still read.
        ('{"session_id": "cc-2", "score": NaN}', "cc-2", None),
        ('{"session_id": "cc-3", "note": "\\ud800"}', "cc-3", None),  # a lone surrogate
        ('{"session_id": "cc-4"', None, '{"session_id": "cc-4"'),  # not JSON: the user id
        ('{"device_id": "d"}', None, '{"device_id": "d"}'),
    ],
)
def test_the_session_inside_a_user_id_is_read_as_pythons_json_parser_reads_it(
    user_id: str, declared: object, user: object
) -> None:
    hints = PROTOCOL.view({**BODY, "metadata": {"user_id": user_id}}, None).hints
    assert (hints.declared, hints.user) == (declared, user)


def test_the_fingerprint_reads_text_blocks_as_content_text_does() -> None:
    odd = {"type": "text", "text": 7}  # not a string: its canonical JSON, as content_text has it
    s1, s2, u = ({"type": "text", "text": t} for t in ("S1", "S2", "U"))
    odd_text = content_text([odd])
    for system, user, expected in [
        ([s1, s2], [u], ("S1S2", "U")),
        ([s1, odd], [odd, u], ("S1" + odd_text, odd_text + "U")),
        ([s1, {"type": "image"}, odd], [odd, "stray", u], ("S1" + odd_text, odd_text + "U")),
        ([], [], ("", "")),
    ]:
        body = {
            **BODY,
            "system": system,
            "messages": [
                {"role": "assistant", "content": "before the user"},
                {"role": "user", "content": user},
            ],
        }
        assert PROTOCOL.view(body, None).hints.fingerprint == ("m", *expected)


def test_the_opening_text_is_read_only_when_the_session_falls_back_to_the_fingerprint() -> None:
    def unread(content: object) -> str:
        raise AssertionError(f"read {content!r} for a session the body names")

    system = [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}]
    body = {**BODY, "system": system, "metadata": {"user_id": '{"session_id": "cc-9"}'}}
    named = PROTOCOL.view(body, None).hints
    assert resolve_session({}, named._replace(read=unread)) == "cc-9"
    anonymous = PROTOCOL.view({**body, "metadata": {}}, None).hints
    assert resolve_session({}, anonymous) == fingerprint_of("m", "S1S2", "List files.")


def test_tool_results_are_found_beside_blocks_that_are_not_objects() -> None:
    result = {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [{"type": "text", "text": "E"}],
    }
    body = {
        **BODY,
        "messages": [
            {"role": "user", "content": ["stray", result]},
            {"role": "user", "content": [{"type": "text", "text": "no result"}, 3]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "x"}, {**result, "tool_use_id": "t2"}],
            },
        ],
    }
    view = PROTOCOL.view(body, None)
    assert [(r.call_id, r.text) for r in view.tool_results] == [("t1", "E"), ("t2", "E")]


def test_a_reask_continues_with_the_answer_and_error_tool_results_in_messages_form() -> None:
    index = PROTOCOL.compile_tools(TOOLS)
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call("Bash", "{'command': 'ls'}", "t1")],
        THINKING_KEY: [{"type": "thinking", "thinking": "p", "signature": "sig"}],
    }
    found = validate(message, None, index=index)
    request = PROTOCOL.reask(BODY, message, found, index)
    assert "stream" not in request
    assert request["messages"][:-2] == BODY["messages"]
    assistant, user = request["messages"][-2:]
    assert assistant["content"] == [
        {"type": "thinking", "thinking": "p", "signature": "sig"},
        {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}},  # only objects go back
    ]
    (result,) = user["content"]
    assert (result["tool_use_id"], result["is_error"]) == ("t1", True)
    assert "JSON object" in result["content"]
    empty = {"role": "assistant", "content": None}
    request = PROTOCOL.reask(BODY, empty, validate(empty, None, index=index), index)
    (note,) = request["messages"][len(BODY["messages"]) :]  # nothing to repeat, a user note
    assert note["role"] == "user"
    assert note["content"][0]["type"] == "text"


def test_a_changed_answer_is_written_back_as_blocks_with_its_stop_reason_and_summed_usage() -> None:
    reply = PROTOCOL.read(wire.body(answer(None, call("Nope", {}, id="t1"))), "up")
    repaired = {
        "role": "assistant",
        "content": "Here.",
        "tool_calls": [_call("Bash", '{"command": "ls"}', "t2")],
        THINKING_KEY: [{"type": "redacted_thinking", "data": "abc"}],
    }
    usage = {"input_tokens": 20, "output_tokens": 10}
    body = PROTOCOL.write(reply, [Settled(0, repaired, "tool_calls", True)], usage)
    assert body["content"] == [
        {"type": "redacted_thinking", "data": "abc"},
        {"type": "text", "text": "Here."},
        {"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "ls"}},
    ]
    assert (body["stop_reason"], body["usage"]) == ("tool_use", usage)
    stripped = PROTOCOL.write(
        reply, [Settled(0, {"role": "assistant", "content": None}, "stop", True)], None
    )
    assert stripped["content"] == [{"type": "text", "text": ""}]
    assert stripped["stop_reason"] == "end_turn"


def test_errors_have_anthropics_shape_and_its_types() -> None:
    def kind(error: ToolsentryError) -> str:
        body = PROTOCOL.error(error)
        assert body["type"] == "error"
        return str(body["error"]["type"])

    assert kind(BadRequestError("bad")) == "invalid_request_error"
    assert kind(PayloadTooLargeError("big")) == "request_too_large"
    assert kind(ToolsentryError("bug")) == "api_error"
    assert kind(BudgetExhaustedError("spent")) == "error_budget_exhausted"
    upstream = wire.error_body("busy", 529)
    assert PROTOCOL.error(UpstreamStatusError("x", status=529, body=upstream)) == upstream


def test_the_finish_policy_answers_a_normal_message_plain_and_streamed() -> None:
    body = PROTOCOL.finish(BODY, "The session ended.")
    assert body["content"] == [{"type": "text", "text": "The session ended."}]
    assert body["stop_reason"] == "end_turn"
    events, end = PROTOCOL.finish_stream(body, BODY)
    assert end == b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    kinds = [e.payload["type"] for e in _decode(events) if e.payload]
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_delta"


def test_the_assembly_refuses_what_does_not_belong_in_a_messages_stream() -> None:
    assembly = PROTOCOL.assembly(BODY)
    with pytest.raises(UpstreamProtocolError, match="before message_start"):
        assembly.add(
            _event(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                }
            )
        )
    assembly = PROTOCOL.assembly(BODY)
    assembly.add(_event(wire.events(answer("x"))[0]))
    with pytest.raises(UpstreamStatusError) as caught:
        assembly.add(_event(wire.error_body("busy", 529), "error"))
    assert caught.value.status == 529
    cut = PROTOCOL.assembly(BODY)
    for event in wire.events(answer("Hello"))[:-2]:  # no message_delta, no message_stop
        cut.add(_event(event))
    assert cut.take_finished() == []
    with pytest.raises(UpstreamProtocolError, match="message_delta"):
        cut.end()


def test_a_stream_ending_with_done_after_its_message_delta_is_complete() -> None:
    assembly = PROTOCOL.assembly(BODY)
    for event in wire.events(answer("Hello"))[:-1]:
        assembly.add(_event(event))
    (choice,) = assembly.take_finished()
    assembly.release(Settled(0, choice.message, choice.finish_reason, False))
    assembly.add(SSEEvent("[DONE]", None))
    assert assembly.done
    assert b"message_stop" in assembly.end()


def test_a_block_after_a_held_call_passes_under_the_next_client_index() -> None:
    assembly = PROTOCOL.assembly(BODY)
    text, call, more = (
        {"type": "text", "text": ""},
        {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}},
        {"type": "text", "text": "after"},
    )
    passed: list[bytes] = []
    for event in [
        {"type": "message_start", "message": {"id": "msg_1", "content": []}},
        {"type": "content_block_start", "index": 0, "content_block": text},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": call},
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"command": "ls"}'},
        },
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": more},
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
    ]:
        passed += assembly.add(_event(event))
    (choice,) = assembly.take_finished()
    passed += assembly.release(Settled(0, choice.message, choice.finish_reason, False))
    blocks = [
        (e.payload["type"], e.payload["index"])
        for e in _decode(b"".join(passed))
        if e.payload and "index" in e.payload
    ]
    # The held call is sent last: the text after it moves up to index 1, the call takes 2.
    assert blocks == [
        ("content_block_start", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
    ]
    assert choice.message["tool_calls"][0]["function"]["arguments"] == '{"command": "ls"}'


def _call(name: str, arguments: str, call_id: str = "t1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _event(data: dict[str, Any], name: str | None = None) -> SSEEvent:
    return SSEEvent(orjson.dumps(data).decode(), data, name or data.get("type"))


def _decode(raw: bytes) -> list[SSEEvent]:
    decoder = SSEDecoder()
    return [e for e in [*decoder.feed(raw), *decoder.flush()] if isinstance(e, SSEEvent)]


LEAK = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
THOUGHT = {"type": "thinking", "thinking": "I should list. " + LEAK, "signature": "EqQBCkgIARAB+/="}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"}


def leaks_in_reasoning(message: dict[str, Any]) -> list[tuple[str, bool, str | None]]:
    found = validate(message, None, index=PROTOCOL.compile_tools(TOOLS))
    return [(v.channel.value, v.in_reasoning, v.format) for v in found]


def test_thinking_blocks_are_the_reasoning_the_guard_scans_and_are_written_back_byte_for_byte() -> (
    None
):
    body = {"content": [dict(THOUGHT), dict(REDACTED), {"type": "text", "text": "Done."}]}
    (choice,) = PROTOCOL.read(body, "up").choices
    assert choice.message["reasoning"] == THOUGHT["thinking"]  # the redacted block has no text
    assert leaks_in_reasoning(choice.message) == [("leaked_tool_call", True, "hermes")]
    settled = Settled(0, choice.message, "stop", True)
    written = PROTOCOL.write(PROTOCOL.read(body, "up"), [settled], None)
    assert orjson.dumps(written["content"][:2]) == orjson.dumps([THOUGHT, REDACTED])


def test_a_streams_thinking_deltas_pass_at_once_and_are_scanned() -> None:
    assembly = PROTOCOL.assembly(BODY)
    events = wire.events(
        answer("Done.", thoughts=[thinking(str(THOUGHT["thinking"]), str(THOUGHT["signature"]))]),
        fragment=5,
    )
    thinking_deltas = 0
    for event in events[:-1]:
        out = assembly.add(_event(event))
        if event.get("delta", {}).get("type") == "thinking_delta":
            thinking_deltas += 1
            assert [orjson.loads(e.split(b"data: ")[1])["delta"] for e in out] == [event["delta"]]
    assert thinking_deltas > 1
    (choice,) = assembly.take_finished()
    assert choice.message["reasoning"] == THOUGHT["thinking"]
    assert choice.message[THINKING_KEY] == [THOUGHT]
    assert leaks_in_reasoning(choice.message) == [("leaked_tool_call", True, "hermes")]
