"""Tests for proxy/protocols/messages/stream.py: one Messages stream assembled."""

from __future__ import annotations

import orjson
import pytest

from proxy.errors import UpstreamProtocolError, UpstreamStatusError
from proxy.protocols.base import Settled
from proxy.protocols.messages import answer as wire
from proxy.protocols.messages.reply import THINKING_KEY
from proxy.sse import SSEEvent
from proxy.testing import answer, thinking
from tests.proxy.protocols.messages.test_adapter import (
    BODY,
    PROTOCOL,
    THOUGHT,
    decode,
    leaks_in_reasoning,
    upstream_event,
)


def test_the_assembly_refuses_what_does_not_belong_in_a_messages_stream() -> None:
    assembly = PROTOCOL.assembly(BODY)
    with pytest.raises(UpstreamProtocolError, match="before message_start"):
        assembly.add(
            upstream_event(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                }
            )
        )
    assembly = PROTOCOL.assembly(BODY)
    assembly.add(upstream_event(wire.events(answer("x"))[0]))
    with pytest.raises(UpstreamStatusError) as caught:
        assembly.add(upstream_event(wire.error_body("busy", 529), "error"))
    assert caught.value.status == 529
    cut = PROTOCOL.assembly(BODY)
    for event in wire.events(answer("Hello"))[:-2]:  # no message_delta, no message_stop
        cut.add(upstream_event(event))
    assert cut.take_finished() == []
    with pytest.raises(UpstreamProtocolError, match="message_delta"):
        cut.end()


def test_a_stream_ending_with_done_after_its_message_delta_is_complete() -> None:
    assembly = PROTOCOL.assembly(BODY)
    for event in wire.events(answer("Hello"))[:-1]:
        assembly.add(upstream_event(event))
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
        passed += assembly.add(upstream_event(event))
    (choice,) = assembly.take_finished()
    passed += assembly.release(Settled(0, choice.message, choice.finish_reason, False))
    blocks = [
        (e.payload["type"], e.payload["index"])
        for e in decode(b"".join(passed))
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


def test_a_streams_thinking_deltas_pass_at_once_and_are_scanned() -> None:
    assembly = PROTOCOL.assembly(BODY)
    events = wire.events(
        answer("Done.", thoughts=[thinking(str(THOUGHT["thinking"]), str(THOUGHT["signature"]))]),
        fragment=5,
    )
    thinking_deltas = 0
    for event in events[:-1]:
        out = assembly.add(upstream_event(event))
        if event.get("delta", {}).get("type") == "thinking_delta":
            thinking_deltas += 1
            assert [orjson.loads(e.split(b"data: ")[1])["delta"] for e in out] == [event["delta"]]
    assert thinking_deltas > 1
    (choice,) = assembly.take_finished()
    assert choice.message["reasoning"] == THOUGHT["thinking"]
    assert choice.message[THINKING_KEY] == [THOUGHT]
    assert leaks_in_reasoning(choice.message) == [("leaked_tool_call", True, "hermes")]
