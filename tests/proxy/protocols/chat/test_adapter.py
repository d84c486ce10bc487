"""Tests for proxy/protocols/chat/adapter.py: the chat-completions adapter's translation, without a
network."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import BadRequestError, UpstreamProtocolError
from proxy.guard.toolcheck import validate
from proxy.protocols.base import API, Finish, Settled
from proxy.protocols.chat.adapter import ChatProtocol, tool_results
from proxy.sse import DONE, SSEDecoder, SSEEvent
from proxy.testing import completion, tool_call

PROTOCOL = ChatProtocol()
TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "tools": TOOLS, **fields}


def test_the_view_reads_tools_choice_stream_and_the_tool_results_of_the_conversation() -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "tool", "tool_call_id": "c1", "content": "Error: no"},
        {"role": "tool", "content": "no id"},
    ]
    view = PROTOCOL.view(body(messages=messages, tool_choice="required", stream=True), None)
    assert (view.model, view.index.names, view.tool_choice, view.stream) == (
        "m",
        ("get",),
        "required",
        True,
    )
    assert [(r.call_id, r.text, r.is_error) for r in view.tool_results] == [
        ("c1", "Error: no", None)
    ]
    assert tool_results(messages) == list(view.tool_results)
    assert PROTOCOL.api is API.CHAT


@pytest.mark.parametrize("fields", [{"messages": []}, {"tools": {}}])
def test_a_body_the_protocol_cannot_serve_is_a_bad_request(fields: dict[str, Any]) -> None:
    with pytest.raises(BadRequestError):
        PROTOCOL.view(body(**fields), None)


def test_a_reply_is_read_as_its_choices_and_written_back_with_the_settled_ones() -> None:
    reply = PROTOCOL.read(completion(None, [tool_call("gett", {})]), "up")
    (choice,) = reply.choices
    index = PROTOCOL.compile_tools(TOOLS)
    assert [v.channel.value for v in validate(choice.message, None, index=index)] == [
        "unknown_tool"
    ]
    fixed = {"role": "assistant", "content": None, "tool_calls": [tool_call("get", {}, id="c")]}
    written = PROTOCOL.write(
        reply, [Settled(0, fixed, Finish.TOOL_CALLS, changed=True)], {"total_tokens": 3}
    )
    assert written["choices"][0]["message"] == fixed
    assert written["usage"] == {"total_tokens": 3}
    with pytest.raises(UpstreamProtocolError, match="'up'"):
        PROTOCOL.read({"output": []}, "up")


def test_a_reask_is_not_streamed_and_answers_each_call_with_a_tool_message() -> None:
    message = {"role": "assistant", "content": None, "tool_calls": [tool_call("gett", {}, id="c")]}
    index = PROTOCOL.compile_tools(TOOLS)
    violations = validate(message, None, index=index)
    asked = PROTOCOL.reask(body(stream=True, n=2), message, violations, index)
    assert "stream" not in asked
    assert "n" not in asked
    assistant, answer = asked["messages"][1:]
    assert assistant["tool_calls"][0]["id"] == "c"
    assert (answer["role"], answer["tool_call_id"]) == ("tool", "c")


def test_the_finish_policy_answers_a_normal_completion_plain_and_streamed() -> None:
    answer = PROTOCOL.finish(body(), "The session ended.")
    assert answer["choices"][0]["message"]["content"] == "The session ended."
    assert answer["choices"][0]["finish_reason"] == Finish.STOP
    events, end = PROTOCOL.finish_stream(answer, body(stream_options={"include_usage": True}))
    assert end == DONE
    decoded = [e for e in SSEDecoder().feed(events) if isinstance(e, SSEEvent)]
    assert (
        "".join(
            (e.payload or {})["choices"][0]["delta"].get("content") or ""
            for e in decoded
            if (e.payload or {}).get("choices")
        )
        == "The session ended."
    )
    assert (decoded[-1].payload or {})["usage"] == answer["usage"]
