"""A re-ask plan (`proxy.guard.repair.ReaskPlan`) written into a Responses request, as vLLM reads
it: `tool_choice` (`{"type": "function", "name"}`), flat function tools' `strict` and
`parameters`, `parallel_tool_calls: false`. Pure: returns a new body."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.guard.repair import ReaskPlan
from proxy.guard.strict import StrictForm
from proxy.protocols.base import strict_tool


def constrain(body: dict[str, Any], plan: ReaskPlan) -> dict[str, Any]:
    """A Responses request asking for what `plan` says.

    A function inside a `namespace` tool (the guard's `namespace.name`) is marked strict inside
    its namespace; a plan naming one asks for `required` instead, since servers spell a
    namespaced function in `tool_choice` their own way (vLLM: `namespace__name`).
    """
    out = dict(body)
    tools = out.get("tools")
    tools = tools if isinstance(tools, list) else []
    name = plan.named
    flat = {t.get("name") for t in tools if isinstance(t, dict) and t.get("type") == "function"}
    if name is not None and name in flat:
        out["tool_choice"] = {"type": "function", "name": name}
    elif name is not None:
        out["tool_choice"] = "required"
    elif plan.tool_choice is not None:
        out["tool_choice"] = plan.tool_choice
    if plan.strict and tools:
        out["tools"] = [_strict_responses_tool(tool, plan.strict) for tool in tools]
    if plan.single_call:
        out["parallel_tool_calls"] = False
    return out


def _strict_responses_tool(tool: object, forms: Mapping[str, StrictForm]) -> object:
    if not isinstance(tool, dict) or tool.get("type") != "namespace":
        return strict_tool(tool, forms, "parameters")
    namespace, inner = tool.get("name"), tool.get("tools")
    if not isinstance(namespace, str) or not isinstance(inner, list):
        return tool
    prefixed = {
        name.removeprefix(f"{namespace}."): form
        for name, form in forms.items()
        if name.startswith(f"{namespace}.")
    }
    return {**tool, "tools": [strict_tool(part, prefixed, "parameters") for part in inner]}
