"""The messages of a trajectory, in τ²-bench's shape (`role`, `content`, `tool_calls`, tool `error`).

Every model keeps unknown fields (`extra="allow"`), so a message read from a τ²-bench results file
is written back unchanged; `dump_message` drops only the fields that were never set.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

Requestor = Literal["assistant", "user"]

STOP_TOKEN = "###STOP###"
TRANSFER_TOKEN = "###TRANSFER###"
OUT_OF_SCOPE_TOKEN = "###OUT-OF-SCOPE###"
USER_STOP_TOKENS = (STOP_TOKEN, TRANSFER_TOKEN, OUT_OF_SCOPE_TOKEN)


def now_iso() -> str:
    """The current local time in ISO format, as τ²-bench stamps its messages."""
    return datetime.datetime.now().isoformat()


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class ToolCall(_Model):
    """One call as the episode sees it: `arguments` is a parsed JSON object.

    `raw_arguments` keeps the model's text when it was not a JSON object (the environment then
    answers with an error instead of running the tool).
    """

    id: str = ""
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    requestor: Requestor = "assistant"
    raw_arguments: str | None = None


class _Turn(_Model):
    content: str | None = None
    turn_idx: int | None = None
    timestamp: str | None = None

    def has_text(self) -> bool:
        """Whether the message carries non-blank text."""
        return self.content is not None and bool(self.content.strip())


class SystemMessage(_Turn):
    role: Literal["system"] = "system"


class _Participant(_Turn):
    tool_calls: list[ToolCall] | None = None
    cost: float | None = None
    usage: dict[str, Any] | None = None
    raw_data: dict[str, Any] | None = None

    def is_tool_call(self) -> bool:
        """Whether the message asks the environment to run tools."""
        return bool(self.tool_calls)


class AssistantMessage(_Participant):
    """An agent message; `proxy_headers` keeps the proxy's `x-toolsentry-*` response headers."""

    role: Literal["assistant"] = "assistant"
    proxy_headers: dict[str, str] | None = None


class UserMessage(_Participant):
    role: Literal["user"] = "user"


class ToolMessage(_Turn):
    """The environment's answer to one tool call; `id` is the call's id."""

    role: Literal["tool"] = "tool"
    id: str = ""
    requestor: Requestor = "assistant"
    error: bool = False


Message = Annotated[
    SystemMessage | AssistantMessage | UserMessage | ToolMessage, Field(discriminator="role")
]
_MESSAGE = TypeAdapter(Message)


def parse_message(data: Any) -> SystemMessage | AssistantMessage | UserMessage | ToolMessage:
    """Validate one message dict (any role). Raises pydantic's `ValidationError` on bad input."""
    return _MESSAGE.validate_python(data)


def dump_message(
    message: SystemMessage | AssistantMessage | UserMessage | ToolMessage,
) -> dict[str, Any]:
    """A JSON-ready dict of `message` with the fields that were set (so files round-trip)."""
    out = message.model_dump(mode="json", exclude_unset=True)
    out["role"] = message.role
    return out


def is_user_stop(message: UserMessage) -> bool:
    """Whether a user message ends the conversation (τ²-bench's three user tokens)."""
    return message.content is not None and any(t in message.content for t in USER_STOP_TOKENS)


def is_agent_stop(message: AssistantMessage) -> bool:
    """Whether an agent message ends the conversation (`###STOP###` in its text)."""
    return message.content is not None and STOP_TOKEN in message.content


def agent_view(history: Iterable[Any]) -> list[Any]:
    """What the agent sees: assistant messages, user text, and the answers to its own calls."""
    return [m for m in history if _seen_by(m, "assistant")]


def user_view(history: Iterable[Any]) -> list[Any]:
    """What the user sees: agent text, its own messages, and the answers to its own calls."""
    return [m for m in history if _seen_by(m, "user")]


def _seen_by(message: Any, side: Requestor) -> bool:
    own, other = (
        (AssistantMessage, UserMessage) if side == "assistant" else (UserMessage, AssistantMessage)
    )
    if isinstance(message, own):
        return True
    if isinstance(message, other):
        return not message.is_tool_call()
    return isinstance(message, ToolMessage) and message.requestor == side
