"""Re-ask plans and request bodies the constrain tests of every protocol share."""

from __future__ import annotations

from typing import Any

from proxy.guard.repair import ReaskPlan
from proxy.guard.strict import strict_form

SCHEMA = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
STRICT = strict_form(SCHEMA)
NAMED = ReaskPlan(
    {"type": "function", "function": {"name": "lookup"}},
    "clear",
    {"lookup": STRICT},
    single_call=True,
)
REQUIRED = ReaskPlan(
    "required", "unclear", {"lookup": STRICT}, {"free": "free-form"}, single_call=True
)
NONE = ReaskPlan("none", "not wanted")


def chat_body() -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [],
        "tool_choice": "auto",
        "tools": [
            {"type": "function", "function": {"name": "lookup", "parameters": SCHEMA}},
            {"type": "function", "function": {"name": "free", "parameters": {"type": "object"}}},
        ],
    }


def responses_body() -> dict[str, Any]:
    return {
        "model": "m",
        "input": "hi",
        "tools": [
            {"type": "function", "name": "lookup", "parameters": SCHEMA},
            {"type": "function", "name": "free", "parameters": {"type": "object"}},
            {"type": "web_search"},
        ],
    }


def messages_body() -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 10,
        "messages": [],
        "tools": [
            {"name": "lookup", "input_schema": SCHEMA},
            {"name": "free", "input_schema": {"type": "object"}},
            {"type": "bash_20250124", "name": "bash"},
        ],
    }
