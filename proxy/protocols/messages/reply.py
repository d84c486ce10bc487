"""A Messages answer read into the guard's message and written back (Anthropic's shapes).

Its `text` blocks joined are the `content`, each `tool_use` block a call (`input` written back as
JSON text; an `input` that is not an object stays as it came, so the guard sees it malformed),
`stop_reason` `max_tokens` → `length`, `tool_use` → `tool_calls`. Thinking and redacted-thinking
blocks ride along in the message under `THINKING_KEY`, byte for byte, so a written-back answer and
a re-ask's assistant turn keep them with their signatures; their text is also the message's
`reasoning`, which the guard scans for leaked calls. Errors are Anthropic's shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import orjson

import proxy.protocols.messages.answer as wire
from proxy.errors import ToolsentryError, UpstreamStatusError, status_of
from proxy.protocols.base import Finish, Message

THINKING_KEY: Final = "thinking_blocks"
"""Where a read message keeps the answer's thinking blocks (the guard ignores it)."""

_STOP_REASONS: Final = {"max_tokens": Finish.LENGTH, "tool_use": Finish.TOOL_CALLS}
_FINISHES: Final[dict[str, str]] = {Finish.LENGTH: "max_tokens", Finish.TOOL_CALLS: "tool_use"}
THINKING_TYPES: Final = frozenset({"thinking", "redacted_thinking"})
# Anthropic's names for the proxy's generic error types (its own, such as
# error_budget_exhausted, are kept: they say what happened).
_ERROR_TYPES: Final = {"internal_error": "api_error"}


def error_body(error: ToolsentryError) -> dict[str, Any]:
    """`error` in Anthropic's shape; an upstream's own Anthropic error body passes through."""
    if isinstance(error, UpstreamStatusError):
        upstream = error.upstream_body
        if isinstance(upstream, dict) and upstream.get("type") == "error":
            return upstream
    status = status_of(error)
    kind = _ERROR_TYPES.get(error.error_type, error.error_type)
    if status == 413:
        kind = wire.ERROR_TYPES[413]
    return wire.error_body(error.message, status, kind)


def read_message(blocks: Sequence[Any]) -> Message:
    """A Messages answer's content blocks as the guard's message (thinking kept apart)."""
    text, calls, thinking = [], [], []
    for block in blocks:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            part = block.get("text")
            if isinstance(part, str):
                text.append(part)
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block.get("name"),
                        "arguments": arguments_text(block.get("input")),
                    },
                }
            )
        elif kind in THINKING_TYPES:
            thinking.append(block)
    message: Message = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = calls
    return with_thinking(message, thinking) if thinking else message


def with_thinking(message: Message, blocks: list[dict[str, Any]]) -> Message:
    """`message` carrying `blocks` (thinking and redacted thinking, as they came) under
    `THINKING_KEY`, and the text of the thinking ones as its `reasoning`, for the leak scan."""
    if blocks:
        message[THINKING_KEY] = blocks
    reasoning = "\n".join(
        b["thinking"]
        for b in blocks
        if b.get("type") == "thinking" and isinstance(b.get("thinking"), str) and b["thinking"]
    )
    if reasoning:
        message["reasoning"] = reasoning
    return message


def arguments_text(value: object) -> str:
    """A `tool_use` input as the arguments text of a call: an object as JSON, a string (a server
    that could not parse the model's arguments) as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def call_input(arguments: object) -> object:
    """A call's arguments text back as a `tool_use` input: the object it holds, else the text."""
    if not isinstance(arguments, str):
        return {}
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments


def content_blocks(message: Message) -> list[dict[str, Any]]:
    """The guard's message as content blocks: its thinking as it came, its text, its calls."""
    blocks: list[dict[str, Any]] = list(message.get(THINKING_KEY) or [])
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": call_input(function.get("arguments")),
            }
        )
    return blocks or [{"type": "text", "text": ""}]


def finish_of(stop_reason: object) -> str:
    """A `stop_reason` as the guard's finish."""
    key = stop_reason if type(stop_reason) is str else str(stop_reason)  # str() only when needed
    return _STOP_REASONS.get(key, Finish.STOP)


def stop_reason_of(finish: str | None, upstream: object = None) -> str:
    """The guard's finish as a `stop_reason`; a `stop` keeps the upstream's own reason
    (`end_turn`, `stop_sequence`) unless that said the model stopped for a call."""
    if finish in _FINISHES:
        return _FINISHES[finish]
    if isinstance(upstream, str) and upstream not in ("tool_use", "max_tokens"):
        return upstream
    return "end_turn"
