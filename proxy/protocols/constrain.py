"""A re-ask plan (`proxy.guard.repair.ReaskPlan`) written into a request of each wire protocol.

The plan says which call to ask for (a named tool, `required`, or `none`), which tools to declare
`strict: true` with which parameters, and whether to ask for one call only; each function here
writes that into a request body in its protocol's own fields, as vLLM reads them:

- chat: `tool_choice` (`{"type": "function", "function": {"name"}}`), `tools[].function.strict`
  and `.parameters`, `parallel_tool_calls: false`;
- responses: `tool_choice` (`{"type": "function", "name"}`), flat function tools' `strict` and
  `parameters`, `parallel_tool_calls: false`;
- messages: `tool_choice` (`{"type": "tool", "name"}`, `{"type": "any"}`, `{"type": "none"}`,
  with `disable_parallel_tool_use`), `tools[].strict` and `.input_schema`.

Pure: each returns a new body and leaves its input alone. `FOR_API` maps a protocol's `api`
label to its function; a protocol without one gets plain re-asks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from proxy.guard.repair import ReaskPlan, mark_strict
from proxy.guard.strict import StrictForm

Constrain = Callable[[dict[str, Any], ReaskPlan], dict[str, Any]]


def chat(body: dict[str, Any], plan: ReaskPlan) -> dict[str, Any]:
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


def responses(body: dict[str, Any], plan: ReaskPlan) -> dict[str, Any]:
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
        return _strict_flat(tool, forms, "parameters")
    namespace, inner = tool.get("name"), tool.get("tools")
    if not isinstance(namespace, str) or not isinstance(inner, list):
        return tool
    prefixed = {
        name.removeprefix(f"{namespace}."): form
        for name, form in forms.items()
        if name.startswith(f"{namespace}.")
    }
    return {**tool, "tools": [_strict_flat(part, prefixed, "parameters") for part in inner]}


def messages(body: dict[str, Any], plan: ReaskPlan) -> dict[str, Any]:
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
        out["tools"] = [_strict_flat(tool, plan.strict, "input_schema") for tool in tools]
    return out


def _strict_flat(tool: object, forms: Mapping[str, StrictForm], schema_key: str) -> object:
    """A tool whose name and schema sit at its top level, declared strict in its strict form."""
    if not isinstance(tool, dict):
        return tool
    name = tool.get("name")
    form = forms.get(name) if isinstance(name, str) else None
    kind = tool.get("type", "function" if schema_key == "parameters" else "custom")
    if form is None or form.schema is None or kind not in ("function", "custom"):
        return tool
    return {**tool, schema_key: form.schema, "strict": True}


FOR_API: Final[Mapping[str, Constrain]] = {
    "chat": chat,
    "responses": responses,
    "messages": messages,
}
