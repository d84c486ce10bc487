"""Tests for proxy/protocols/messages/adapter.py: the Messages adapter's view, write-back and
`finish` policy, without a network (and the builders the package's other tests share)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from proxy.errors import BadRequestError
from proxy.guard.toolcheck import validate
from proxy.protocols.base import Settled
from proxy.protocols.messages import answer as wire
from proxy.protocols.messages.adapter import MessagesProtocol
from proxy.protocols.messages.reply import THINKING_KEY
from proxy.sse import SSEDecoder, SSEEvent
from proxy.testing import answer, call

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


def test_a_changed_answer_is_written_back_as_blocks_with_its_stop_reason_and_summed_usage() -> None:
    reply = PROTOCOL.read(wire.body(answer(None, call("Nope", {}, id="t1"))), "up")
    repaired = {
        "role": "assistant",
        "content": "Here.",
        "tool_calls": [guard_call("Bash", '{"command": "ls"}', "t2")],
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


def test_the_finish_policy_answers_a_normal_message_plain_and_streamed() -> None:
    body = PROTOCOL.finish(BODY, "The session ended.")
    assert body["content"] == [{"type": "text", "text": "The session ended."}]
    assert body["stop_reason"] == "end_turn"
    events, end = PROTOCOL.finish_stream(body, BODY)
    assert end == b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    kinds = [e.payload["type"] for e in decode(events) if e.payload]
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_delta"


def guard_call(name: str, arguments: str, call_id: str = "t1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def upstream_event(data: dict[str, Any], name: str | None = None) -> SSEEvent:
    return SSEEvent(orjson.dumps(data).decode(), data, name or data.get("type"))


def decode(raw: bytes) -> list[SSEEvent]:
    decoder = SSEDecoder()
    return [e for e in [*decoder.feed(raw), *decoder.flush()] if isinstance(e, SSEEvent)]


LEAK = '<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
THOUGHT = {"type": "thinking", "thinking": "I should list. " + LEAK, "signature": "EqQBCkgIARAB+/="}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"}


def leaks_in_reasoning(message: dict[str, Any]) -> list[tuple[str, bool, str | None]]:
    found = validate(message, None, index=PROTOCOL.compile_tools(TOOLS))
    return [(v.channel.value, v.in_reasoning, v.format) for v in found]
