"""An `Answer` as Chat Completions writes it: a `chat.completion` body or its stream chunks, in
vLLM's shapes (the scripted upstream, the simulator and the `finish` policy's stream write here)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.protocols.answer import Answer, Call, pieces
from proxy.protocols.chat.stream import Chunk, full_tool_call


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


def completion_chunks(
    completion: Mapping[str, Any], *, fragment: int | None = None, include_usage: bool = False
) -> list[Chunk]:
    """The chunks a server streams for a non-streamed `chat.completion`, in vLLM's shape.

    Per choice, one after another: a delta with `role` (and any other message field such as
    `refusal`; vLLM adds `"content": ""`, left out so that a null content stays null), the content in pieces of `fragment` characters (whole when None), each tool
    call's `index`, `id`, `type` and name, then its arguments in pieces, then an empty delta with
    the finish (and `logprobs` and the choice's other fields). Every chunk carries the
    completion's top-level fields; with `include_usage`, a last chunk has no choices and the
    usage. The OpenAI SDK accumulates the chunks to the completion's messages.
    """
    envelope = {k: v for k, v in completion.items() if k not in ("choices", "usage", "object")} | {
        "object": "chat.completion.chunk"
    }
    chunks: list[Chunk] = []

    def add(index: int, delta: dict[str, Any], **fields: Any) -> None:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        chunks.append({**envelope, "choices": [choice | fields]})

    for choice in completion.get("choices") or []:
        index, message = choice["index"], choice.get("message") or {}
        rest = {k: v for k, v in message.items() if k not in ("role", "content", "tool_calls")}
        add(index, {"role": message.get("role") or "assistant"} | rest)
        for piece in pieces(message.get("content") or "", fragment):
            add(index, {"content": piece})
        for position, call in enumerate(message.get("tool_calls") or []):
            call = full_tool_call(call)
            function = call["function"]
            head = {"index": position, "id": call["id"], "type": call["type"]}
            named = {"name": function["name"]} | (
                {} if function["arguments"] else {"arguments": ""}
            )
            add(index, {"tool_calls": [head | {"function": named}]})
            for piece in pieces(function["arguments"], fragment):
                add(index, {"tool_calls": [{"index": position, "function": {"arguments": piece}}]})
        others = {k: v for k, v in choice.items() if k not in ("index", "message")}
        add(index, {}, **others)
    if include_usage and completion.get("usage") is not None:
        chunks.append({**envelope, "choices": [], "usage": completion["usage"]})
    return chunks
