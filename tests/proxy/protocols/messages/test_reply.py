"""Tests for proxy/protocols/messages/reply.py: a Messages answer read into the guard's message and written back, and Anthropic's errors."""

from __future__ import annotations

import json

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
from proxy.protocols.base import Settled
from proxy.protocols.messages import answer as wire
from proxy.protocols.messages.reply import THINKING_KEY
from proxy.testing import answer, call, thinking
from tests.proxy.protocols.messages.test_adapter import (
    PROTOCOL,
    REDACTED,
    THOUGHT,
    leaks_in_reasoning,
)


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
