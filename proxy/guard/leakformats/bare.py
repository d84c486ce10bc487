"""Formats with no marker of their own: the whole text is the call, as JSON or as a Python list.

They are tried only on a text that starts like one (`{`, `[` or a ``` fence) and holds no call of
a marked format, and never on reasoning, where a model drafts JSON freely.
"""

from __future__ import annotations

import re
from typing import Final

from proxy.guard.leakformats.reading import (
    LeakedCall,
    Parsed,
    blocks,
    decode_exact,
    name_in,
    python_calls,
)
from proxy.guard.leakformats.tagged import Finder, cut_off_marker, place

_FENCE_OPEN: Final = re.compile(r"\A```[A-Za-z0-9_-]*[ \t]*\n?")
_PARTIAL_CALL: Final = re.compile(r'\A\[?\s*\{\s*"name"\s*:\s*"')
_ARGUMENTS_KEY: Final = re.compile(r'"(?:arguments|parameters)"\s*:')
_CALL_KEYS: Final = frozenset({"name", "arguments", "parameters", "type", "id"})
BARE_STARTS: Final = ("{", "[", "`")


def find_json(text: str) -> list[LeakedCall]:
    """The whole text is a call object `{"name": …, "arguments"|"parameters": …}` or a list of
    them, possibly in a ```json fence (Llama 3 JSON, Phi-4, xLAM, many fine-tunes).

    A JSON answer that happens to have a "name" is not a call: every object must hold nothing
    but call keys.
    """
    stripped = text.strip()
    start = text.find(stripped[:1]) if stripped else 0
    body = stripped
    complete = True
    if body.startswith("`"):
        fence = _FENCE_OPEN.match(body)
        if fence is None:
            return []
        body = body[fence.end() :]
        close = body.find("```")
        if close == -1:
            complete = False  # the fence never closed: cut off
        elif body[close + 3 :].strip():
            return []  # prose after the fence: the JSON is an example, not the answer
        else:
            body = body[:close]
        body = body.strip()
    if not body.startswith(("{", "[")):
        return []
    value, ok = decode_exact(body)
    if not ok:
        if _PARTIAL_CALL.match(body) and _ARGUMENTS_KEY.search(body):
            return [LeakedCall(name_in(body), None, stripped, "json", False, start)]
        return []
    items = value if isinstance(value, list) else [value]
    if not items or not all(_is_call_object(item) for item in items):
        return []
    calls = []
    for item in items:
        assert isinstance(item, dict)
        arguments = item.get("arguments", item.get("parameters"))
        if isinstance(arguments, str):
            parsed, parsed_ok = decode_exact(arguments)
            arguments = parsed if parsed_ok else arguments
        calls.append(LeakedCall(item["name"], arguments, stripped, "json", complete, start))
    return calls


def _is_call_object(value: object) -> bool:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return False
    arguments = value.get("arguments", value.get("parameters"))
    return isinstance(arguments, dict | str) and value.keys() <= _CALL_KEYS


def find_pythonic(text: str) -> list[LeakedCall]:
    """The whole text is `[f(a=1), g(b="x")]` (Llama 3.2/4 pythonic, ToolACE, Granite 3.3)."""
    stripped = text.strip()
    calls = python_calls(stripped, bracketed=True)
    if not calls:
        return []
    start = text.find(stripped[:1])
    return [LeakedCall(c.name, c.arguments, stripped, "pythonic", c.complete, start) for c in calls]


def python_block(fmt: str, open_tag: str, close_tag: str, *, bracketed: bool) -> Finder:
    """The finder of `open_tag` Python calls `close_tag` (Llama 4's `<|python_start|>`, LFM2's
    `<|tool_call_start|>`, Olmo 3's `<function_calls>` with one call per line)."""

    def find(text: str) -> list[LeakedCall]:
        found: list[LeakedCall] = []
        for block in blocks(text, open_tag, close_tag):
            calls = python_calls(block.body, bracketed=bracketed)
            if calls is None:
                found += cut_off_marker(fmt, text, block)
                continue
            calls = [Parsed(c.name, c.arguments, c.complete and block.closed) for c in calls]
            found += place(fmt, text, block, calls)
        return found

    return find
