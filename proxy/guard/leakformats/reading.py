"""What every leak format reads with: the call record, tag blocks, JSON call bodies, parameter
values and Python-style call lists.

Readers return None for text that is not a call body (prose that names a marker), so a format
reports nothing rather than a guess.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

_DECODER: Final = json.JSONDecoder()
_NAME: Final = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_JSON_STARTS: Final = frozenset('{["-0123456789tfn')
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][\w.\-]*")
# A call list starts `[name(` then `)` or a keyword argument: `[see manual(s)]` is prose.
_PY_CALL_START: Final = re.compile(
    r"\A\s*\[?\s*([A-Za-z_][\w.]*)\((?:\s*\)|\s*[A-Za-z_]\w*\s*(?:=|\Z)|\s*\Z)"
)
ARGUMENT_KEYS: Final = ("arguments", "parameters")


@dataclass(frozen=True, slots=True)
class LeakedCall:
    """A tool call found in text the server did not parse: its name ("" if unreadable), parsed
    arguments (None if unreadable), the text it was found in, its format, whether it ended
    (False: cut off) and where `raw` starts in the scanned text."""

    name: str
    arguments: object | None
    raw: str
    format: str
    complete: bool
    start: int = 0

    @property
    def end(self) -> int:
        """Where `raw` ends in the scanned text."""
        return self.start + len(self.raw)


@dataclass(frozen=True, slots=True)
class Block:
    """One tagged region: `start`/`end` in the text (tags included), the body between the tags,
    and whether the closing tag was seen."""

    start: int
    end: int
    body: str
    closed: bool


@dataclass(frozen=True, slots=True)
class Parsed:
    """A call read from a body, before it is placed in the text."""

    name: str
    arguments: object | None
    complete: bool


def blocks(text: str, open_tag: str, close_tag: str | None) -> Iterator[Block]:
    """Every region that starts with `open_tag`, up to `close_tag` (or, unclosed, up to the next
    `open_tag` or the end). With no `close_tag` the format has none: `closed` is False."""
    position = 0
    while (start := text.find(open_tag, position)) != -1:
        body_start = start + len(open_tag)
        end = text.find(close_tag, body_start) if close_tag else -1
        if end != -1:
            assert close_tag is not None
            yield Block(start, end + len(close_tag), text[body_start:end], True)
            position = end + len(close_tag)
            continue
        following = text.find(open_tag, body_start)
        body_end = following if following != -1 else len(text)
        yield Block(start, body_end, text[body_start:body_end], False)
        position = body_end


def json_calls(
    body: str,
    *,
    closed: bool | None,
    name_keys: tuple[str, ...] = ("name",),
    argument_keys: tuple[str, ...] = ARGUMENT_KEYS,
) -> list[Parsed] | None:
    """Calls from the JSON values at the start of `body`: objects or lists of objects, several
    joined by `;`, `,` or whitespace. None when `body` does not start with a call.

    `closed`: whether the format's end marker was seen (None: the format has none, so a call is
    complete when its JSON is).
    """
    rest = body.lstrip()
    if not rest.startswith(("{", "[")):
        return None
    calls: list[Parsed] = []
    while rest.startswith(("{", "[")):
        try:
            value, end = _DECODER.raw_decode(rest)
        except (ValueError, RecursionError):
            opening = rest.lstrip("[ \t\r\n")
            if not json_prefix(rest) or not (opening == "" or opening.startswith("{")):
                break  # not a call's JSON, or JSON followed by more: prose after the calls
            calls.append(Parsed(name_in(rest, name_keys), None, complete=False))
            break
        items = value if isinstance(value, list) else [value]
        for item in items:
            call = call_object(item, name_keys, argument_keys)
            if call is not None:
                calls.append(Parsed(call[0], call[1], complete=closed is not False))
        rest = rest[end:].lstrip().lstrip(";,").lstrip()
    return calls or None


def json_prefix(text: str) -> bool:
    """Whether `text` reads as the start of a JSON object or array cut off at its end: its
    brackets match as far as they go and the outermost one is still open."""
    in_string, escaped = False, False
    pairs = {"}": "{", "]": "["}
    stack: list[str] = []
    for char in text.rstrip():
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            stack.append(char)
        elif char in "}]" and (not stack or stack.pop() != pairs[char] or not stack):
            return False  # a bracket that does not match, or the outermost one closed
    return bool(stack)


def call_object(
    value: object,
    name_keys: tuple[str, ...] = ("name",),
    argument_keys: tuple[str, ...] = ARGUMENT_KEYS,
) -> tuple[str, object | None] | None:
    """(name, arguments) of a call object such as `{"name": …, "arguments": {…}}`, or None.

    A string of arguments is decoded when it holds JSON.
    """
    if not isinstance(value, dict):
        return None
    name = next((value[k] for k in name_keys if isinstance(value.get(k), str)), None)
    if name is None:
        return None
    arguments = next((value[k] for k in argument_keys if k in value), None)
    if isinstance(arguments, str):
        parsed, ok = decode_prefix(arguments)
        arguments = parsed if ok else arguments
    return name, arguments


def decode_prefix(text: str) -> tuple[object | None, bool]:
    """The JSON value at the start of `text` and True, or (None, False) when it does not parse."""
    try:
        value, _ = _DECODER.raw_decode(text.lstrip())
    except (ValueError, RecursionError):
        return None, False
    return value, True


def decode_exact(text: str) -> tuple[object | None, bool]:
    """The JSON value that is all of `text` (surrounding space aside), or (None, False)."""
    try:
        return json.loads(text), True
    except (ValueError, RecursionError):
        return None, False


def scalar(value: str) -> object:
    """A parameter's value: JSON when it reads as JSON (numbers, objects, …), else the text."""
    if not value or value[0] not in _JSON_STARTS:
        return value
    parsed, ok = decode_exact(value)
    return parsed if ok else value


def name_in(text: str, keys: tuple[str, ...] = ("name",)) -> str:
    """The first `"name": "…"` in (possibly cut-off) JSON text, or ""."""
    for key in keys:
        pattern = (
            _NAME if key == "name" else re.compile(rf'"{re.escape(key)}"\s*:\s*"((?:[^"\\]|\\.)*)"')
        )
        match = pattern.search(text)
        if match:
            return _unescape(match.group(1))
    return ""


def identifier(text: str) -> str | None:
    """`text` stripped when it is a function name (letters, digits, `_ . -`), else None."""
    text = text.strip()
    return text if _IDENTIFIER.fullmatch(text) else None


def python_calls(text: str, *, bracketed: bool) -> list[Parsed] | None:
    """Calls written as Python: `[f(a=1), g(b="x")]` (`bracketed`) or one `f(a=1)` per line.

    Arguments are keyword literals; a call whose text does not parse but starts like one is
    returned cut off (name only). None when `text` is not a call list.
    """
    source = text.strip()
    if not source:
        return None
    if bracketed and not source.startswith("["):
        return None
    start = _PY_CALL_START.match(source)
    if start is None:
        return None
    try:
        tree = ast.parse(source if bracketed else f"[{','.join(source.splitlines())}]", mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return [Parsed(start.group(1), None, complete=False)]
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls: list[Parsed] = []
    for node in tree.body.elts:
        call = _python_call(node)
        if call is None:
            return None
        calls.append(call)
    return calls


def _python_call(node: ast.expr) -> Parsed | None:
    if not isinstance(node, ast.Call) or node.args:
        return None
    name = _dotted(node.func)
    if name is None:
        return None
    arguments: dict[str, object] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            return None
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return None
    return Parsed(name, arguments, complete=True)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _unescape(text: str) -> str:
    value, ok = decode_exact(f'"{text}"')
    return value if ok and isinstance(value, str) else text
