"""A response read into the guard's message and written back.

A response's `output` is a list of items; the guard's message is read from it: the text of its
`message` items is the content, each `function_call` item a call whose id is its `call_id`, the
text of its `reasoning` items the reasoning (scanned for leaked calls, never changed).
Built-in tool calls (`web_search_call`, `mcp_call`, …) and custom tool calls become calls of
their own type, which the guard never flags. A function inside a `namespace` tool is called with
the function's `name` and the namespace in the item's `namespace` field (the OpenAI SDK's
`ResponseFunctionToolCall.namespace`); the guard knows it as `namespace.name`, the name its repair
texts show the model. The message keeps the items it was read from (`ITEMS`), so what the client
gets is written back from them: items of calls that were stripped are dropped, a repaired answer
is the re-ask's own output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from proxy.errors import UpstreamStatusError
from proxy.protocols.base import Finish, Message
from proxy.protocols.responses.tools import call_name

ITEMS: Final = "_response_items"
"""The key of a guard message under which the output items it was read from are kept."""
RESPONSE_ID: Final = "_response_id"
"""The key of a guard message under which the id of the response it was read from is kept."""

_NOT_ACTIONS: Final = frozenset({"message", "reasoning", "function_call"})


def guard_message(
    output: list[dict[str, Any]],
    response_id: str | None,
    streamed: Mapping[object, str] | None = None,
) -> Message:
    """The guard's message for a response's output items (which it keeps under `ITEMS`).

    The text of its `reasoning` items is the message's `reasoning`, which the guard scans for
    leaked calls (the items themselves go back unchanged); `streamed`: a stream's reasoning text
    by item id, read for an item that carries none.
    """
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    for item in output:
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or ():
                if not isinstance(part, dict):
                    continue
                what = part.get("type")
                if what == "output_text":
                    texts.append(_text(part.get("text")))
                elif what == "refusal":
                    texts.append(_text(part.get("refusal")))
        elif kind == "function_call":
            calls.append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": call_name(item), "arguments": item.get("arguments")},
                }
            )
        elif kind == "reasoning":
            thought = reasoning_text(item) or (streamed or {}).get(item.get("id"), "")
            if thought:
                thoughts.append(thought)
        elif kind not in _NOT_ACTIONS and isinstance(kind, str):
            # A built-in or custom tool's call: an action of the model, never flagged.
            calls.append({"id": item.get("call_id") or item.get("id"), "type": kind})
    message: Message = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    if thoughts:
        message["reasoning"] = "\n".join(thoughts)
    message[ITEMS] = output
    if response_id is not None:
        message[RESPONSE_ID] = response_id
    return message


def _text(value: object) -> str:
    """A part's text as the guard reads it: a string as it is, nothing as "", else its str()."""
    return value if isinstance(value, str) else str(value or "")


def reasoning_text(item: Mapping[str, Any]) -> str:
    """A `reasoning` item's text: its `content` parts (`reasoning_text`) joined, else its
    `summary` parts (a summary restates the content: reading both would find one call twice).
    An item with only `encrypted_content` has none."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list):
            text = "".join(str(p.get("text") or "") for p in parts if isinstance(p, dict))
            if text:
                return text
    return ""


def output_items(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The output items of a settled guard message: those it was read from, without the function
    calls it no longer has, each kept call as the message has it now (a local fix may have
    renamed it or mended its arguments)."""
    calls = {
        call.get("id"): call
        for call in message.get("tool_calls") or []
        if isinstance(call, dict) and call.get("type") == "function"
    }
    out = []
    for item in message.get(ITEMS) or []:
        if item.get("type") != "function_call":
            out.append(item)
            continue
        call = calls.get(item.get("call_id"))
        if call is None:
            continue
        function = call.get("function") or {}
        name, arguments = function.get("name"), function.get("arguments")
        if name != call_name(item) and isinstance(name, str):
            namespace, _, short = name.rpartition(".")
            item = {**item, "name": short if namespace == item.get("namespace") else name}
        if arguments != item.get("arguments"):
            item = {**item, "arguments": arguments}
        out.append(item)
    return out


def finish_of(response: Mapping[str, Any], message: Mapping[str, Any]) -> str:
    """The guard's finish for a response: `length` when it stopped at `max_output_tokens`."""
    if response.get("status") == "incomplete":
        details = response.get("incomplete_details")
        if isinstance(details, dict) and details.get("reason") == "max_output_tokens":
            return Finish.LENGTH
    return Finish.TOOL_CALLS if message.get("tool_calls") else Finish.STOP


def set_status(body: dict[str, Any], finish: str | None) -> None:
    """Set a response's `status` and `incomplete_details` for the guard's finish."""
    if finish == Finish.LENGTH:
        body["status"] = "incomplete"
        body["incomplete_details"] = {"reason": "max_output_tokens"}
    else:
        body["status"] = "completed"
        body["incomplete_details"] = None


def failed(response: Mapping[str, Any], upstream: str) -> UpstreamStatusError:
    """The error of a response whose `status` is `failed`."""
    error = response.get("error")
    message = error.get("message") if isinstance(error, dict) else None
    who = f"upstream '{upstream}'" if upstream else "upstream"
    text = f"{who} failed the response: {message or 'no reason given'}"
    return UpstreamStatusError(
        text,
        status=502,
        body={"error": {"message": text, "type": "upstream_error", "param": None, "code": None}},
    )
