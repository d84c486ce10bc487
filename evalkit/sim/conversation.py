"""Reading a chat request the way the simulated model needs: what happened, and whether it is a re-ask.

A request is the agent's conversation, possibly followed by the proxy's corrective re-ask rounds
(DESIGN §6): the model's invalid message, a `role: tool` answer per call it made (`Error: tool
'X' does not exist. …`, `… Call 'X' again with corrected arguments.`, …) and, for what has no
call id, a `role: user` note (`Your last reply wrote a call … as text …`). The reader splits the
two, so the model can tell an environment error (a turn of the episode) from a corrective
re-ask (another attempt at the same turn).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from proxy.guard.repair import NOT_EXECUTED

# The proxy's corrective texts (proxy/guard/repair.py); environment errors read differently
# (`Error: Tool 'X' not found.`, `Error: Arguments of tool …`, a tool's own message).
_CORRECTIVE_TOOL_MARKS: Final = (
    "does not exist. Available tools:",
    "does not exist. No tools are available",
    "the tool call names no tool",
    "The arguments must be one JSON object",
    "again with corrected arguments.",
    "was cut off at the token limit",
)
_CORRECTIVE_TOOL_PREFIXES: Final = ("Error: not executed:",)
_CORRECTIVE_USER_PREFIXES: Final = (
    "Your last reply ",
    "Your tool call ",
    "You must call ",
)


def is_corrective_tool_text(text: str) -> bool:
    """Whether a `role: tool` content is one of the proxy's corrective answers."""
    if text == NOT_EXECUTED:
        return True
    if text.startswith(_CORRECTIVE_TOOL_PREFIXES):
        return True
    return text.startswith("Error") and any(mark in text for mark in _CORRECTIVE_TOOL_MARKS)


def is_corrective_user_text(text: str) -> bool:
    """Whether a `role: user` content is one of the proxy's corrective notes."""
    return text.startswith(_CORRECTIVE_USER_PREFIXES)


@dataclass(frozen=True)
class ExecutedCall:
    """A tool call of the assistant and the environment's answer to it (None: not answered)."""

    name: str
    arguments: dict[str, Any] | None
    result: str | None

    @property
    def error(self) -> bool:
        """Whether the environment answered with an error."""
        return self.result is not None and self.result.startswith("Error")


@dataclass(frozen=True)
class Conversation:
    """A request's messages split into the episode so far and the re-ask rounds that follow it.

    `messages` has no system message and no re-ask round; `rounds` holds each round's messages,
    oldest first (the invalid assistant message first).
    """

    messages: list[dict[str, Any]]
    rounds: list[list[dict[str, Any]]] = field(default_factory=list)

    @property
    def attempt(self) -> int:
        """0 for a first answer, n for the n-th corrective re-ask of the same turn."""
        return len(self.rounds)

    @property
    def turn(self) -> int:
        """The number of assistant messages so far (the index of the turn being answered)."""
        return sum(1 for m in self.messages if m.get("role") == "assistant")

    def last_assistant(self) -> dict[str, Any] | None:
        """The most recent assistant message of the episode, or None."""
        return next((m for m in reversed(self.messages) if m.get("role") == "assistant"), None)

    def rejected(self) -> dict[str, Any] | None:
        """The invalid message the last re-ask round corrects, or None for a first answer."""
        return self.rounds[-1][0] if self.rounds else None

    def executed_calls(self) -> list[ExecutedCall]:
        """Every tool call of the assistant in the episode, with its answer, in order."""
        answers = {
            m.get("tool_call_id"): _text(m.get("content"))
            for m in self.messages
            if m.get("role") == "tool"
        }
        out = []
        for message in self.messages:
            if message.get("role") != "assistant":
                continue
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                name = function.get("name")
                if not isinstance(name, str):
                    continue
                out.append(
                    ExecutedCall(
                        name,
                        parse_arguments(function.get("arguments")),
                        answers.get(call.get("id")),
                    )
                )
        return out

    def answered_asks(self, text: str) -> int:
        """How many assistant messages containing `text` were followed by a user message."""
        count = 0
        pending = False
        for message in self.messages:
            role = message.get("role")
            if role == "assistant":
                if pending:
                    continue
                pending = text in _text(message.get("content"))
            elif role == "user" and pending:
                count += 1
                pending = False
        return count

    def says(self, text: str) -> bool:
        """Whether some assistant message of the episode contains `text`."""
        return any(
            m.get("role") == "assistant" and text in _text(m.get("content")) for m in self.messages
        )


def read_conversation(messages: Sequence[dict[str, Any]]) -> Conversation:
    """Split a request's messages into the episode and its trailing re-ask rounds.

    System messages are dropped. A round is an assistant message followed only by corrective
    tool answers to its calls and at most one corrective user note, and at least one of them.
    """
    body = [m for m in messages if isinstance(m, dict) and m.get("role") != "system"]
    rounds: list[list[dict[str, Any]]] = []
    end = len(body)
    while True:
        start = _round_start(body, end)
        if start is None:
            break
        rounds.insert(0, body[start:end])
        end = start
    return Conversation(body[:end], rounds)


def _round_start(body: list[dict[str, Any]], end: int) -> int | None:
    position = end
    if position > 0 and body[position - 1].get("role") == "user":
        if not is_corrective_user_text(_text(body[position - 1].get("content"))):
            return None
        position -= 1
    answered: list[str] = []
    while position > 0 and body[position - 1].get("role") == "tool":
        if not is_corrective_tool_text(_text(body[position - 1].get("content"))):
            return None
        answered.insert(0, str(body[position - 1].get("tool_call_id")))
        position -= 1
    if position == end or position == 0 or body[position - 1].get("role") != "assistant":
        return None
    calls = body[position - 1].get("tool_calls") or []
    if [str(c.get("id")) for c in calls] != answered:
        return None
    return position - 1


def parse_arguments(arguments: object) -> dict[str, Any] | None:
    """A call's arguments as a dict (blank means none), or None when they are not a JSON object."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str):
        return None
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
