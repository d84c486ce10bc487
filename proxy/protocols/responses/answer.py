"""An `Answer` as the Responses API writes it: a `response` object, or its stream events.

Shapes follow vLLM's Responses server (`vllm/entrypoints/openai/responses/`, simple path): output
items in the order reasoning, message (one `output_text` part), then one `function_call` item per
call; `status: incomplete` with `incomplete_details.reason: max_output_tokens` when the token limit
cut the answer; usage with vLLM's details. A stream is `response.created`, `response.in_progress`,
each item's `output_item.added`, its content events, `output_item.done`, then `response.completed`
(vLLM sends it for incomplete answers too), every event numbered by `sequence_number`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from proxy.protocols.answer import DEFAULT_FRAGMENT, Answer, Call, Finish, Thinking, Usage, pieces

_ECHOED: Final[
    tuple[tuple[str, Any], ...]
] = (  # request fields a vLLM response carries back, with vLLM's defaults
    ("instructions", None),
    ("metadata", None),
    ("parallel_tool_calls", True),
    ("temperature", 1.0),
    ("tool_choice", "auto"),
    ("tools", []),
    ("top_p", 1.0),
    ("background", False),
    ("max_output_tokens", None),
    ("max_tool_calls", None),
    ("previous_response_id", None),
    ("prompt", None),
    ("reasoning", None),
    ("service_tier", "auto"),
    ("text", None),
    ("top_logprobs", None),
    ("truncation", "disabled"),
    ("user", None),
)

Event = dict[str, Any]


def usage(counts: Usage) -> dict[str, Any]:
    """`usage` in vLLM's shape: totals and their details (cached input, reasoning output)."""
    return {
        "input_tokens": counts.input_tokens,
        "input_tokens_details": {
            "cached_tokens": counts.cached_tokens,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": counts.output_tokens,
        "output_tokens_details": {
            "reasoning_tokens": counts.reasoning_tokens,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": counts.total_tokens,
    }


def function_call_item(call: Call, item_id: str, *, status: str = "completed") -> dict[str, Any]:
    """A `function_call` output item; `namespace` only when the call has one."""
    item: dict[str, Any] = {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if status != "in_progress" else "",
        "status": status,
    }
    if call.namespace is not None:
        item["namespace"] = call.namespace
    return item


def message_item(text: str, item_id: str, *, status: str = "completed") -> dict[str, Any]:
    """A `message` output item with one `output_text` part (none while in progress)."""
    content = [] if status == "in_progress" else [_text_part(text, logprobs=None)]
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "content": content,
        "status": status,
    }


def reasoning_item(
    thinking: Thinking, item_id: str, *, status: str | None = None
) -> dict[str, Any]:
    """A `reasoning` output item; a redacted block travels as `encrypted_content`."""
    item: dict[str, Any] = {"id": item_id, "type": "reasoning", "summary": []}
    if thinking.redacted:
        item["encrypted_content"] = thinking.text
    elif status != "in_progress":
        item["content"] = [{"type": "reasoning_text", "text": thinking.text}]
    item["status"] = status
    return item


def output(answer: Answer, *, streamed: bool = False) -> list[dict[str, Any]]:
    """The answer's output items, finished (reasoning items carry status `completed` once
    streamed, none in a plain body, as vLLM writes them)."""
    items = [
        reasoning_item(t, _reasoning_id(answer, i), status="completed" if streamed else None)
        for i, t in enumerate(answer.thinking)
    ]
    if answer.text:
        items.append(message_item(answer.text, _message_id(answer)))
    items += [function_call_item(c, _call_id(answer, i)) for i, c in enumerate(answer.calls)]
    return items


def body(
    answer: Answer,
    request: Mapping[str, Any] | None = None,
    *,
    streamed: bool = False,
) -> dict[str, Any]:
    """The `response` object for the answer to `request` (whose settings it echoes)."""
    incomplete = answer.finish_reason is Finish.LENGTH
    return _envelope(
        answer,
        request,
        status="incomplete" if incomplete else "completed",
        items=output(answer, streamed=streamed),
        usage=usage(answer.usage),
    )


def events(
    answer: Answer,
    request: Mapping[str, Any] | None = None,
    *,
    fragment: int | None = DEFAULT_FRAGMENT,
) -> list[Event]:
    """The stream of the answer: lifecycle, each item's events, `response.completed`.

    Text and arguments go out in deltas of `fragment` characters (whole when None).
    """
    started = _envelope(answer, request, status="in_progress", items=[], usage=None)
    completed = body(answer, request, streamed=True)
    return numbered(stream(started, completed, fragment))


def stream(
    started: Mapping[str, Any], completed: Mapping[str, Any], fragment: int | None
) -> list[Event]:
    """The events that stream the response `completed` whole (without sequence numbers):
    `response.created` and `response.in_progress` carrying `started`, each output item's events
    (`item_events`), then `response.completed`."""
    out: list[Event] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    for index, item in enumerate(completed.get("output") or []):
        out += item_events(item, index, fragment)
    out.append({"type": "response.completed", "response": completed})
    return out


def numbered(stream: list[Event], start: int = 0) -> list[Event]:
    """The events with `sequence_number`s from `start` on, in order."""
    return [{**event, "sequence_number": start + i} for i, event in enumerate(stream)]


def item_events(item: Mapping[str, Any], output_index: int, fragment: int | None) -> list[Event]:
    """The events that stream one finished output item at `output_index` (without sequence
    numbers): `output_item.added` (the item in progress), its content's events in deltas of
    `fragment` characters (whole when None), `output_item.done` (the item as it is).

    A `message` streams each `output_text` part, a `function_call` its arguments, a `reasoning`
    item its `reasoning_text` parts (an encrypted one is added and done whole); any other item
    is added and done whole.
    """
    kind = item.get("type")
    if kind == "function_call":
        opened = {**item, "arguments": "", "status": "in_progress"}
        inner = _arguments_events(item, output_index, fragment)
    elif kind == "message":
        opened = {**item, "content": [], "status": "in_progress"}
        inner = _parts_events(item, output_index, fragment, "output_text")
    elif kind == "reasoning":
        opened = {k: v for k, v in item.items() if k != "content"} | {"status": "in_progress"}
        inner = _parts_events(item, output_index, fragment, "reasoning_text")
    else:
        opened, inner = dict(item), []
    return [_item("added", output_index, opened), *inner, _item("done", output_index, dict(item))]


def _arguments_events(
    item: Mapping[str, Any], output_index: int, fragment: int | None
) -> list[Event]:
    at = {"output_index": output_index, "item_id": item.get("id")}
    arguments = item.get("arguments") or ""
    out: list[Event] = [
        {"type": "response.function_call_arguments.delta", **at, "delta": piece}
        for piece in pieces(arguments, fragment)
    ]
    out.append(
        {
            "type": "response.function_call_arguments.done",
            **at,
            "arguments": arguments,
            "name": item.get("name"),
        }
    )
    return out


def _parts_events(
    item: Mapping[str, Any], output_index: int, fragment: int | None, streamed: str
) -> list[Event]:
    """The events of an item's content parts: each added empty, its text in deltas when it is
    of the `streamed` kind, done."""
    out: list[Event] = []
    text_event = "response.output_text" if streamed == "output_text" else "response.reasoning_text"
    # Text events of a message carry `logprobs` (none here); a reasoning item's do not.
    logprobs: dict[str, Any] = {"logprobs": []} if streamed == "output_text" else {}
    for position, part in enumerate(item.get("content") or []):
        at = {"output_index": output_index, "item_id": item.get("id"), "content_index": position}
        if not isinstance(part, dict) or part.get("type") != streamed:
            out += [
                {"type": "response.content_part.added", **at, "part": part},
                {"type": "response.content_part.done", **at, "part": part},
            ]
            continue
        text = part.get("text") or ""
        out.append({"type": "response.content_part.added", **at, "part": _empty(part)})
        out += [
            {"type": f"{text_event}.delta", **at, "delta": piece, **logprobs}
            for piece in pieces(text, fragment)
        ]
        out += [
            {"type": f"{text_event}.done", **at, "text": text, **logprobs},
            {"type": "response.content_part.done", **at, "part": part},
        ]
    return out


def _empty(part: Mapping[str, Any]) -> dict[str, Any]:
    """A text part as it is added, before its text: an `output_text` part carries `logprobs: []`
    while it streams, as vLLM writes it."""
    if part.get("type") == "output_text":
        return {**part, "text": "", "logprobs": []}
    return {**part, "text": ""}


def error_event(message: str, code: str = "server_error", sequence_number: int = 0) -> Event:
    """The Responses stream's `error` event."""
    return {
        "type": "error",
        "code": code,
        "message": message,
        "param": None,
        "sequence_number": sequence_number,
    }


def _envelope(
    answer: Answer,
    request: Mapping[str, Any] | None,
    *,
    status: str,
    items: list[dict[str, Any]],
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    asked = request or {}
    incomplete = status == "incomplete"
    out: dict[str, Any] = {
        "id": f"resp_{answer.id}",
        "object": "response",
        "created_at": answer.created,
        "model": answer.model,
        "status": status,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "output": items,
        "usage": usage,
    }
    for key, default in _ECHOED:
        out[key] = asked.get(key, default)
    return {**out, **answer.extra}


def _item(stage: str, output_index: int, item: Mapping[str, Any]) -> Event:
    return {"type": f"response.output_item.{stage}", "output_index": output_index, "item": item}


def _text_part(text: str, *, logprobs: list[Any] | None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def _message_id(answer: Answer) -> str:
    return f"msg_{answer.id}"


def _reasoning_id(answer: Answer, position: int) -> str:
    return f"rs_{answer.id}_{position}"


def _call_id(answer: Answer, position: int) -> str:
    return f"fc_{answer.id}_{position}"
