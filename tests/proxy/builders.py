"""Builders for test data: tools and requests, so tests say only what matters to them."""

from __future__ import annotations

from typing import Any


def make_tool(
    name: str,
    properties: dict[str, Any] | None = None,
    required: list[str] | None = None,
    *,
    additional: bool | None = False,
) -> dict[str, Any]:
    params: dict[str, Any] = {"type": "object", "properties": properties or {}}
    if required is not None:
        params["required"] = required
    if additional is not None:
        params["additionalProperties"] = additional
    return {
        "type": "function",
        "function": {"name": name, "description": f"{name} tool", "parameters": params},
    }


RETAIL_TOOLS = [
    make_tool("get_order_details", {"order_id": {"type": "string"}}, ["order_id"]),
    make_tool(
        "cancel_pending_order",
        {
            "order_id": {"type": "string"},
            "reason": {"type": "string", "enum": ["no longer needed", "ordered by mistake"]},
        },
        ["order_id", "reason"],
    ),
    make_tool("find_user_id_by_email", {"email": {"type": "string"}}, ["email"]),
]


def make_request(
    content: str = "Cancel order #W1 please.",
    *,
    tools: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "model": "scripted-model",
        "messages": [
            {"role": "system", "content": "You are a retail agent."},
            {"role": "user", "content": content},
        ],
        "tools": RETAIL_TOOLS if tools is None else tools,
        **extra,
    }
