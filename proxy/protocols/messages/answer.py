"""An `Answer` as the Anthropic Messages API writes it: a `message` body, or its stream events.

Shapes follow vLLM's Messages server (`vllm/entrypoints/anthropic/serving.py`): content blocks in
the order thinking (with its signature), text, tool_use (`input` the parsed arguments); an empty
answer is one empty text block; `stop_reason` `tool_use`, `max_tokens` (the token limit wins) or
`end_turn`. A stream is `message_start` (usage so far, `content: []`), each block's
`content_block_start` / deltas (`thinking_delta` then `signature_delta`, `text_delta`,
`input_json_delta` from `input: {}`) / `content_block_stop` with consecutive `index`es, then
`message_delta` (stop reason, usage) and `message_stop`. vLLM sends no `ping`; Anthropic's API
sends one after `message_start`, which `ping=True` adds. Errors: `{"type": "error", "error":
{"type", "message"}}`, with Anthropic's error type for the HTTP status.
"""

from __future__ import annotations

from typing import Any, Final

from proxy.protocols.answer import (
    DEFAULT_FRAGMENT,
    Answer,
    Call,
    Finish,
    Thinking,
    Usage,
    parsed_arguments,
)
from proxy.protocols.answer import pieces as cut

ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
"""Anthropic's error type for each HTTP status it documents; any other status is `api_error`."""

Event = dict[str, Any]


def stop_reason(answer: Answer) -> str:
    """`max_tokens` when the limit cut the answer, else `tool_use` with calls, else `end_turn`."""
    if answer.finish_reason is Finish.LENGTH:
        return "max_tokens"
    return "tool_use" if answer.calls else "end_turn"


def usage(counts: Usage, *, output: bool = True) -> dict[str, Any]:
    """`usage` as vLLM writes it: input without the cached part, which is counted apart."""
    out: dict[str, Any] = {
        "input_tokens": counts.input_tokens - counts.cached_tokens,
        "output_tokens": counts.output_tokens if output else 0,
    }
    if counts.cached_tokens:
        out["cache_read_input_tokens"] = counts.cached_tokens
    return out


def thinking_block(thinking: Thinking) -> dict[str, Any]:
    """A `thinking` block with its signature, or a `redacted_thinking` block with its data."""
    if thinking.redacted:
        return {"type": "redacted_thinking", "data": thinking.text}
    return {"type": "thinking", "thinking": thinking.text, "signature": thinking.signature}


def tool_use_block(call: Call) -> dict[str, Any]:
    """A `tool_use` block; `input` is the arguments parsed (the raw text when not JSON)."""
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": parsed_arguments(call)}


def content(answer: Answer) -> list[dict[str, Any]]:
    """The answer's content blocks; one empty text block when it says nothing."""
    blocks = [thinking_block(t) for t in answer.thinking]
    if answer.text:
        blocks.append({"type": "text", "text": answer.text})
    blocks += [tool_use_block(c) for c in answer.calls]
    return blocks or [{"type": "text", "text": ""}]


def body(answer: Answer) -> dict[str, Any]:
    """The `message` body of the answer."""
    out = {
        "id": _message_id(answer),
        "type": "message",
        "role": "assistant",
        "content": content(answer),
        "model": answer.model,
        "stop_reason": stop_reason(answer),
        "usage": usage(answer.usage),
    }
    return {**out, **answer.extra}


def events(
    answer: Answer, *, fragment: int | None = DEFAULT_FRAGMENT, ping: bool = False
) -> list[Event]:
    """The stream of the answer, block by block; text, thinking and arguments in deltas of
    `fragment` characters (whole when None)."""
    started = {
        "id": _message_id(answer),
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": answer.model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage(answer.usage, output=False),
        **answer.extra,
    }
    out: list[Event] = [{"type": "message_start", "message": started}]
    if ping:
        out.append(PING)
    index = 0
    for thinking in answer.thinking:
        out += thinking_events(thinking, index, fragment)
        index += 1
    if answer.text:
        out += text_events(answer.text, index, fragment)
        index += 1
    for call in answer.calls:
        out += tool_use_events(call, index, fragment)
        index += 1
    out += closing_events(answer)
    return out


PING: Final[Event] = {"type": "ping"}


def text_events(text: str, index: int, fragment: int | None = DEFAULT_FRAGMENT) -> list[Event]:
    """A text block's start, `text_delta`s and stop."""
    return _block(
        index,
        {"type": "text", "text": ""},
        [{"type": "text_delta", "text": piece} for piece in cut(text, fragment)],
    )


def tool_use_events(call: Call, index: int, fragment: int | None = DEFAULT_FRAGMENT) -> list[Event]:
    """A tool_use block's start (`input: {}`), `input_json_delta`s of the arguments, and stop."""
    start = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
    deltas = [
        {"type": "input_json_delta", "partial_json": piece}
        for piece in cut(call.arguments, fragment)
    ]
    return _block(index, start, deltas)


def thinking_events(
    thinking: Thinking, index: int, fragment: int | None = DEFAULT_FRAGMENT
) -> list[Event]:
    """A thinking block's start, `thinking_delta`s, its `signature_delta` and stop; a redacted
    block starts whole and stops."""
    if thinking.redacted:
        return _block(index, thinking_block(thinking), [])
    deltas = [
        {"type": "thinking_delta", "thinking": piece} for piece in cut(thinking.text, fragment)
    ]
    deltas.append({"type": "signature_delta", "signature": thinking.signature})
    return _block(index, {"type": "thinking", "thinking": ""}, deltas)


def closing_events(answer: Answer) -> list[Event]:
    """`message_delta` with the stop reason and the usage, then `message_stop`."""
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(answer), "stop_sequence": None},
            "usage": usage(answer.usage),
        },
        {"type": "message_stop"},
    ]


def error_body(message: str, status: int = 500, error_type: str | None = None) -> dict[str, Any]:
    """An Anthropic error body (also the data of a stream's `error` event)."""
    kind = error_type or ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _block(index: int, start: dict[str, Any], deltas: list[dict[str, Any]]) -> list[Event]:
    out: list[Event] = [{"type": "content_block_start", "index": index, "content_block": start}]
    out += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
    out.append({"type": "content_block_stop", "index": index})
    return out


def _message_id(answer: Answer) -> str:
    return f"msg_{answer.id}"
