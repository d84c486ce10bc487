"""One Messages stream assembled for the turn (see `proxy.protocols.base.StreamAssembly`).

It passes `message_start`, `ping`s, thinking and text blocks through as they come, holds every
`tool_use` block until `message_delta`, then sends the settled calls as blocks with consecutive
client `index`es, the `message_delta` and, after the summary comment, `message_stop`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import proxy.protocols.messages.answer as wire
from proxy.errors import ToolsentryError, UpstreamProtocolError, UpstreamStatusError
from proxy.protocols.answer import Call
from proxy.protocols.base import Choice, Message, Settled
from proxy.protocols.messages.reply import (
    THINKING_TYPES,
    arguments_text,
    error_body,
    finish_of,
    stop_reason_of,
    with_thinking,
)
from proxy.sse import SSEEvent, encode_event, encode_typed_event
from proxy.usage import sum_usage

_STATUS_OF_TYPE: Final = {kind: status for status, kind in wire.ERROR_TYPES.items()}


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
    _start_usage: Mapping[str, Any] | None = None  # message_start's usage, as it passed
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
            message = data.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            self._start_usage = usage if isinstance(usage, dict) else None
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
        if block.get("type") in THINKING_TYPES:
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
            # The first attempt's usage: message_delta's counts are totals so far, and a field
            # they leave out (Anthropic's API counts the input in message_start only) keeps
            # message_start's value; the re-asks' usages are added to that.
            first = {**(self._start_usage or {}), **(delta.get("usage") or {})}
            delta["usage"] = sum_usage([first, *settled.usage])
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
