"""A Responses request read for the turn (its input items, tool results, opening texts) and
continued for a re-ask: the request's `input` goes on with the model's output items, one
`function_call_output` per call carrying the corrective text, and a user message for what has no
call id (DESIGN §6)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from proxy.errors import BadRequestError
from proxy.guard.channels import Violation
from proxy.guard.repair import corrective_messages
from proxy.guard.toolcheck import ToolIndex
from proxy.protocols.base import Message, ToolResult
from proxy.protocols.responses.reply import ITEMS
from proxy.session.budget import content_text

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
