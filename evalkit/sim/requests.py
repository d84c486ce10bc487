"""Reading a Responses or Messages request as the chat conversation the simulated model reads.

The simulated model decides from a chat conversation (`messages`, `tools` in Chat Completions'
shape), so one decision serves every protocol: a Responses request's `instructions` and `input`
items, or a Messages request's `system` and content blocks, are read here into that shape —
a `function_call` item or `tool_use` block becomes an assistant tool call, a
`function_call_output` item or `tool_result` block a `role: tool` message — as vLLM itself
converts them before its chat template. Thinking and reasoning items are not part of the episode.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.errors import BadRequestError
from proxy.protocols.messages import tools as messages_tools
from proxy.protocols.responses import tools as responses_tools

Message = dict[str, Any]


class RequestShapeError(ValueError):
    """A request whose conversation cannot be read (its message says which field)."""


def chat_tools(tools: object) -> list[dict[str, Any]] | None:
    """A Responses or Messages `tools` list as chat function tools, read by the proxy's own
    translations (`proxy.protocols.responses.tools`, `proxy.protocols.messages.tools`);
    functions inside a Responses `namespace` tool count as declared under their own name (the
    simulated model calls them so); built-in tools (`web_search`, `mcp`, …) and tools it cannot
    read are left out."""
    if not isinstance(tools, list):
        return None
    out: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        try:
            if "input_schema" in tool and tool.get("type") in (None, "custom"):
                out += messages_tools.chat_tools([tool])
            else:
                out += responses_tools.chat_tools([tool], in_namespace=_own_name)
        except BadRequestError:
            continue  # a tool without a name: nothing the model calls by name
    return [tool for tool in out if tool.get("type") == "function"]


def _own_name(namespace: str, name: object) -> object:
    return name


def responses_conversation(body: Mapping[str, Any]) -> list[Message]:
    """The chat messages of a Responses request: `instructions`, then its `input`.

    Raises:
        RequestShapeError: when `input` is neither a string nor a list of items.
    """
    out: list[Message] = []
    if isinstance(body.get("instructions"), str):
        out.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    if isinstance(given, str):
        return [*out, {"role": "user", "content": given}]
    if not isinstance(given, list):
        raise RequestShapeError("'input' must be a string or an array of items")
    for item in given:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item.get("role") == "developer" else item.get("role")
            out.append({"role": role, "content": _text(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            _add_call(out, call)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output)
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
    return out


def messages_conversation(body: Mapping[str, Any]) -> list[Message]:
    """The chat messages of a Messages request: `system`, then its `messages`' blocks.

    Raises:
        RequestShapeError: when `messages` is not a list.
    """
    out: list[Message] = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text(system)})
    given = body.get("messages")
    if not isinstance(given, list):
        raise RequestShapeError("'messages' must be an array")
    for message in given:
        if not isinstance(message, dict):
            continue
        role, content = message.get("role"), message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            continue
        if role == "assistant":
            out.append(_assistant(blocks))
            continue
        text = []
        for block in blocks:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_result":
                answer = _text(block.get("content"))
                out.append(
                    {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": answer}
                )
            elif block.get("type") == "text":
                text.append(str(block.get("text", "")))
        if text:
            out.append({"role": "user", "content": "".join(text)})
    return out


def _assistant(blocks: Sequence[Any]) -> Message:
    text = "".join(
        str(b.get("text", "")) for b in blocks if isinstance(b, dict) and b.get("type") == "text"
    )
    calls = [
        {
            "id": b.get("id"),
            "type": "function",
            "function": {"name": b.get("name"), "arguments": _arguments(b.get("input"))},
        }
        for b in blocks
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
    message: Message = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _add_call(out: list[Message], call: dict[str, Any]) -> None:
    """Consecutive function_call items are one assistant message with several calls."""
    last = out[-1] if out else None
    if last is not None and last.get("role") == "assistant" and "tool_calls" in last:
        last["tool_calls"].append(call)
    elif last is not None and last.get("role") == "assistant" and not last.get("tool_calls"):
        last["tool_calls"] = [call]
    else:
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _arguments(value: object) -> str:
    """A tool_use `input` as the arguments text of a chat call (text that is not an object stays
    as it came, so a malformed call repeats as it was)."""
    return value if isinstance(value, str) else json.dumps(value)


def _text(content: object) -> str:
    """The text of a content value: a string, or the text of its parts or blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""
