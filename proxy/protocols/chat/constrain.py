"""A re-ask plan (`proxy.guard.repair.ReaskPlan`) written into a chat-completions request, as vLLM
reads it: `tool_choice` (`{"type": "function", "function": {"name"}}`), `tools[].function.strict`
and `.parameters`, `parallel_tool_calls: false`. Pure: returns a new body."""

from __future__ import annotations

from typing import Any

from proxy.guard.repair import ReaskPlan, mark_strict


def constrain(body: dict[str, Any], plan: ReaskPlan) -> dict[str, Any]:
    """A chat-completions request asking for what `plan` says."""
    out = dict(body)
    if plan.tool_choice is not None:
        out["tool_choice"] = plan.tool_choice
    tools = out.get("tools")
    if plan.strict and isinstance(tools, list):
        out["tools"] = mark_strict(tools, plan.strict)
    if plan.single_call:
        out["parallel_tool_calls"] = False
    return out
