"""Test-data builders for the guard's tests: tools, tool calls and assistant messages."""

from __future__ import annotations

import itertools
import json
from typing import Any

_ids = itertools.count(1)


def make_tool(
    name: str,
    properties: dict[str, Any] | None = None,
    required: list[str] | tuple[str, ...] = (),
    *,
    parameters: Any = ...,
    closed: bool = True,
    description: str | None = None,
) -> dict[str, Any]:
    """An OpenAI function tool; `parameters` overrides the object schema built from the rest
    (pass None to leave `parameters` out)."""
    function: dict[str, Any] = {"name": name, "description": description or f"{name} tool"}
    if parameters is ...:
        parameters = {"type": "object", "properties": properties or {}, "required": list(required)}
        if closed:
            parameters["additionalProperties"] = False
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def make_call(
    name: str, arguments: dict[str, Any] | str | None = None, *, call_id: Any = ...
) -> dict[str, Any]:
    """A tool call as a chat completion returns it; dict arguments are JSON-encoded, a string is
    sent as it is; `call_id=None` leaves the id out."""
    if arguments is None:
        arguments = {}
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": text}}
    if call_id is ...:
        call_id = f"call_{next(_ids)}"
    if call_id is not None:
        call["id"] = call_id
    return call


def make_message(*calls: dict[str, Any], content: str | None = None) -> dict[str, Any]:
    """An assistant message with the given tool calls (no `tool_calls` key when there are none)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return message


def named_choice(name: str) -> dict[str, Any]:
    """A `tool_choice` that forces one function."""
    return {"type": "function", "function": {"name": name}}


ORDER_ID = {"type": "string", "pattern": r"^#W\d{7}$"}
ADDRESS = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "zip": {"type": "string", "pattern": r"^\d{5}$"},
    },
    "required": ["city", "zip"],
    "additionalProperties": False,
}


def retail_tools() -> list[dict[str, Any]]:
    """A small retail-like tool set: lookups, an enum, a nested object, an array, a no-arg tool."""
    return [
        make_tool("get_order_details", {"order_id": ORDER_ID}, ["order_id"]),
        make_tool(
            "cancel_pending_order",
            {
                "order_id": ORDER_ID,
                "reason": {"type": "string", "enum": ["no longer needed", "ordered by mistake"]},
            },
            ["order_id", "reason"],
        ),
        make_tool(
            "modify_user_address",
            {"user_id": {"type": "string"}, "address": ADDRESS},
            ["user_id", "address"],
        ),
        make_tool(
            "return_delivered_order_items",
            {
                "order_id": ORDER_ID,
                "item_ids": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            },
            ["order_id", "item_ids"],
        ),
        make_tool("list_all_product_types"),
    ]
