"""Anthropic Messages tools and `tool_choice` in the chat form the guard reads (and the simulator's
model decides from): the one translation of a Messages request's tools."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.errors import BadRequestError


def chat_tools(tools: Sequence[Any]) -> list[Any]:
    """Messages tools in the chat form the guard compiles. Server tools (a `type` such as
    `web_search_20250305`, `bash_20250124`) are answered by the server, never called as
    `tool_use`, and left out; a custom tool (`type` absent or `custom`) needs a `name`.

    Raises BadRequestError(param="tools") for a tool that is not an object or has no name.
    """
    out: list[Any] = []
    for position, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise BadRequestError(f"tools[{position}] must be an object", param="tools")
        if tool.get("type") not in (None, "custom"):
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequestError(f"tools[{position}] needs a 'name'", param="tools")
        function: dict[str, Any] = {"name": name, "parameters": tool.get("input_schema") or {}}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def tool_choice(choice: object) -> object:
    """Messages' `tool_choice` in the guard's chat form: `auto`, `any` → `required`, `none`,
    `{"type": "tool", "name": N}` → the named form. Anything else is left to the upstream."""
    if not isinstance(choice, dict):
        return None
    kind = choice.get("type")
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if kind in ("auto", "none"):
        return kind
    return None
