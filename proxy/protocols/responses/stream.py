"""One Responses stream assembled for the turn (see `proxy.protocols.base.StreamAssembly`); the
events it writes are `proxy.protocols.responses.answer`'s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import proxy.protocols.responses.answer as wire
from proxy.errors import ToolsentryError, UpstreamProtocolError, UpstreamStatusError
from proxy.protocols.base import Choice, Settled
from proxy.protocols.responses.reply import (
    failed,
    finish_of,
    guard_message,
    output_items,
    reasoning_text,
    set_status,
)
from proxy.sse import SSEEvent, encode_typed_event
from proxy.usage import sum_usage

_TERMINAL: Final = frozenset({"response.completed", "response.incomplete", "response.failed"})
_REASONING_DELTAS: Final = {
    "response.reasoning_text.delta": "content",
    "response.reasoning_summary_text.delta": "summary",
}


class ResponsesAssembly:
    """One Responses stream (see `proxy.protocols.base.StreamAssembly`).

    Text, reasoning and built-in tool events pass through as they come (the reasoning deltas are
    also kept, for the leak scan of an item whose done event carries no text); `function_call`
    items and their argument events are held until the response's terminal event, then sent whole
    (added, one arguments delta, arguments done, done) as the settled message has them. Every
    event the client gets is numbered again (`sequence_number` from 0, `output_index` in the
    order the client saw the items added), so the SDK's accumulator and the terminal event's
    response agree.
    """

    def __init__(self) -> None:
        self.done = False
        self.response_id: str | None = None
        self._writer = EventWriter()
        self._indices: dict[int, int] = {}  # upstream output_index -> the client's
        self._sent: list[dict[str, Any]] = []  # the client's items, by its output_index
        self._held: dict[int, dict[str, Any]] = {}  # upstream output_index -> call item
        self._held_order: list[int] = []
        # A held call's streamed arguments, in pieces until its `.done` (joined once: see `_call`).
        self._arguments: dict[int, list[str]] = {}
        self._items: dict[int, dict[str, Any]] = {}  # upstream output_index -> item when done
        self._opened: dict[str, Any] = {}  # the response as its opening events had it
        self._terminal: dict[str, Any] | None = None
        self._terminal_kind = "response.completed"
        self._finished: list[Choice] = []
        self._usage: list[Mapping[str, Any]] = []
        self._final: dict[str, Any] | None = None
        # reasoning item id -> its streamed text, by part kind ("content", "summary")
        self._reasoning: dict[object, dict[str, list[str]]] = {}

    def add(self, event: SSEEvent) -> list[bytes]:
        payload = event.payload
        if payload is None:  # `[DONE]` is not part of this protocol; some servers send it
            return []
        kind = payload.get("type") or event.event
        if kind == "error":
            raise _stream_error(payload)
        if kind in _TERMINAL:
            response = payload.get("response")
            if not isinstance(response, dict):
                raise UpstreamProtocolError(f"upstream sent a {kind} event without its response")
            if kind == "response.failed":
                raise failed(response, "")
            self._terminal, self._terminal_kind = response, kind
            if isinstance(response.get("id"), str):
                self.response_id = response["id"]
            self._finished.append(self._choice(response))
            self.done = True
            return []
        index = payload.get("output_index")
        if kind in ("response.created", "response.in_progress", "response.queued"):
            response = payload.get("response")
            if isinstance(response, dict):
                self._opened = response
                if isinstance(response.get("id"), str):
                    self.response_id = response["id"]
            return [self._writer.forward(payload)]
        if not isinstance(index, int):
            return [self._writer.forward(payload)]
        if kind == "response.output_item.added":
            item = payload.get("item")
            if not isinstance(item, dict):
                raise UpstreamProtocolError("upstream sent an output item that is not an object")
            if item.get("type") == "function_call":
                self._held[index] = item
                self._held_order.append(index)
                return []
            self._indices[index] = len(self._sent)
            self._sent.append(item)
        elif index in self._held:
            if kind == "response.output_item.done" and isinstance(payload.get("item"), dict):
                self._held[index] = payload["item"]
                self._arguments.pop(index, None)
            elif kind == "response.function_call_arguments.done":
                self._held[index] = {**self._held[index], "arguments": payload.get("arguments")}
                self._arguments.pop(index, None)
            elif kind == "response.function_call_arguments.delta":
                pieces = self._arguments.get(index)
                if pieces is None:
                    pieces = self._arguments[index] = [self._held[index].get("arguments") or ""]
                pieces.append(payload.get("delta") or "")
            return []
        if index not in self._indices:
            raise UpstreamProtocolError(
                f"upstream sent {kind} for output item {index} before adding it"
            )
        client_index = self._indices[index]
        if kind == "response.output_item.done" and isinstance(payload.get("item"), dict):
            self._sent[client_index] = payload["item"]
        elif kind in _REASONING_DELTAS:
            parts = self._reasoning.setdefault(payload.get("item_id"), {})
            parts.setdefault(_REASONING_DELTAS[kind], []).append(str(payload.get("delta") or ""))
        return [self._writer.forward({**payload, "output_index": client_index})]

    def take_finished(self) -> list[Choice]:
        finished, self._finished = self._finished, []
        return finished

    def release(self, settled: Settled) -> list[bytes]:
        self._usage.extend(settled.usage)
        items = output_items(settled.message)
        events: list[bytes] = []
        sent_ids = {item.get("id") for item in self._sent}
        sent_text = any(item.get("type") == "message" for item in self._sent)
        for item in items:
            if item.get("id") in sent_ids and item.get("type") != "function_call":
                continue  # the client has it already
            if item.get("type") != "function_call" and (sent_text or not settled.changed):
                continue  # text the client has stands; what it was not sent it does not get
            position = len(self._sent)
            self._sent.append(item)
            events += self._writer.item_events(position, item)
        self._final = {"finish": settled.finish_reason}
        return events

    def end(self) -> bytes:
        if self._terminal is None:
            raise UpstreamProtocolError("upstream stream ended before the response completed")
        response = dict(self._terminal)
        response["output"] = list(self._sent)
        if self._usage:
            response["usage"] = sum_usage([response.get("usage") or {}, *self._usage])
        final = self._final or {}
        if isinstance(final.get("id"), str):
            response["id"] = final["id"]
        if "finish" in final:
            set_status(response, final["finish"])
        kind = (
            "response.incomplete"
            if response.get("status") == "incomplete"
            else "response.completed"
        )
        return self._writer.event(kind, response=response)

    def error_event(self, error: ToolsentryError) -> bytes:
        body = error.body()["error"]
        code, message = body.get("code") or body.get("type"), body["message"]
        # The SDKs read `error` as an event like any other; `response.failed` ends the response
        # (the Agents SDK and Codex CLI wait for a terminal event), with what the client has.
        response = {
            **self._opened,
            "status": "failed",
            "output": list(self._sent),
            "error": {"code": code, "message": message},
        }
        return self._writer.event(
            "error", code=code, message=message, param=body.get("param")
        ) + self._writer.event("response.failed", response=response)

    def _call(self, index: int) -> dict[str, Any]:
        """The held call at upstream `index`, its streamed arguments joined (once) if no
        `.done` event gave them whole: `+=` on a held text copies all of it at every delta."""
        pieces = self._arguments.pop(index, None)
        if pieces is not None:
            self._held[index] = {**self._held[index], "arguments": "".join(pieces)}
        return self._held[index]

    def _choice(self, response: dict[str, Any]) -> Choice:
        output = response.get("output")
        by_upstream: list[dict[str, Any]] = []
        if isinstance(output, list) and output:
            by_upstream = [item for item in output if isinstance(item, dict)]
        else:  # a terminal event without output: the items as streamed
            by_upstream = [*self._sent, *(self._call(i) for i in self._held_order)]
        # The calls are the held ones (the streamed arguments are what the model sent).
        calls = {item.get("call_id"): item for item in (self._call(i) for i in self._held_order)}
        merged = [
            calls.get(item.get("call_id"), item) if item.get("type") == "function_call" else item
            for item in by_upstream
        ]
        known = {item.get("call_id") for item in merged if item.get("type") == "function_call"}
        merged += [item for key, item in calls.items() if key not in known]
        streamed = {
            item_id: reasoning_text(
                {key: [{"text": "".join(pieces)}] for key, pieces in parts.items()}
            )
            for item_id, parts in self._reasoning.items()
        }
        message = guard_message(merged, self.response_id, streamed)
        return Choice(0, message, finish_of(response, message))


class EventWriter:
    """Encodes the client's events, numbering them from 0."""

    def __init__(self) -> None:
        self._next = 0

    def forward(self, payload: Mapping[str, Any]) -> bytes:
        number, self._next = self._next, self._next + 1
        return encode_typed_event({**payload, "sequence_number": number})

    def event(self, kind: str, **fields: Any) -> bytes:
        return self.forward({"type": kind, **fields})

    def item_events(self, position: int, item: dict[str, Any]) -> list[bytes]:
        """The events that stream one whole item at client position `position`."""
        return [self.forward(event) for event in wire.item_events(item, position, None)]


def _stream_error(payload: Mapping[str, Any]) -> UpstreamStatusError:
    message = payload.get("message") or "the upstream sent an error event"
    body = {
        "error": {
            "message": str(message),
            "type": "upstream_error",
            "param": payload.get("param"),
            "code": payload.get("code"),
        }
    }
    return UpstreamStatusError(str(message), status=502, body=body)
