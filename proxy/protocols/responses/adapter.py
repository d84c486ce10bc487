"""The Responses API (`POST /v1/responses`: Codex CLI, the OpenAI Agents SDK) as a wire protocol
of the turn.

A response's `output` is a list of items; the guard's message is read from it: the text of its
`message` items is the content, each `function_call` item a call whose id is its `call_id`, the
text of its `reasoning` items the reasoning (scanned for leaked calls, never changed).
Built-in tool calls (`web_search_call`, `mcp_call`, …) and custom tool calls become calls of
their own type, which the guard never flags. A function inside a `namespace` tool is called with
the function's `name` and the namespace in the item's `namespace` field (the OpenAI SDK's
`ResponseFunctionToolCall.namespace`); the guard knows it as `namespace.name`, the name its repair
texts show the model. The message keeps the items it was read from (`ITEMS`), so what the client
gets is written back from them: items of calls that were stripped are dropped, a repaired answer
is the re-ask's own output.

A re-ask continues the request's `input` with the model's output items, one
`function_call_output` per call carrying the corrective text, and a user message for what has no
call id (DESIGN §6).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Any, Final

import proxy.protocols.responses.answer as wire
from proxy.errors import (
    BadRequestError,
    ToolsentryError,
    UpstreamProtocolError,
    UpstreamStatusError,
)
from proxy.guard.channels import Violation
from proxy.guard.repair import corrective_messages
from proxy.guard.toolcheck import ToolIndex
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
from proxy.protocols.responses.tools import call_name, chat_tools, guard_tool_choice
from proxy.session.budget import SessionHints, content_text
from proxy.sse import SSEEvent, encode_typed_event
from proxy.usage import sum_usage

ITEMS: Final = "_response_items"
"""The key of a guard message under which the output items it was read from are kept."""
RESPONSE_ID: Final = "_response_id"
"""The key of a guard message under which the id of the response it was read from is kept."""

_NOT_REASKED: Final = frozenset({"stream", "stream_options", "background"})
_TERMINAL: Final = frozenset({"response.completed", "response.incomplete", "response.failed"})
_CALL_TYPES: Final = frozenset({"function_call", "custom_tool_call"})
_NOT_ACTIONS: Final = frozenset({"message", "reasoning", "function_call"})
_DICT: Final = repeat(dict)  # `map(isinstance, items, _DICT)`: every item checked in C
_REASONING_DELTAS: Final = {
    "response.reasoning_text.delta": "content",
    "response.reasoning_summary_text.delta": "summary",
}


class ResponsesProtocol(Adapter):
    """The Responses adapter (see `proxy.protocols.base.WireProtocol`)."""

    api = API.RESPONSES
    path = "responses"

    def guard_tools(self, tools: list[Any]) -> list[Any]:
        return chat_tools(tools)

    def view(self, body: dict[str, Any], index: ToolIndex | None) -> TurnView:
        items = input_items(body.get("input"))
        tools = self.declared_tools(body)
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise BadRequestError("'instructions' must be a string", param="instructions")
        previous = body.get("previous_response_id")
        if previous is not None and not isinstance(previous, str):
            raise BadRequestError(
                "'previous_response_id' must be a string", param="previous_response_id"
            )
        index = self.tool_index(tools, index)
        model = body.get("model")
        metadata = body.get("metadata")
        system = instructions or _first_text(items, ("system", "developer"))
        hints = SessionHints(
            (model if isinstance(model, str) else "", system, _first_text(items, ("user",))),
            declared=metadata.get("session_id") if isinstance(metadata, Mapping) else None,
            previous_response_id=previous,
            user=body.get("user"),
        )
        return TurnView(
            model,
            index,
            guard_tool_choice(body.get("tool_choice")),
            hints,
            tool_results(items),
            bool(body.get("stream")),
        )

    def read(self, data: Any, upstream: str) -> Reply:
        output = data.get("output") if isinstance(data, dict) else None
        if not isinstance(output, list):
            raise UpstreamProtocolError(
                f"upstream '{upstream}' answered 200 with a body that is not a response"
            )
        if not all(map(isinstance, output, _DICT)):
            raise UpstreamProtocolError(
                f"upstream '{upstream}' sent an output item that is not an object"
            )
        if data.get("status") == "failed":
            raise _failed(data, upstream)
        response_id = data.get("id")
        if not isinstance(response_id, str):
            response_id = None
        message = guard_message(output, response_id)
        return Reply(data, [Choice(0, message, finish_of(data, message))], response_id)

    def write(
        self, reply: Reply, settled: Sequence[Settled], usage: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        body = dict(reply.body)
        for done in settled[:1]:
            if done.changed:
                body["output"] = output_items(done.message)
                response_id = done.message.get(RESPONSE_ID)
                if isinstance(response_id, str):
                    body["id"] = response_id
                _set_status(body, done.finish_reason)
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
        corrections = corrective_messages(message, violations, index)
        answered = {m["tool_call_id"] for m in corrections if m.get("role") == "tool"}
        continued: list[Any] = []
        for item in message.get(ITEMS) or []:
            if item.get("type") in _CALL_TYPES and item.get("call_id") not in answered:
                continue  # a call without an id the correction can answer is left out
            continued.append(_as_input(item))
        for correction in corrections:
            if correction.get("role") == "tool":
                continued.append(
                    {
                        "type": "function_call_output",
                        "call_id": correction["tool_call_id"],
                        "output": correction["content"],
                    }
                )
            elif correction.get("role") == "user":
                continued.append(
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": correction["content"]}],
                    }
                )
        request["input"] = [*input_items(body.get("input")), *continued]
        return request

    def finish(self, body: dict[str, Any], text: str) -> dict[str, Any]:
        model = body.get("model")
        return {
            "id": f"resp_toolsentry_{uuid.uuid4().hex[:24]}",
            "object": "response",
            "created_at": int(time.time()),
            "model": model if isinstance(model, str) else "",
            "status": "completed",
            "incomplete_details": None,
            "error": None,
            "output": [_text_item(text)],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "usage": {
                "input_tokens": 0,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 0,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 0,
            },
        }

    def finish_stream(self, answer: dict[str, Any], body: dict[str, Any]) -> tuple[bytes, bytes]:
        writer = _EventWriter()
        started = {**answer, "status": "in_progress", "output": [], "usage": None}
        *events, completed = wire.stream(started, answer, None)
        return b"".join(map(writer.forward, events)), writer.forward(completed)

    def error(self, error: ToolsentryError) -> dict[str, Any]:
        return error.body()

    def assembly(self, body: dict[str, Any]) -> ResponsesAssembly:
        return ResponsesAssembly()


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
        self._writer = _EventWriter()
        self._indices: dict[int, int] = {}  # upstream output_index -> the client's
        self._sent: list[dict[str, Any]] = []  # the client's items, by its output_index
        self._held: dict[int, dict[str, Any]] = {}  # upstream output_index -> call item
        self._held_order: list[int] = []
        self._items: dict[int, dict[str, Any]] = {}  # upstream output_index -> item when done
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
                raise _failed(response, "")
            self._terminal, self._terminal_kind = response, kind
            if isinstance(response.get("id"), str):
                self.response_id = response["id"]
            self._finished.append(self._choice(response))
            self.done = True
            return []
        index = payload.get("output_index")
        if kind in ("response.created", "response.in_progress", "response.queued"):
            response = payload.get("response")
            if isinstance(response, dict) and isinstance(response.get("id"), str):
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
            elif kind == "response.function_call_arguments.done":
                self._held[index] = {**self._held[index], "arguments": payload.get("arguments")}
            elif kind == "response.function_call_arguments.delta":
                held = self._held[index]
                delta = payload.get("delta")
                text = held.get("arguments") or ""
                self._held[index] = {**held, "arguments": text + (delta or "")}
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
            _set_status(response, final["finish"])
        kind = (
            "response.incomplete"
            if response.get("status") == "incomplete"
            else "response.completed"
        )
        return self._writer.event(kind, response=response)

    def error_event(self, error: ToolsentryError) -> bytes:
        body = error.body()["error"]
        return self._writer.event(
            "error",
            code=body.get("code") or body.get("type"),
            message=body["message"],
            param=body.get("param"),
        )

    def _choice(self, response: dict[str, Any]) -> Choice:
        output = response.get("output")
        by_upstream: list[dict[str, Any]] = []
        if isinstance(output, list) and output:
            by_upstream = [item for item in output if isinstance(item, dict)]
        else:  # a terminal event without output: the items as streamed
            by_upstream = [*self._sent, *(self._held[i] for i in self._held_order)]
        # The calls are the held ones (the streamed arguments are what the model sent).
        calls = {item.get("call_id"): item for item in (self._held[i] for i in self._held_order)}
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


class _EventWriter:
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


# -- translation, pure functions ---------------------------------------------------------------


def input_items(value: object) -> list[Any]:
    """A request's `input` as a list of items (a string is one user message). Raises
    BadRequestError for any other form."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        return value
    if value is None:
        raise BadRequestError("'input' is required", param="input")
    raise BadRequestError("'input' must be a string or an array of items", param="input")


def tool_results(items: list[Any]) -> list[ToolResult]:
    """The `function_call_output` items of a request's input, in order."""
    return [
        ToolResult(item["call_id"], content_text(item.get("output")))
        for item in items
        if isinstance(item, dict)
        and item.get("type") == "function_call_output"
        and isinstance(item.get("call_id"), str)
        and item["call_id"]
    ]


def guard_message(
    output: list[dict[str, Any]],
    response_id: str | None,
    streamed: Mapping[object, str] | None = None,
) -> Message:
    """The guard's message for a response's output items (which it keeps under `ITEMS`).

    The text of its `reasoning` items is the message's `reasoning`, which the guard scans for
    leaked calls (the items themselves go back unchanged); `streamed`: a stream's reasoning text
    by item id, read for an item that carries none.
    """
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    for item in output:
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                if not isinstance(part, dict):
                    continue
                what = part.get("type")
                if what == "output_text":
                    texts.append(_text(part.get("text")))
                elif what == "refusal":
                    texts.append(_text(part.get("refusal")))
        elif kind == "function_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": call_name(item), "arguments": item.get("arguments")},
                }
            )
        elif kind == "reasoning":
            thought = reasoning_text(item) or (streamed or {}).get(item.get("id"), "")
            if thought:
                thoughts.append(thought)
        elif kind not in _NOT_ACTIONS and isinstance(kind, str):
            # A built-in or custom tool's call: an action of the model, never flagged.
            calls.append({"id": item.get("call_id") or item.get("id"), "type": kind})
    message: Message = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    if thoughts:
        message["reasoning"] = "\n".join(thoughts)
    message[ITEMS] = output
    if response_id is not None:
        message[RESPONSE_ID] = response_id
    return message


def _text(value: object) -> str:
    """A part's text as the guard reads it: a string as it is, nothing as "", else its str()."""
    return value if isinstance(value, str) else str(value or "")


def reasoning_text(item: Mapping[str, Any]) -> str:
    """A `reasoning` item's text: its `content` parts (`reasoning_text`) joined, else its
    `summary` parts (a summary restates the content: reading both would find one call twice).
    An item with only `encrypted_content` has none."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list):
            text = "".join(str(p.get("text") or "") for p in parts if isinstance(p, dict))
            if text:
                return text
    return ""


def output_items(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The output items of a settled guard message: those it was read from, without the function
    calls it no longer has, each kept call as the message has it now (a local fix may have
    renamed it or mended its arguments)."""
    calls = {
        call.get("id"): call
        for call in message.get("tool_calls") or []
        if isinstance(call, dict) and call.get("type") == "function"
    }
    out = []
    for item in message.get(ITEMS) or []:
        if item.get("type") != "function_call":
            out.append(item)
            continue
        call = calls.get(item.get("call_id"))
        if call is None:
            continue
        function = call.get("function") or {}
        name, arguments = function.get("name"), function.get("arguments")
        if name != call_name(item) and isinstance(name, str):
            namespace, _, short = name.rpartition(".")
            item = {**item, "name": short if namespace == item.get("namespace") else name}
        if arguments != item.get("arguments"):
            item = {**item, "arguments": arguments}
        out.append(item)
    return out


def finish_of(response: Mapping[str, Any], message: Mapping[str, Any]) -> str:
    """The guard's finish for a response: `length` when it stopped at `max_output_tokens`."""
    if response.get("status") == "incomplete":
        details = response.get("incomplete_details")
        if isinstance(details, dict) and details.get("reason") == "max_output_tokens":
            return Finish.LENGTH
    return Finish.TOOL_CALLS if message.get("tool_calls") else Finish.STOP


def _set_status(body: dict[str, Any], finish: str | None) -> None:
    if finish == Finish.LENGTH:
        body["status"] = "incomplete"
        body["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        body["status"] = "completed"
        body["incomplete_details"] = None


def _as_input(item: dict[str, Any]) -> dict[str, Any]:
    # An output item goes back as input without the fields only output items carry.
    return {k: v for k, v in item.items() if k != "status" or item.get("type") == "message"}


def _text_item(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_toolsentry_{uuid.uuid4().hex[:24]}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _first_text(items: list[Any], roles: tuple[str, ...]) -> str:
    for item in items:
        is_message = isinstance(item, dict) and item.get("type", "message") == "message"
        if is_message and item.get("role") in roles:
            return content_text(item.get("content"))
    return ""


def _failed(response: Mapping[str, Any], upstream: str) -> UpstreamStatusError:
    error = response.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    who = f"upstream '{upstream}'" if upstream else "upstream"
    text = f"{who} failed the response: {message or 'no reason given'}"
    return UpstreamStatusError(
        text,
        status=502,
        body={"error": {"message": text, "type": "upstream_error", "param": None, "code": None}},
    )


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
