"""An `Answer` as Chat Completions writes it: a `chat.completion` body or its stream chunks."""

from __future__ import annotations

from typing import Any

from proxy.answers import Answer, Call
from proxy.streaming import completion_chunks


def tool_call(call: Call) -> dict[str, Any]:
    """A call as a chat `tool_calls` entry."""
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def message(answer: Answer) -> dict[str, Any]:
    """The answer as a chat assistant message (`reasoning` as vLLM names thinking)."""
    out: dict[str, Any] = {"role": "assistant", "content": answer.text}
    if answer.thinking:
        out["reasoning"] = "".join(t.text for t in answer.thinking if not t.redacted)
    if answer.calls:
        out["tool_calls"] = [tool_call(c) for c in answer.calls]
    return out


def completion(answer: Answer) -> dict[str, Any]:
    """A `chat.completion` body with one choice."""
    usage = answer.usage
    body: dict[str, Any] = {
        "id": f"chatcmpl-{answer.id}",
        "object": "chat.completion",
        "created": answer.created,
        "model": answer.model,
        "choices": [
            {
                "index": 0,
                "message": message(answer),
                "finish_reason": str(answer.finish_reason),
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens,
        },
    }
    if usage.cached_tokens:
        body["usage"]["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    return {**body, **answer.extra}


def chunks(
    answer: Answer, *, fragment: int | None = None, include_usage: bool = True
) -> list[dict[str, Any]]:
    """The `chat.completion.chunk`s a server streams for the answer, in vLLM's shape."""
    return completion_chunks(completion(answer), fragment=fragment, include_usage=include_usage)
