"""A re-ask plan (`proxy.guard.repair.ReaskPlan`) written into an Anthropic Messages request, as
vLLM reads it: `tool_choice` (`{"type": "tool", "name"}`, `{"type": "any"}`, `{"type": "none"}`,
with `disable_parallel_tool_use`), `tools[].strict` and `.input_schema`. Pure: returns a new
body."""

from __future__ import annotations

from typing import Any

from proxy.guard.repair import ReaskPlan
from proxy.protocols.base import strict_tool


def constrain(body: dict[str, Any], plan: ReaskPlan) -> dict[str, Any]:
    """An Anthropic Messages request asking for what `plan` says."""
    out = dict(body)
    name = plan.named
    choice: dict[str, Any] | None
    if name is not None:
        choice = {"type": "tool", "name": name}
    elif plan.tool_choice == "required":
        choice = {"type": "any"}
    elif plan.tool_choice == "none":
        choice = {"type": "none"}
    else:
        choice = None
    if choice is not None:
        if plan.single_call:
            choice["disable_parallel_tool_use"] = True
        out["tool_choice"] = choice
    tools = out.get("tools")
    if plan.strict and isinstance(tools, list):
        out["tools"] = [strict_tool(tool, plan.strict, "input_schema") for tool in tools]
    return out
