"""Responses tools, `tool_choice` and call names in the chat form the guard reads (and the
simulator's model decides from): the one translation of a Responses request's tools."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from proxy.errors import BadRequestError


def qualified_name(namespace: str, name: object) -> str:
    """The name the guard knows a function inside a `namespace` tool by: `namespace.name`."""
    return f"{namespace}.{name}"


def chat_tools(
    tools: Sequence[Any], *, in_namespace: Callable[[str, object], object] = qualified_name
) -> list[Any]:
    """A Responses `tools` list in the chat form the guard compiles: function tools with their
    parameters, custom tools as names without a schema; built-in tools (`web_search`, `mcp`,
    `file_search`, …) are left out, so a call to one is never flagged. A function inside a
    `namespace` tool is named `in_namespace(namespace, name)`: the guard's `namespace.name` by
    default (vLLM's own server flattens it as `namespace__name` for the chat template and maps
    the model's call back; the guard shows the model the dotted name in its repair texts).

    Raises BadRequestError(param="tools") for a tool that is not an object, or a namespace
    tool without a name or a list of tools."""
    out: list[Any] = []
    for position, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise BadRequestError(f"tools[{position}] must be a tool object", param="tools")
        kind = tool.get("type", "function")
        if kind == "namespace":
            prefix = tool.get("name")
            members = tool.get("tools")
            if not isinstance(prefix, str) or not prefix or not isinstance(members, list):
                raise BadRequestError(
                    f"tools[{position}]: a namespace tool needs a name and a list of tools",
                    param="tools",
                )
            for member in members:
                if isinstance(member, dict) and member.get("type", "function") in (
                    "function",
                    "custom",
                ):
                    out.append(_guard_tool(member, in_namespace(prefix, member.get("name"))))
        elif kind in ("function", "custom"):
            out.append(_guard_tool(tool, tool.get("name")))
    return out


def _guard_tool(tool: dict[str, Any], name: object) -> dict[str, Any]:
    if tool.get("type", "function") == "custom":
        return {"type": "custom", "custom": {"name": name}}
    function: dict[str, Any] = {"name": name}
    if "description" in tool:
        function["description"] = tool["description"]
    if tool.get("parameters") is not None:
        function["parameters"] = tool["parameters"]
    return {"type": "function", "function": function}


def guard_tool_choice(tool_choice: object) -> object:
    """A Responses `tool_choice` in the chat form the guard reads. A forced built-in tool is not
    enforced (`auto`)."""
    if tool_choice in ("auto", "none", "required") or tool_choice is None:
        return tool_choice
    if isinstance(tool_choice, dict):
        kind = tool_choice.get("type")
        if kind == "function":
            return {"type": "function", "function": {"name": tool_choice.get("name")}}
        if kind == "allowed_tools":
            names = [
                {"type": "function", "function": {"name": t.get("name")}}
                for t in tool_choice.get("tools") or []
                if isinstance(t, dict) and t.get("type") == "function"
            ]
            return {
                "type": "allowed_tools",
                "allowed_tools": {"mode": tool_choice.get("mode"), "tools": names},
            }
    return "auto"


def call_name(item: Mapping[str, Any]) -> object:
    """The name the guard knows a call item by: `namespace.name` inside a namespace."""
    name, namespace = item.get("name"), item.get("namespace")
    if namespace and isinstance(namespace, str) and isinstance(name, str):
        return qualified_name(namespace, name)
    return name
