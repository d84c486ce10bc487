"""The Anthropic Messages API (`POST /v1/messages`) as a wire protocol of the turn (issue 15).

A Messages answer is read into the guard's message: its `text` blocks joined as `content`, each
`tool_use` block a call (`input` written back as JSON text; an `input` that is not an object stays
as it came, so the guard sees it malformed), `stop_reason` `max_tokens` → `length`, `tool_use` →
`tool_calls`. Thinking and redacted-thinking blocks ride along in the message under
`THINKING_KEY`, byte for byte, so a written-back answer and a re-ask's assistant turn keep them with
their signatures; their text is also the message's `reasoning`, which the guard scans for leaked
calls. A re-ask continues the conversation with the assistant turn (thinking, text, the `tool_use`
blocks as sent) and a user turn of `tool_result` blocks (`is_error: true`) carrying the
corrective texts, plus a text block for what has no call. A stream passes `message_start`, `ping`s,
thinking and text blocks through as they come, holds every `tool_use` block until `message_delta`,
then sends the settled calls as blocks with consecutive client `index`es, the `message_delta` and,
after the summary comment, `message_stop`. Errors are Anthropic's shape.
"""

from __future__ import annotations

import json
import operator
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Final

import orjson

import proxy.protocols.messages.answer as wire
from proxy.errors import (
    ToolsentryError,
    UpstreamProtocolError,
    UpstreamStatusError,
    status_of,
)
from proxy.guard.channels import Violation
from proxy.guard.repair import corrective_messages
from proxy.guard.toolcheck import ToolIndex
from proxy.protocols.answer import Answer, Call, Usage
from proxy.protocols.base import (
    API,
    Adapter,
    Choice,
    Finish,
    Message,
    Reply,
    Settled,
    ToolResult,
    TurnView,
)
from proxy.protocols.messages.tools import chat_tools, tool_choice
from proxy.session.budget import SessionHints, content_text
from proxy.sse import SSEEvent, encode_event, encode_typed_event
from proxy.usage import sum_usage

THINKING_KEY: Final = "thinking_blocks"
"""Where a read message keeps the answer's thinking blocks (the guard ignores it)."""

_NOT_REASKED: Final = frozenset({"stream"})
_STOP_REASONS: Final = {"max_tokens": Finish.LENGTH, "tool_use": Finish.TOOL_CALLS}
_FINISHES: Final[dict[str, str]] = {Finish.LENGTH: "max_tokens", Finish.TOOL_CALLS: "tool_use"}
_THINKING: Final = frozenset({"thinking", "redacted_thinking"})
# Anthropic's names for the proxy's generic error types (its own, such as
# error_budget_exhausted, are kept: they say what happened).
_ERROR_TYPES: Final = {"internal_error": "api_error"}
_STATUS_OF_TYPE: Final = {kind: status for status, kind in wire.ERROR_TYPES.items()}
# Every request resends the whole conversation, so its blocks are walked on every request: these
# feed `dict.get` over a block list in C (`map(_GET, blocks, _TYPE)`), which raises TypeError
# when a block is not an object.
_TYPE: Final = repeat("type")
_TEXT: Final = repeat("text")
_GET: Final[Callable[[Any, str], Any]] = dict.get


class MessagesProtocol(Adapter):
    """The Anthropic Messages adapter (see `proxy.protocols.base.WireProtocol`)."""

    api = API.MESSAGES
    path = "messages"
    resent: tuple[str, ...] = ("system",)  # Claude Code's system blocks, 7 kB

    def guard_tools(self, tools: list[Any]) -> list[Any]:
        return chat_tools(tools)

    def view(self, body: dict[str, Any], index: ToolIndex | None) -> TurnView:
        messages = self.conversation(body)
        return TurnView(
            body.get("model"),
            self.tool_index(self.declared_tools(body), index),
            tool_choice(body.get("tool_choice")),
            session_hints(body),
            tool_results(messages),
            bool(body.get("stream")),
        )

    def read(self, data: Any, upstream: str) -> Reply:
        content = data.get("content") if isinstance(data, dict) else None
        if not isinstance(content, list):
            raise UpstreamProtocolError(
                f"upstream '{upstream}' answered 200 with a body that is not a Messages message"
            )
        return Reply(data, [Choice(0, read_message(content), finish_of(data.get("stop_reason")))])

    def write(
        self, reply: Reply, settled: Sequence[Settled], usage: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        body = reply.body
        for done in settled:
            if done.changed:
                body["content"] = content_blocks(done.message)
                body["stop_reason"] = stop_reason_of(done.finish_reason, body.get("stop_reason"))
        if usage is not None:
            body["usage"] = dict(usage)
        return body

    def reask(
        self,
        body: dict[str, Any],
        message: Message,
        violations: Sequence[Violation],
        index: ToolIndex,
    ) -> dict[str, Any]:
        request = {k: v for k, v in body.items() if k not in _NOT_REASKED}
        request["messages"] = [*body["messages"], *reask_turns(message, violations, index)]
        return request

    def finish(self, body: dict[str, Any], text: str) -> dict[str, Any]:
        return wire.body(closing_answer(body, text))

    def finish_stream(self, answer: dict[str, Any], body: dict[str, Any]) -> tuple[bytes, bytes]:
        text = "".join(b.get("text", "") for b in answer.get("content") or [])
        *events, stop = wire.events(closing_answer(body, text, answer_id=answer["id"][4:]))
        return b"".join(encode_typed_event(e) for e in events), encode_typed_event(stop)

    def error(self, error: ToolsentryError) -> dict[str, Any]:
        return error_body(error)

    def assembly(self, body: dict[str, Any]) -> MessagesAssembly:
        return MessagesAssembly()


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


def closing_answer(body: Mapping[str, Any], text: str, *, answer_id: str | None = None) -> Answer:
    """The `finish` policy's answer: `text`, as a normal end of turn, no tokens counted."""
    model = body.get("model")
    return Answer(
        text=text,
        usage=Usage(0, 0),
        model=model if isinstance(model, str) else "",
        id=answer_id or f"toolsentry_{uuid.uuid4().hex[:24]}",
        created=int(time.time()),
    )


# -- the request ---------------------------------------------------------------------------------


def session_hints(body: Mapping[str, Any]) -> SessionHints:
    """The session hints of a Messages body: the `session_id` inside `metadata.user_id` (Claude
    Code writes a JSON string there), else that user id as the `user`; the fingerprint of the
    model, the first system text and the first user text."""
    metadata = body.get("metadata")
    # Most bodies have no metadata: None is told without the ABC's instance check.
    user_id = (
        metadata.get("user_id")
        if metadata is not None and (type(metadata) is dict or isinstance(metadata, Mapping))
        else None
    )
    declared, user = None, user_id
    if isinstance(user_id, str) and user_id.startswith("{"):
        inner = _json_object(user_id)
        if isinstance(inner, dict) and inner.get("session_id"):
            declared, user = inner["session_id"], None
    first_user = None
    for message in body.get("messages") or ():
        if isinstance(message, dict) and message.get("role") == "user":
            first_user = message.get("content")
            break
    model = body.get("model")
    # Positional: the named tuple's keyword arguments cost a third of its making.
    return SessionHints(
        (model if isinstance(model, str) else "", body.get("system"), first_user),
        declared,
        "metadata.user_id",
        None,
        user,
        _blocks_text,
    )


def _json_object(text: str) -> object:
    """`text` parsed as JSON, None when it is not JSON. orjson first; what it refuses and
    Python's parser takes (NaN, Infinity, lone surrogates) is read as Python reads it."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(text)
    except ValueError:
        return None


def tool_results(messages: Sequence[Any]) -> list[ToolResult]:
    """The `tool_result` blocks of the user turns, in order; `is_error: true` is a tool error."""
    out = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        try:
            if "tool_result" not in map(_GET, content, _TYPE):
                continue
        except TypeError:
            pass  # a block that is not an object: the walk below skips it
        for block in content:
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            call_id = block.get("tool_use_id")
            if isinstance(call_id, str) and call_id:
                text = _blocks_text(block.get("content"))
                out.append(ToolResult(call_id, text, block.get("is_error") is True))
    return out


def _blocks_text(content: object) -> str:
    """The text of a string or of content blocks (their `text` parts, as `content_text` reads
    each: a text that is not a string by its block's canonical JSON)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return content_text(content)
    if len(content) == 1:  # a user turn of one text block, the most usual: no iterators made
        block = content[0]
        if type(block) is dict and block.get("type") == "text":
            text = block.get("text")
            if type(text) is str:
                return text
    try:  # the usual case, in C: every block a text block whose text is a string
        if all(map(operator.eq, map(_GET, content, _TYPE), _TEXT)):
            return "".join(map(_GET, content, _TEXT))
    except TypeError:  # a block that is not an object, or a text that is not a string
        pass
    pieces = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            text = block.get("text")
            pieces.append(text if isinstance(text, str) else content_text([block]))
    return "".join(pieces)


# -- the answer ----------------------------------------------------------------------------------


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
        elif kind in _THINKING:
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


def reask_turns(
    message: Message, violations: Sequence[Violation], index: ToolIndex
) -> list[dict[str, Any]]:
    """The model's answer and the corrective answers to it, as Messages turns: the assistant turn
    (without an empty text block), then one user turn of `tool_result` blocks (`is_error: true`)
    for the calls and a text block for what has no call."""
    assistant, *answers = corrective_messages(message, violations, index)
    turns: list[dict[str, Any]] = []
    blocks = [
        b for b in content_blocks({**message, **assistant}) if b != {"type": "text", "text": ""}
    ]
    for block in blocks:
        if block["type"] == "tool_use" and not isinstance(block["input"], dict):
            block[
                "input"
            ] = {}  # the server takes only an object; the tool_result says what was wrong
    if blocks:
        turns.append({"role": "assistant", "content": blocks})
    user: list[dict[str, Any]] = []
    for answer in answers:
        if answer.get("role") == "tool":
            user.append(
                {
                    "type": "tool_result",
                    "tool_use_id": answer.get("tool_call_id"),
                    "content": content_text(answer.get("content")),
                    "is_error": True,
                }
            )
        else:
            user.append({"type": "text", "text": content_text(answer.get("content"))})
    if user:
        turns.append({"role": "user", "content": user})
    return turns


# -- the stream ----------------------------------------------------------------------------------


# A stream's texts are kept as their pieces and joined once: `+=` on an attribute copies the
# whole text at every delta, quadratic in a long answer, thought or `Write` input.


@dataclass(slots=True)
class _HeldCall:
    id: object
    name: object
    arguments: list[str] = field(default_factory=list)  # the input's JSON text, in pieces


@dataclass(slots=True)
class _Thought:
    block: dict[str, Any]
    text: list[str]  # the thinking, in pieces
    signature: str | None = None

    def whole(self) -> dict[str, Any]:
        if self.block.get("type") != "thinking":
            return self.block
        return {**self.block, "thinking": "".join(self.text), "signature": self.signature or ""}


@dataclass(slots=True)
class MessagesAssembly:
    """One Messages stream (see `proxy.protocols.base.StreamAssembly`)."""

    done: bool = False
    response_id: None = None  # Messages do not chain
    _started: bool = False
    _text: list[str] = field(default_factory=list)  # the text passed to the client, in pieces
    _held: dict[int, _HeldCall] = field(default_factory=dict)  # upstream index → call
    _passed: dict[int, int] = field(default_factory=dict)  # upstream index → client index
    _thoughts: dict[int, _Thought] = field(default_factory=dict)
    _next_index: int = 0
    _delta: dict[str, Any] | None = None  # the upstream's message_delta, held
    _finished: bool = False
    _taken: bool = False
    _released: bool = False

    def add(self, event: SSEEvent) -> list[bytes]:
        data = event.payload
        if data is None:  # `[DONE]`: vLLM sends none here, some servers end with it anyway
            if not self._finished:
                raise UpstreamProtocolError("upstream sent [DONE] before its message_delta")
            self.done = True
            return []
        kind = data.get("type")
        if kind == "error" or event.event == "error":
            raise _stream_error(data)
        if kind == "message_start":
            self._started = True
            return [encode_typed_event(data)]
        if not self._started:
            raise UpstreamProtocolError(f"upstream sent {kind!r} before message_start")
        if kind == "ping":
            return [encode_typed_event(data)]
        if kind == "content_block_start":
            return self._start(data)
        if kind in ("content_block_delta", "content_block_stop"):
            return self._block_event(data)
        if kind == "message_delta":
            self._delta, self._finished = data, True
            return []
        if kind == "message_stop":
            self.done = True
            return []
        return [
            encode_typed_event(data)
        ]  # an event type of a newer API version: the client decides

    def _start(self, data: dict[str, Any]) -> list[bytes]:
        upstream, block = data.get("index"), data.get("content_block")
        if not isinstance(upstream, int) or not isinstance(block, dict):
            raise UpstreamProtocolError(
                "upstream sent a content_block_start without index or block"
            )
        if block.get("type") == "tool_use":
            self._held[upstream] = _HeldCall(block.get("id"), block.get("name"))
            start_input = block.get("input")
            if start_input not in (None, {}):
                self._held[upstream].arguments.append(arguments_text(start_input))
            return []
        if block.get("type") in _THINKING:
            self._thoughts[upstream] = _Thought(dict(block), [str(block.get("thinking") or "")])
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            self._text.append(block["text"])
        return [self._pass(upstream, data)]

    def _block_event(self, data: dict[str, Any]) -> list[bytes]:
        upstream = data.get("index")
        if not isinstance(upstream, int):
            raise UpstreamProtocolError(f"upstream sent a {data.get('type')} without an index")
        held = self._held.get(upstream)
        delta = data.get("delta")
        if held is not None:
            if isinstance(delta, dict) and delta.get("type") == "input_json_delta":
                held.arguments.append(str(delta.get("partial_json") or ""))
            return []
        if upstream not in self._passed:
            raise UpstreamProtocolError(
                f"upstream sent an event for block {upstream} it never started"
            )
        if isinstance(delta, dict):
            if delta.get("type") == "text_delta":
                self._text.append(str(delta.get("text") or ""))
            thought = self._thoughts.get(upstream)
            if thought is not None and delta.get("type") == "thinking_delta":
                thought.text.append(str(delta.get("thinking") or ""))
            elif thought is not None and delta.get("type") == "signature_delta":
                thought.signature = str(delta.get("signature") or "")
        return [self._pass(upstream, data)]

    def _pass(self, upstream: int, data: dict[str, Any]) -> bytes:
        index = self._passed.get(upstream)
        if index is None:
            index = self._passed[upstream] = self._next_index
            self._next_index += 1
        if index == upstream and type(upstream) is int:  # the usual case: the event as it came
            return encode_typed_event(data)
        return encode_typed_event({**data, "index": index})

    def take_finished(self) -> list[Choice]:
        if not self._finished or self._taken:
            return []
        self._taken = True
        calls = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": "".join(call.arguments) or "{}"},
            }
            for _, call in sorted(self._held.items())
        ]
        message: Message = {"role": "assistant", "content": "".join(self._text) or None}
        if calls:
            message["tool_calls"] = calls
        with_thinking(message, [t.whole() for _, t in sorted(self._thoughts.items())])
        delta = (self._delta or {}).get("delta") or {}
        return [Choice(0, message, finish_of(delta.get("stop_reason")))]

    def release(self, settled: Settled) -> list[bytes]:
        self._released = True
        out: list[bytes] = []
        content = settled.message.get("content")
        sent = "".join(self._text)
        if isinstance(content, str) and content.startswith(sent) and content != sent:
            out += [
                encode_typed_event(e)
                for e in wire.text_events(content[len(sent) :], self._next_index, None)
            ]
            self._next_index += 1
        for call in settled.message.get("tool_calls") or []:
            function = call.get("function") or {}
            events = wire.tool_use_events(
                _call(call.get("id"), function.get("name"), function.get("arguments")),
                self._next_index,
                None,
            )
            out += [encode_typed_event(e) for e in events]
            self._next_index += 1
        delta = dict(self._delta or {"type": "message_delta", "delta": {}})
        inner = dict(delta.get("delta") or {})
        inner["stop_reason"] = stop_reason_of(settled.finish_reason, inner.get("stop_reason"))
        delta["delta"] = inner
        if settled.usage:
            delta["usage"] = sum_usage([delta.get("usage") or {}, *settled.usage])
        out.append(encode_typed_event(delta))
        return out

    def end(self) -> bytes:
        if not self._released:
            raise UpstreamProtocolError("upstream stream ended before its message_delta")
        return encode_typed_event({"type": "message_stop"})

    def error_event(self, error: ToolsentryError) -> bytes:
        return encode_event(error_body(error), "error")


def _call(call_id: object, name: object, arguments: object) -> Call:
    return Call(
        str(name or ""), arguments if isinstance(arguments, str) else "{}", str(call_id or "")
    )


def _stream_error(data: Mapping[str, Any]) -> ToolsentryError:
    error = data.get("error")
    if not isinstance(error, dict):
        error = {}
    kind = str(error.get("type") or "api_error")
    message = f"upstream failed during the stream: {error.get('message')}"
    return UpstreamStatusError(message, status=_STATUS_OF_TYPE.get(kind, 502), body=dict(data))
