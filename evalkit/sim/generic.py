"""The simulated model's answer to a request that names no task: a generic scripted turn, so that
a client pointed at `evalkit sim serve` (the README's quickstarts, a new agent) gets an answer in
its protocol instead of an error.

- The last message is a tool's result: a closing text that quotes it.
- Tools are declared and the user has spoken: a call of the first declared tool, each required
  argument given a value of its type (a string takes the first word of the user's message that
  has a digit in it, such as an order id, else "example").
- Otherwise: a text saying how to make the model play one of the domain's tasks.

Every answer is marked simulated like the rest (model `sim-<profile>`, the fingerprint, the
`x-evalkit-simulated` header); the turn plays no task and makes no mistakes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from evalkit.sim.model import SimReply

NO_TASK = (
    "This is evalkit's simulated model. Name a task of its domain in the x-evalkit-task header "
    "(or metadata.evalkit_task) and it plays that task's episode."
)
_WORD_WITH_DIGIT = re.compile(r"#?[A-Za-z_-]*\d[\w-]*")
_PLAIN = {"integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}, "null": None}


def _text(content: Any) -> str:
    """A message's content as text (a string, or the text parts of a list)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _value(schema: Any, said: str) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if isinstance(schema, dict) and isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    if kind in _PLAIN:
        return _PLAIN[kind]
    found = _WORD_WITH_DIGIT.search(said)
    return found.group(0) if found else "example"


def _arguments(parameters: dict[str, Any], said: str) -> dict[str, Any]:
    properties = parameters.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = parameters.get("required")
    return {
        name: _value(properties.get(name), said)
        for name in (required if isinstance(required, list) else [])
        if isinstance(name, str)
    }


def generic_reply(
    messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
) -> SimReply:
    """The generic turn for a request's chat-form `messages` and `tools`."""
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return SimReply(f"Done. The tool answered: {_text(last.get('content'))[:200]}")
    functions = [
        t["function"]
        for t in tools or []
        if isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name")
    ]
    said = next(
        (_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), ""
    )
    if not functions or not said:
        return SimReply(NO_TASK)
    function = functions[0]
    parameters = function.get("parameters")
    arguments = _arguments(parameters if isinstance(parameters, dict) else {}, said)
    digest = hashlib.sha256(f"{len(messages)}|{said}".encode()).hexdigest()[:24]
    call = {
        "id": f"call_{digest}",
        "type": "function",
        "function": {"name": function["name"], "arguments": json.dumps(arguments)},
    }
    return SimReply(None, [call])
