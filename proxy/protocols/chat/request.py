"""A chat-completions request's history, read for the session of a request that names none
(`proxy.session.history`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from proxy.session.budget import content_text
from proxy.session.history import (
    SYSTEM,
    TOOL,
    USER,
    History,
    Item,
    arguments_text,
    assistant,
    canonical_json,
    digest_history,
)


def history(body: Mapping[str, Any]) -> History:
    """The digests of the body's model and `messages`: system and developer messages as system
    text, a content's parts as `content_text` reads them (`"hi"` and `[{"type": "text",
    "text": "hi"}]` alike), an assistant's text and tool calls (id, name, arguments), a tool
    message's `tool_call_id` and text. Fields clients add or drop (`refusal: null`, `name`,
    reasoning) are not read."""
    messages = body.get("messages")
    return digest_history(body.get("model"), _items(messages if isinstance(messages, list) else []))


def _items(messages: list[Any]) -> Iterator[Item]:
    for message in messages:
        if not isinstance(message, dict):
            yield ("", canonical_json(message))
            continue
        role = message.get("role")
        text = content_text(message.get("content"))
        if role in ("system", "developer"):
            yield (SYSTEM, text)
        elif role == "user":
            yield (USER, text)
        elif role == "assistant":
            yield assistant(text, _calls(message))
        elif role == "tool":
            yield (TOOL, str(message.get("tool_call_id") or ""), text)
        elif role == "function":  # the legacy form of a tool's result
            yield (TOOL, str(message.get("name") or ""), text)
        else:
            yield (str(role), text)


def _calls(message: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    calls = message.get("tool_calls")
    legacy = message.get("function_call")
    found = []
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            found.append(
                (
                    str(call.get("id") or ""),
                    str(function.get("name") or ""),
                    arguments_text(function.get("arguments")),
                )
            )
        else:
            found.append(("", "", canonical_json(call)))
    if isinstance(legacy, dict):
        found.append(("", str(legacy.get("name") or ""), arguments_text(legacy.get("arguments"))))
    return found
