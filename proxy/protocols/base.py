"""The turn's neutral vocabulary, and what a wire protocol's adapter provides to speak it.

An adapter translates and does nothing else: no I/O, no clock, no accounting. The turn
(`proxy.pipeline`) reads a request through `WireProtocol.view`, sends the client's body (and the
adapter's re-asks) to `WireProtocol.path`, and hands every upstream reply or stream event back to
the adapter to read and to write. Between the two sides a tool call always has one shape, the
guard's: an assistant message

    {"role": "assistant", "content": str | None,
     "tool_calls": [{"id": call_id, "type": "function",
                     "function": {"name": str, "arguments": str}}]}

with a finish of `"stop"`, `"tool_calls"` or `"length"` (stopped at the token limit), and, where
the answer has reasoning (a Responses `reasoning` item, a Messages `thinking` block), its text under
`"reasoning"`, as chat's own messages carry it: the guard scans it for leaked calls, and an adapter
writes its answer back from what it read, so the reasoning reaches the client unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from proxy.errors import BadRequestError, ToolsentryError
from proxy.guard.channels import Violation
from proxy.guard.repair import corrective_messages
from proxy.guard.strict import StrictForm
from proxy.guard.toolcheck import DEFAULT_LIMITS, GuardLimits, ToolIndex, compile_tools
from proxy.session.budget import SessionHints
from proxy.sse import SSEEvent

Message = dict[str, Any]
"""An assistant message in the guard's shape (see the module docstring)."""


class Finish(StrEnum):
    """Why an answer ended, in Chat Completions' words (each protocol maps it to its own)."""

    STOP = "stop"
    TOOL_CALLS = "tool_calls"
    LENGTH = "length"  # the token limit: Responses `max_output_tokens`, Messages `max_tokens`


class API(StrEnum):
    """The wire protocols, by the name the metrics and `evalkit replay --api` use."""

    CHAT = "chat"
    RESPONSES = "responses"
    MESSAGES = "messages"


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool's result that the client sends back in its request.

    `is_error` is the protocol's own flag where it has one (Anthropic's `is_error`); None means
    the turn judges the text by the configured prefix (τ²-bench's `Error…`).
    """

    call_id: str
    text: str
    is_error: bool | None = None


@dataclass(frozen=True, slots=True)
class TurnView:
    """A request as the turn sees it, whatever protocol it came in.

    `index`: the request's tools compiled for the guard; `tool_choice`: in the chat form the
    guard reads (`"auto" | "none" | "required" | {"type": "function", "function": {"name"}}`);
    `model`: the body's `model` as sent (any JSON value); `stream`: whether the client asked for a
    stream.
    """

    model: object
    index: ToolIndex
    tool_choice: object
    hints: SessionHints
    tool_results: Sequence[ToolResult] = ()
    stream: bool = False


# Not frozen: a frozen dataclass costs three times as much to make, and one is made per choice
# of every answer (the reference's too); nothing assigns to one once made.
@dataclass(slots=True)
class Choice:
    """One answer of the model in the guard's shape, ready to validate."""

    index: int
    message: Message
    finish_reason: str | None


@dataclass(slots=True)
class Reply:
    """An upstream's non-streamed answer: its body as parsed, and the choices in it.

    `response_id`: the id a later request may continue from (Responses' `previous_response_id`);
    the turn remembers which session it belongs to. None for protocols without chaining.
    """

    body: dict[str, Any]
    choices: list[Choice]
    response_id: str | None = None


@dataclass(frozen=True, slots=True)
class Settled:
    """A choice after validation and repair: the message the client gets and its finish.

    `changed`: it differs from what the upstream sent (the adapter must write it back);
    `usage`: the usage objects of the re-asks it took, in the protocol's own shape.
    """

    index: int
    message: Message
    finish_reason: str | None
    changed: bool
    usage: Sequence[Mapping[str, Any]] = field(default_factory=tuple)


class StreamAssembly(Protocol):
    """One client stream of one protocol: reads the upstream's events, writes the client's.

    The stream driver feeds it every upstream event (`add`), emits what it returns at once, then
    settles the choices `take_finished` hands over, has the turn count them, and emits what
    `release` returns for each. When the
    upstream's stream is over (`done` is true, or the body ended), the driver sends the turn's
    summary comment, then `end()`. An error after the first byte is sent as `error_event`.
    """

    @property
    def done(self) -> bool:
        """Whether the upstream sent its terminal event (`[DONE]`, `response.completed`)."""
        ...

    @property
    def response_id(self) -> str | None:
        """The id a later request may continue from, once known (see `Reply.response_id`)."""
        ...

    def add(self, event: SSEEvent) -> list[bytes]:
        """Absorb one upstream event; return the encoded events the client gets now.

        Raises UpstreamStatusError for an upstream error event and UpstreamProtocolError for an
        event that does not belong in the stream.
        """
        ...

    def take_finished(self) -> list[Choice]:
        """The choices that finished since the last call; each must be `release`d."""
        ...

    def release(self, settled: Settled) -> list[bytes]:
        """The encoded events that deliver a settled choice (its calls, its finish)."""
        ...

    def end(self) -> bytes:
        """The encoded terminal event(s), sent after the summary comment.

        Raises UpstreamProtocolError when the upstream's stream ended before it was complete.
        """
        ...

    def error_event(self, error: ToolsentryError) -> bytes:
        """The protocol's error event for a failure after the first byte, and what ends the
        stream after it where the protocol has one: chat's error chunk then `[DONE]` (as vLLM
        ends a failed stream), Responses' `error` then `response.failed`, Messages' `error`."""
        ...


class WireProtocol(Protocol):
    """A wire protocol's adapter: pure translation between its bodies and the turn."""

    api: API
    """The protocol's `api` label in metrics and logs: `chat`, `responses`, `messages`."""

    path: str
    """The upstream path it is served at, relative to the upstream's base URL."""

    resent: tuple[str, ...]
    """Top-level keys, besides `tools`, whose arrays its clients resend byte for byte every turn:
    the route's body parser remembers their parse (proxy/http/jsonbody.py)."""

    def compile_tools(self, tools: list[Any]) -> ToolIndex:
        """The body's `tools` (a list) compiled for the guard, each function under the name a
        call of it carries. Raises BadRequestError for tools the guard cannot take. The body
        parser calls it once per distinct tool list an agent resends."""
        ...

    def view(self, body: dict[str, Any], index: ToolIndex | None) -> TurnView:
        """The request's neutral view. `index`: its tools already compiled, when known.

        Raises BadRequestError for a body this protocol cannot serve.
        """
        ...

    def read(self, data: Any, upstream: str) -> Reply:
        """An upstream's 200 body as a Reply. Raises UpstreamProtocolError naming `upstream`."""
        ...

    def write(
        self, reply: Reply, settled: Sequence[Settled], usage: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """The body the client gets: `reply` with the changed choices of `settled` written
        back, and `usage` (every attempt's, summed) when not None."""
        ...

    def reask(
        self,
        body: dict[str, Any],
        message: Message,
        violations: Sequence[Violation],
        index: ToolIndex,
    ) -> dict[str, Any]:
        """The next request of a re-ask, non-streamed: `body` (the client's, or the last re-ask)
        continued with `message` as the model sent it and a corrective answer per violation, in
        this protocol's own form."""
        ...

    def finish(self, body: dict[str, Any], text: str) -> dict[str, Any]:
        """A complete, normal answer whose text is `text` (the budget's `finish` policy)."""
        ...

    def finish_stream(self, answer: dict[str, Any], body: dict[str, Any]) -> tuple[bytes, bytes]:
        """`answer` (from `finish`) as a stream: its encoded events, and its terminal event(s)
        to send after the summary comment."""
        ...

    def error(self, error: ToolsentryError) -> dict[str, Any]:
        """The body of an error response in this protocol's shape."""
        ...

    def assembly(self, body: dict[str, Any]) -> StreamAssembly:
        """A fresh StreamAssembly for one streamed request with this body."""
        ...


class Adapter:
    """What every adapter shares: the guard's limits, the body's tools compiled under them, the
    checks of the request fields more than one protocol has, and the re-ask.

    A protocol whose tools are not chat's says how they read in chat's form (`guard_tools`);
    its `view` compiles the body's `declared_tools` with `tool_index`. A protocol whose
    conversation is not chat's says how a re-ask continues it (`reask_continuation`, and
    `reask_history` where it is not the body's `messages`).
    """

    resent: tuple[str, ...] = ()

    reasked: str = "messages"
    """The body's key whose array a re-ask continues: chat's and Messages' `messages`."""

    not_reasked: frozenset[str] = frozenset({"stream"})
    """The body's keys a re-ask leaves out: it asks for one answer, not streamed, whatever the
    client asked for."""

    def __init__(self, limits: GuardLimits = DEFAULT_LIMITS) -> None:
        self.limits = limits

    def guard_tools(self, tools: list[Any]) -> list[Any]:
        """The body's `tools` in the chat form the guard compiles (chat's own are that form).

        Raises BadRequestError(param="tools") for a tool the protocol does not know how to read.
        """
        return tools

    def compile_tools(self, tools: list[Any]) -> ToolIndex:
        return compile_tools(self.guard_tools(tools), limits=self.limits)

    def tool_index(self, tools: list[Any], index: ToolIndex | None) -> ToolIndex:
        """`tools` (a body's `declared_tools`) compiled for the guard, or `index` when the body
        parser already compiled them. Raises BadRequestError for tools the guard cannot take."""
        return self.compile_tools(tools) if index is None else index

    def reask(
        self,
        body: dict[str, Any],
        message: Message,
        violations: Sequence[Violation],
        index: ToolIndex,
    ) -> dict[str, Any]:
        request = {k: v for k, v in body.items() if k not in self.not_reasked}
        request[self.reasked] = [
            *self.reask_history(body),
            *self.reask_continuation(message, violations, index),
        ]
        return request

    def reask_history(self, body: dict[str, Any]) -> list[Any]:
        """The conversation so far that a re-ask continues: the body's `reasked` array."""
        history: list[Any] = body[self.reasked]
        return history

    def reask_continuation(
        self, message: Message, violations: Sequence[Violation], index: ToolIndex
    ) -> list[dict[str, Any]]:
        """What a re-ask appends to the conversation, in this protocol's form: `message` as the
        model sent it and a corrective answer per violation (chat's own are the guard's)."""
        return corrective_messages(message, violations, index)

    @staticmethod
    def declared_tools(body: Mapping[str, Any]) -> list[Any]:
        """The body's `tools`, [] when it has none.

        Raises BadRequestError(param="tools") when `tools` is not an array.
        """
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise BadRequestError("'tools' must be an array", param="tools")
        return tools or []

    @staticmethod
    def conversation(body: Mapping[str, Any]) -> list[Any]:
        """The body's `messages` (chat's and Messages' conversation).

        Raises BadRequestError(param="messages") when it is not a non-empty array.
        """
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequestError("'messages' must be a non-empty array", param="messages")
        return messages


def strict_tool(tool: object, forms: Mapping[str, StrictForm], schema_key: str) -> object:
    """A tool whose name and schema sit at its top level, declared strict in its strict form."""
    if not isinstance(tool, dict):
        return tool
    name = tool.get("name")
    form = forms.get(name) if isinstance(name, str) else None
    kind = tool.get("type", "function" if schema_key == "parameters" else "custom")
    if form is None or form.schema is None or kind not in ("function", "custom"):
        return tool
    return {**tool, schema_key: form.schema, "strict": True}
