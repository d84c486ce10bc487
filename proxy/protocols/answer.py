"""A protocol-neutral assistant answer, which each wire protocol writes: pure, no I/O.

What a model says is decided once, as an `Answer` (text, tool calls, thinking, a finish, usage),
and written in the shapes vLLM serves by `proxy.protocols.chat.answer` (Chat Completions),
`proxy.protocols.responses.answer` (Responses) and `proxy.protocols.messages.answer` (Anthropic
Messages), plain or as stream events. The scripted test upstream (`proxy.testing`) and evalkit's simulated upstream
both render through here, so neither respells a protocol. An answer may be wrong on purpose —
arguments that are not JSON, a call cut off by the token limit — and is written as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from proxy.protocols.base import Finish


@dataclass(frozen=True, slots=True)
class Call:
    """A tool call: the name as the model wrote it, its arguments as text (possibly not JSON),
    its id, and for a function inside a Responses `namespace` tool, that namespace."""

    name: str
    arguments: str
    id: str
    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class Thinking:
    """A reasoning block: its text and signature; `redacted` blocks carry opaque `data` instead
    (Messages `redacted_thinking`), kept byte for byte."""

    text: str
    signature: str = ""
    redacted: bool = False


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one answer. `input_tokens` includes `cached_tokens` (vLLM's count)."""

    input_tokens: int = 10
    output_tokens: int = 5
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Input and output together."""
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class Answer:
    """One assistant answer, protocol-neutral.

    `finish` defaults to `tool_calls` when there are calls, else `stop`. `id` is the stem every
    protocol's ids are made from (`chatcmpl-<id>`, `resp_<id>`, `msg_<id>`, item ids), so a
    rendering is deterministic. `created` is the Unix time the bodies carry. `extra` holds
    top-level fields added to every body and stream envelope (e.g. `system_fingerprint`).
    """

    text: str | None = None
    calls: tuple[Call, ...] = ()
    thinking: tuple[Thinking, ...] = ()
    finish: Finish | None = None
    usage: Usage = field(default_factory=Usage)
    model: str = "scripted-model"
    id: str = "0"
    created: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def finish_reason(self) -> Finish:
        """The finish, derived when not given."""
        if self.finish is not None:
            return self.finish
        return Finish.TOOL_CALLS if self.calls else Finish.STOP


DEFAULT_FRAGMENT: Final = 8
"""Characters per streamed text or arguments delta, unless a rendering is told otherwise."""


def pieces(text: str, size: int | None) -> list[str]:
    """`text` cut into pieces of `size` characters (whole when None or 0; none when empty)."""
    if not size:
        return [text] if text else []
    return [text[i : i + size] for i in range(0, len(text), size)]


def parsed_arguments(call: Call) -> Any:
    """A call's arguments parsed as JSON, or the raw text when they are not JSON."""
    try:
        return orjson.loads(call.arguments)
    except orjson.JSONDecodeError:
        return call.arguments


__all__ = [
    "DEFAULT_FRAGMENT",
    "Answer",
    "Call",
    "Finish",
    "Thinking",
    "Usage",
    "parsed_arguments",
    "pieces",
]
