"""A Responses request read for the turn (its input items, tool results, opening texts, its
history) and continued for a re-ask: the request's `input` goes on with the model's output items, one
`function_call_output` per call carrying the corrective text, and a user message for what has no
call id (DESIGN §6)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from proxy.errors import BadRequestError
from proxy.guard.channels import Violation
from proxy.guard.repair import corrective_messages
from proxy.guard.toolcheck import ToolIndex
from proxy.protocols.base import Message, ToolResult
from proxy.protocols.responses.reply import ITEMS
from proxy.session.budget import content_text
from proxy.session.history import (
    SYSTEM,
    TOOL,
    USER,
    History,
    Item,
    arguments_text,
    assistant,
    canonical_json,
    digest_history,
)

_CALL_TYPES: Final = frozenset({"function_call", "custom_tool_call"})


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


def history(body: Mapping[str, Any]) -> History:
    """The digests of the body's model, `instructions` and `input` items: messages by role
    (system and developer as system text) with their parts' texts as `content_text` reads them,
    `function_call` and `custom_tool_call` items as an assistant's calls (call id, name,
    arguments or input), their outputs as tool results (call id, text); reasoning items are
    left out (clients drop or keep them), any other item is its canonical JSON without the `id`
    and `status` the server gave it, an assistant's unless its type ends in `_output`."""
    value = body.get("input")
    items = input_items(value) if isinstance(value, (str, list)) else []
    return digest_history(body.get("model"), _items(body.get("instructions"), items))


def _items(instructions: object, items: list[Any]) -> Iterator[Item]:
    if isinstance(instructions, str) and instructions:
        yield (SYSTEM, instructions)
    for item in items:
        if not isinstance(item, dict):
            yield ("", canonical_json(item))
            continue
        kind = item.get("type", "message")
        if not isinstance(kind, str):
            yield ("", canonical_json(item))
        elif kind == "message":
            role, text = item.get("role"), content_text(item.get("content"))
            if role == "assistant":
                yield assistant(text)
            elif role in ("system", "developer"):
                yield (SYSTEM, text)
            else:
                yield (USER if role == "user" else str(role), text)
        elif kind in _CALL_TYPES:
            arguments = item.get("arguments") if kind == "function_call" else item.get("input")
            call = (
                str(item.get("call_id") or ""),
                str(item.get("name") or ""),
                arguments_text(arguments),
            )
            yield assistant("", (call,))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            yield (TOOL, str(item.get("call_id") or ""), content_text(item.get("output")))
        elif kind != "reasoning":
            rest = {k: v for k, v in item.items() if k not in ("id", "status")}
            text = canonical_json(rest)
            yield (TOOL, "", text) if kind.endswith("_output") else assistant(text)


def first_text(items: list[Any], roles: tuple[str, ...]) -> str:
    """The text of the first message item of one of `roles`, "" when there is none."""
    for item in items:
        is_message = isinstance(item, dict) and item.get("type", "message") == "message"
        if is_message and item.get("role") in roles:
            return content_text(item.get("content"))
    return ""


def reask_items(
    message: Message, violations: Sequence[Violation], index: ToolIndex
) -> list[dict[str, Any]]:
    """The input items a re-ask adds: the model's output items (without the calls no correction
    answers), one `function_call_output` per call carrying its corrective text, and a user
    message for what has no call id."""
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
    return continued


def _as_input(item: dict[str, Any]) -> dict[str, Any]:
    # An output item goes back as input without the fields only output items carry.
    return {k: v for k, v in item.items() if k != "status" or item.get("type") == "message"}
