"""Failure channels (DESIGN §4) and the violation record every check produces."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Channel(enum.StrEnum):
    """A way a model's tool use can fail. The value is the name used in headers, metrics and files."""

    UNKNOWN_TOOL = "unknown_tool"
    MALFORMED_ARGUMENTS = "malformed_arguments"
    SCHEMA_VIOLATION = "schema_violation"
    TOOL_CHOICE_VIOLATION = "tool_choice_violation"
    LEAKED_TOOL_CALL = "leaked_tool_call"
    TRUNCATED = "truncated"
    EMPTY_RESPONSE = "empty_response"
    TOOL_ERROR = "tool_error"
    UPSTREAM_ERROR = "upstream_error"

    @property
    def repairable(self) -> bool:
        """Whether a corrective re-ask can fix this channel (DESIGN §4, last column)."""
        return self not in (Channel.TOOL_ERROR, Channel.UPSTREAM_ERROR)


@dataclass(frozen=True, slots=True)
class Violation:
    """One failure found in one assistant message.

    `call_index` is the position in `tool_calls` (None for message-level channels such as
    `empty_response`); `call_id` is the call's `id` when it has one, so a repair can answer it
    with a `role: tool` message; `pointers` are JSON pointers of the first schema errors. For a
    call written as text (`leaked_tool_call`, or `truncated` inside one) `format` names its wire
    format (a name of `proxy.guard.leakformats.FORMATS`, so a bounded label) and `in_reasoning`
    says it was written in the reasoning, not the answer: a flag on the channel, because the
    failure, its count and its repair are the same.
    """

    channel: Channel
    message: str
    tool_name: str | None = None
    call_index: int | None = None
    call_id: str | None = None
    pointers: tuple[str, ...] = field(default_factory=tuple)
    format: str | None = None
    in_reasoning: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form for logs, session records and results files."""
        out: dict[str, Any] = {"channel": self.channel.value, "message": self.message}
        if self.tool_name is not None:
            out["tool_name"] = self.tool_name
        if self.call_index is not None:
            out["call_index"] = self.call_index
        if self.call_id is not None:
            out["call_id"] = self.call_id
        if self.pointers:
            out["pointers"] = list(self.pointers)
        if self.format is not None:
            out["format"] = self.format
        if self.in_reasoning:
            out["in_reasoning"] = True
        return out
