"""Parse chat-completions request bodies, reusing the tools an agent resends byte for byte.

An agent sends the same `tools` on every turn: 6.4 kB of the 7.2 kB benchmark body are the
retail tools' schemas. Parsing them into Python objects, freeing them again and keying the
compiled validators by their JSON was the largest part of the proxy's own CPU per request.
`ChatBodyParser` remembers the bytes of each tool list it has seen compile; when a body holds the
same bytes as the value of its top-level `"tools"` key, only the rest of the body is parsed, and
the remembered list and its compiled index are used.

Why it is exact: a JSON value is self-delimiting, so bytes that equal a remembered tool list at
the start of a value are that value, whole. Whether they are the value of the *top-level*
`"tools"` key (and not of a nested one, nor text inside a string) is checked by parsing the rest
of the body with a random marker string in their place: the body is used only when that parse
succeeds and the top-level `"tools"` is the marker. Anything else falls back to a full parse.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import orjson

from proxy.errors import BadRequestError
from proxy.guard.toolcheck import DEFAULT_LIMITS, GuardLimits, ToolIndex, compile_tools

# Tool lists shorter than this are cheap to parse, and the first bytes of a longer one sort
# them into buckets (most lists differ within their first tool's name).
PREFIX_BYTES: Final = 64
MAX_ENTRIES: Final = 64
MAX_TOOLS_BYTES: Final = 262_144
# The top-level `"tools"` is what is wanted; a body whose first few `"tools"` keys are all nested
# gets a full parse instead of one attempt per key (each attempt parses the body once).
MAX_CANDIDATES: Final = 8
_TOOLS_KEY: Final = b'"tools"'
_BLANKS: Final = frozenset(b" \t\r\n")
_COLON: Final = ord(":")
_BRACKET: Final = ord("[")


@dataclass(slots=True)
class ParsedBody:
    """A request body, parsed, and its tools' compiled index when they were recognised.

    `body["tools"]`, when `index` is set, is shared by every request that sent the same bytes:
    read it, do not change it.
    """

    body: dict[str, Any]
    index: ToolIndex | None = None


@dataclass(frozen=True, slots=True)
class _Entry:
    raw: bytes
    tools: list[Any]
    index: ToolIndex


class ChatBodyParser:
    """Parses request bodies (`parse`); remembers up to `max_entries` tool lists, least recently
    used forgotten first. One per route: its entries are compiled by `compile` (a protocol's
    `compile_tools`; chat's form under `limits` by default)."""

    def __init__(
        self,
        limits: GuardLimits = DEFAULT_LIMITS,
        *,
        compile: Callable[[list[Any]], ToolIndex] | None = None,
        max_entries: int = MAX_ENTRIES,
        max_tools_bytes: int = MAX_TOOLS_BYTES,
    ) -> None:
        self.limits = limits
        self._compile = compile or (lambda tools: compile_tools(tools, limits))
        self.max_entries = max_entries
        self.max_tools_bytes = max_tools_bytes
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._buckets: dict[bytes, list[_Entry]] = {}
        # A string no client can know, so a body whose own `"tools"` equals it cannot pass for
        # one whose tools were recognised.
        self._marker = f"\x00toolsentry-tools-{os.urandom(12).hex()}"
        self._marker_json = orjson.dumps(self._marker)

    def __len__(self) -> int:
        return len(self._entries)

    def parse(self, raw: bytes) -> ParsedBody:
        """Parse a request body.

        Returns the body and, when its tools were recognised, their index. Raises
        BadRequestError when `raw` is not JSON or not a JSON object.
        """
        if self._entries:
            found = self._parse_known(raw)
            if found is not None:
                return found
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadRequestError(f"request body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise BadRequestError("request body must be a JSON object")
        tools = body.get("tools")
        if isinstance(tools, list) and tools:
            self._learn(raw, tools)
        return ParsedBody(body)

    def _parse_known(self, raw: bytes) -> ParsedBody | None:
        for start in _value_starts(raw):
            entry = self._lookup(raw, start)
            if entry is None:
                continue
            rest = raw[:start] + self._marker_json + raw[start + len(entry.raw) :]
            try:
                body = orjson.loads(rest)
            except orjson.JSONDecodeError:
                continue
            if isinstance(body, dict) and body.get("tools") == self._marker:
                body["tools"] = entry.tools
                self._entries.move_to_end(entry.raw)
                return ParsedBody(body, entry.index)
        return None

    def _lookup(self, raw: bytes, start: int) -> _Entry | None:
        for entry in self._buckets.get(raw[start : start + PREFIX_BYTES], ()):
            if raw.startswith(entry.raw, start):
                return entry
        return None

    def _learn(self, raw: bytes, tools: list[Any]) -> None:
        """Remember the bytes of this body's tools, if they compile (a first sight of them)."""
        ascii_only = raw.isascii()
        for start in _value_starts(raw):
            span = _value_at(raw, start, ascii_only=ascii_only)
            if span is None or not PREFIX_BYTES < len(span) <= self.max_tools_bytes:
                continue
            if span in self._entries:
                return
            # The bytes must be this body's tools (not a nested "tools" key's value), and the
            # remembered list is a private parse of them, not the request's own objects.
            copy = orjson.loads(span)
            if copy != tools:
                continue
            try:
                index = self._compile(copy)
            except BadRequestError:
                return  # the request is refused where the tools are checked
            self._add(_Entry(span, copy, index))
            return

    def _add(self, entry: _Entry) -> None:
        self._entries[entry.raw] = entry
        self._buckets.setdefault(entry.raw[:PREFIX_BYTES], []).append(entry)
        while len(self._entries) > self.max_entries:
            _, old = self._entries.popitem(last=False)
            bucket = self._buckets[old.raw[:PREFIX_BYTES]]
            bucket.remove(old)
            if not bucket:
                del self._buckets[old.raw[:PREFIX_BYTES]]


def _value_starts(raw: bytes) -> Iterator[int]:
    """Where an array value follows a `"tools"` key token (`"tools"`, JSON blanks, `:`,
    blanks, `[`), the first `MAX_CANDIDATES` of them.

    Candidates only: one may be a nested key, or text inside a string.
    """
    found, end = 0, len(raw)
    at = raw.find(_TOOLS_KEY)
    while at >= 0 and found < MAX_CANDIDATES:
        i = at + len(_TOOLS_KEY)
        while i < end and raw[i] in _BLANKS:
            i += 1
        if i < end and raw[i] == _COLON:
            i += 1
            while i < end and raw[i] in _BLANKS:
                i += 1
            if i < end and raw[i] == _BRACKET:
                found += 1
                yield i
        at = raw.find(_TOOLS_KEY, at + 1)


def _value_at(raw: bytes, start: int, *, ascii_only: bool) -> bytes | None:
    """The bytes of the JSON value that starts at `start`, or None if none is there.

    `ascii_only`: whether `raw` is all ASCII (then characters and bytes count alike).
    """
    tail = memoryview(raw)[start:]
    try:
        orjson.loads(tail)
    except orjson.JSONDecodeError as exc:
        if exc.msg != "unexpected content after document":
            return None
        # orjson reports the position in characters; the span is wanted in bytes.
        end = exc.pos if ascii_only else len(bytes(tail).decode()[: exc.pos].encode())
        return bytes(tail[:end]).rstrip()
    return bytes(tail).rstrip()
