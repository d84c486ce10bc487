"""Parse the JSON body of every turn route, reusing the tools an agent resends byte for byte.

An agent sends the same `tools` on every turn: 6.4 kB of the 7.2 kB benchmark body are the
retail tools' schemas. Parsing them into Python objects, freeing them again and keying the
compiled validators by their JSON was the largest part of the proxy's own CPU per request.
`BodyParser` remembers the bytes of each tool list it has seen compile; when a body holds the
same bytes as the value of its top-level `"tools"` key, only the rest of the body is parsed, and
the remembered list and its compiled index are used.

Why it is exact: a JSON value is self-delimiting, so bytes that equal a remembered tool list at
the start of a value are that value, whole. Whether they are the value of the *top-level*
`"tools"` key (and not of a nested one, nor text inside a string) is checked by parsing the rest
of the body with a random marker string in their place: the body is used only when that parse
succeeds and the top-level `"tools"` is the marker. Anything else falls back to a full parse.

Other top-level arrays a client resends byte for byte (`resent`: Claude Code's 7 kB `system`
blocks on the Messages route) are remembered the same way, without a compiled index, and put
back in place of a marker of their own, in the same parse of the rest of the body.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
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

    `body["tools"]`, when `index` is set, and a remembered `resent` value are shared by every
    request that sent the same bytes: read them, do not change them.
    """

    body: dict[str, Any]
    index: ToolIndex | None = None


@dataclass(frozen=True, slots=True)
class _Entry:
    raw: bytes
    value: list[Any]
    index: ToolIndex | None


class _Memory:
    """Values remembered by their exact bytes, looked up by their first bytes, at most
    `max_entries` of them, the least recently used forgotten first."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._buckets: dict[bytes, list[_Entry]] = {}

    def at(self, raw: bytes, start: int) -> _Entry | None:
        """The remembered value whose bytes `raw` holds at `start`, if any."""
        for entry in self._buckets.get(raw[start : start + PREFIX_BYTES], ()):
            if raw.startswith(entry.raw, start):
                return entry
        return None

    def used(self, entry: _Entry) -> None:
        self.entries.move_to_end(entry.raw)

    def add(self, entry: _Entry) -> None:
        self.entries[entry.raw] = entry
        self._buckets.setdefault(entry.raw[:PREFIX_BYTES], []).append(entry)
        while len(self.entries) > self.max_entries:
            _, old = self.entries.popitem(last=False)
            bucket = self._buckets[old.raw[:PREFIX_BYTES]]
            bucket.remove(old)
            if not bucket:
                del self._buckets[old.raw[:PREFIX_BYTES]]


@dataclass(frozen=True, slots=True)
class _Resent:
    """A resent top-level key: its key token, the marker put in place of its value, what it
    remembered."""

    name: str
    token: bytes
    marker: str
    marker_json: bytes
    memory: _Memory


# A remembered resent value found in a body: where its bytes start and end, whose, which.
_Splice = tuple[int, int, _Resent, _Entry]


class BodyParser:
    """Parses request bodies (`parse`); remembers up to `max_entries` tool lists, least recently
    used forgotten first. One per route: its entries are compiled by `compile` (a protocol's
    `compile_tools`; chat's form under `limits` by default). `resent`: other top-level keys
    whose array values are remembered likewise, up to `max_entries` of each."""

    def __init__(
        self,
        limits: GuardLimits = DEFAULT_LIMITS,
        *,
        compile: Callable[[list[Any]], ToolIndex] | None = None,
        max_entries: int = MAX_ENTRIES,
        max_tools_bytes: int = MAX_TOOLS_BYTES,
        resent: Sequence[str] = (),
    ) -> None:
        self.limits = limits
        self._compile = compile or (lambda tools: compile_tools(tools, limits))
        self.max_entries = max_entries
        self.max_tools_bytes = max_tools_bytes
        self._tools = _Memory(max_entries)
        # Strings no client can know, so a body whose own `"tools"` (or resent key) equals one
        # cannot pass for one whose value was recognised.
        self._marker = f"\x00toolsentry-tools-{os.urandom(12).hex()}"
        self._marker_json = orjson.dumps(self._marker)
        self._resent = []
        for name in resent:
            marker = f"\x00toolsentry-{name}-{os.urandom(12).hex()}"
            token = orjson.dumps(name)
            memory = _Memory(max_entries)
            self._resent.append(_Resent(name, token, marker, orjson.dumps(marker), memory))

    def __len__(self) -> int:
        return len(self._tools.entries)

    def parse(self, raw: bytes) -> ParsedBody:
        """Parse a request body.

        Returns the body and, when its tools were recognised, their index. Raises
        BadRequestError when `raw` is not JSON or not a JSON object.
        """
        kept: list[_Splice] = []
        for resent in self._resent:
            if resent.memory.entries and (splice := _find(raw, resent)) is not None:
                kept.append(splice)
        found = self._parse_known(raw, kept) if self._tools.entries or kept else None
        if found is not None and found.index is not None and len(kept) == len(self._resent):
            return found  # all it remembers was used: nothing to learn
        if found is None:
            kept = []
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise BadRequestError(f"request body is not valid JSON: {exc}") from exc
            if not isinstance(body, dict):
                raise BadRequestError("request body must be a JSON object")
            found = ParsedBody(body)
        body = found.body
        if found.index is None:
            tools = body.get("tools")
            if isinstance(tools, list) and tools:
                self._learn(raw, _TOOLS_KEY, self._tools, tools, self._compile)
        for resent in self._resent:
            value = body.get(resent.name)
            if isinstance(value, list) and value and not any(k[2] is resent for k in kept):
                self._learn(raw, resent.token, resent.memory, value, None)
        return found

    def _parse_known(self, raw: bytes, kept: list[_Splice]) -> ParsedBody | None:
        """The body parsed around the remembered values it holds (`kept`: its resent ones),
        None when that cannot be done: then it is parsed whole."""
        beside = [(start, end, resent.marker_json) for start, end, resent, _ in kept]
        if self._tools.entries:
            for start in _value_starts(raw, _TOOLS_KEY):
                entry = self._tools.at(raw, start)
                if entry is None:
                    continue
                end = start + len(entry.raw)
                if beside:
                    body = _parse_around(raw, [(start, end, self._marker_json), *beside])
                else:  # the tools alone, the usual case on most routes: one splice
                    try:
                        body = orjson.loads(raw[:start] + self._marker_json + raw[end:])
                    except orjson.JSONDecodeError:
                        continue
                if not isinstance(body, dict) or body.get("tools") != self._marker:
                    continue
                body["tools"] = entry.value
                self._tools.entries.move_to_end(entry.raw)
                return ParsedBody(body, entry.index) if not kept or _put_back(body, kept) else None
        if kept:
            body = _parse_around(raw, beside)
            if body is not None and _put_back(body, kept):
                return ParsedBody(body)
        return None

    def _learn(
        self,
        raw: bytes,
        token: bytes,
        memory: _Memory,
        value: list[Any],
        compile: Callable[[list[Any]], ToolIndex] | None,
    ) -> None:
        """Remember the bytes of this body's `value` under its top-level key `token` (a first
        sight of them), if `compile`, when given, compiles them."""
        ascii_only = raw.isascii()
        for start in _value_starts(raw, token):
            span = _value_at(raw, start, ascii_only=ascii_only)
            if span is None or not PREFIX_BYTES < len(span) <= self.max_tools_bytes:
                continue
            if span in memory.entries:
                return
            # The bytes must be this body's value (not a nested key's), and the remembered
            # value is a private parse of them, not the request's own objects.
            copy = orjson.loads(span)
            if copy != value:
                continue
            index = None
            if compile is not None:
                try:
                    index = compile(copy)
                except BadRequestError:
                    return  # the request is refused where the tools are checked
            memory.add(_Entry(span, copy, index))
            return


def _find(raw: bytes, resent: _Resent) -> _Splice | None:
    """The remembered value of `resent`'s key where that key first occurs as a key, or None.

    The first occurrence only: a body whose value there is not a remembered one (a `system`
    given as a string, a new array) would otherwise be searched to its end on every request
    (a 7 kB body 4 µs, a 75 kB one 60 µs), and a nested key before the top-level one costs no
    more than the splice, as `_put_back` then refuses it and the body is parsed whole.
    """
    start = _first_value(raw, resent.token)
    if start is None or raw[start] != _BRACKET:
        return None
    entry = resent.memory.at(raw, start)
    return None if entry is None else (start, start + len(entry.raw), resent, entry)


def _parse_around(raw: bytes, markers: list[tuple[int, int, bytes]]) -> dict[str, Any] | None:
    """`raw` parsed with the bytes from each start to its end replaced by the marker beside
    them; None when that is not JSON or not an object."""
    pieces: list[bytes] = []
    at = 0
    for start, end, marker_json in sorted(markers):
        pieces += (raw[at:start], marker_json)
        at = end
    pieces.append(raw[at:])
    try:
        body = orjson.loads(b"".join(pieces))
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def _put_back(body: dict[str, Any], splices: list[_Splice]) -> bool:
    """Put the remembered resent values in place of their markers; False when a marker is not
    the value of its top-level key (its bytes were a nested key's value)."""
    if any(body.get(resent.name) != resent.marker for _, _, resent, _ in splices):
        return False
    for _, _, resent, entry in splices:
        body[resent.name] = entry.value
        resent.memory.used(entry)
    return True


def _value_starts(raw: bytes, token: bytes) -> Iterator[int]:
    """Where an array value follows a key token such as `"tools"` (the token, JSON blanks, `:`,
    blanks, `[`), the first `MAX_CANDIDATES` of them.

    Candidates only: one may be a nested key, or text inside a string.
    """
    found = 0
    at = raw.find(token)
    while at >= 0 and found < MAX_CANDIDATES:
        i = _after_key(raw, at + len(token))
        if i is not None and raw[i] == _BRACKET:
            found += 1
            yield i
        at = raw.find(token, at + 1)


def _first_value(raw: bytes, token: bytes) -> int | None:
    """Where the value of the first occurrence of `token` as a key starts (a candidate, as in
    `_value_starts`), None when the token is never followed by `:`."""
    at = raw.find(token)
    while at >= 0:
        i = _after_key(raw, at + len(token))
        if i is not None:
            return i
        at = raw.find(token, at + 1)
    return None


def _after_key(raw: bytes, i: int) -> int | None:
    """The start of the value when JSON blanks, `:` and blanks follow position `i`, else None."""
    end = len(raw)
    while i < end and raw[i] in _BLANKS:
        i += 1
    if i >= end or raw[i] != _COLON:
        return None
    i += 1
    while i < end and raw[i] in _BLANKS:
        i += 1
    return i if i < end else None


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
