"""Tests for proxy/protocols/chat/answer.py: a neutral answer written as vLLM's chat completion."""

from __future__ import annotations

from proxy.protocols.answer import Answer, Usage
from proxy.protocols.base import Finish
from proxy.protocols.chat import answer as wire
from proxy.testing import call, thinking


def test_a_completion_carries_the_text_calls_reasoning_finish_and_usage() -> None:
    get = call("get", {"id": 1}, id="c1")
    body = wire.completion(
        Answer("Looking.", (get,), (thinking("plan"),), usage=Usage(10, 5, cached_tokens=4), id="x")
    )
    (choice,) = body["choices"]
    assert body["id"] == "chatcmpl-x"
    assert choice["message"] == {
        "role": "assistant",
        "content": "Looking.",
        "reasoning": "plan",
        "tool_calls": [wire.tool_call(get)],
    }
    assert choice["finish_reason"] == Finish.TOOL_CALLS
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}


def test_the_chunks_carry_the_envelope_and_end_with_the_usage() -> None:
    chunks = wire.chunks(Answer("Hello", extra={"system_fingerprint": "fp"}), fragment=2)
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:4]] == ["He", "ll", "o"]
    assert all(c["system_fingerprint"] == "fp" for c in chunks)
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["total_tokens"] == 15
    assert (
        wire.chunks(Answer("Hi"), include_usage=False)[-1]["choices"][0]["finish_reason"] == "stop"
    )
