"""Find tool calls a model wrote as text that the server did not parse into `tool_calls`: in the
answer (`content`) or in the reasoning (`reasoning_content`, a Responses reasoning item, an
Anthropic `thinking` block).

The formats are the registry of `proxy.guard.leakformats`, one for each tool-call parser of the
pinned vLLM; `LeakedCall.format` names the one a call was written in. A text without any marker
costs at most one substring test per marker family, and an answer without `<` or `[` three in all
(`<`, `[`, `to=`, made in one pass of C calls). Prose that mentions a marker is not a call: a marker
must be followed by a call body, and a whole-text JSON or Python call list must hold nothing but
calls. A marker that ends the text is a call cut off (`complete=False`). One element is read
whatever it holds: a `<tool_call>` that opens a line and is closed by `</tool_call>`, around text
that no format reads as a call, is a call the model wrote and nobody can read (name "", no
arguments; vLLM's own parsers log it as a failed extraction and pass the text on as content).
"""

from __future__ import annotations

from typing import Final

from proxy.guard.leakformats import FAMILIES, FORMATS, LeakedCall, LeakFormat
from proxy.guard.leakformats.bare import BARE_STARTS
from proxy.guard.leakformats.reading import blocks
from proxy.guard.leakformats.tagged import HERMES_CLOSE, HERMES_OPEN

__all__ = ["LeakedCall", "find_leaked_calls", "find_leaked_calls_in_reasoning"]

_MARKED: Final = tuple(f for f in FORMATS if not f.bare)
_BARE: Final = tuple(f for f in FORMATS if f.bare)
_PRECEDENCE: Final = {
    name: rank for rank, name in enumerate(dict.fromkeys(f.name for f in FORMATS))
}
# For each family, the (format, marker) pairs whose marker holds it (and no earlier family).
_BY_FAMILY: Final = tuple(
    (
        family,
        tuple(
            (f, m)
            for f in _MARKED
            for m in f.markers
            if next(fam for fam in FAMILIES if fam in m) == family
        ),
    )
    for family in FAMILIES
)
# Almost every marker holds `<` or `[`, and most answers hold neither: a family whose markers
# all hold one of them is tested only when it is present.
_GATES: Final = ("<", "[")


def _gate(pairs: tuple[tuple[LeakFormat, str], ...]) -> str | None:
    return next((g for g in _GATES if all(g in marker for _, marker in pairs)), None)


_PLAN: Final = tuple(
    (gate, tuple((family, pairs) for family, pairs in _BY_FAMILY if _gate(pairs) == gate))
    for gate in (*_GATES, None)
)


# A text holding none of these holds no marker: every marker holds its gate, or its family where
# no gate covers it. Screened in C, once per text (most answers are prose).
_SCREEN: Final = (
    *(gate for gate, _ in _PLAN if gate is not None),
    *(family for gate, families in _PLAN if gate is None for family, _ in families),
)


def find_leaked_calls(content: str | None) -> list[LeakedCall]:
    """Every tool call written into an answer's text, in order of appearance.

    Returns an empty list for None, prose, or text without a recognisable call. A text that is
    nothing but a JSON call or a Python call list counts when no marked call is in it.
    """
    if not content:
        return []
    found = _marked(content) if any(map(content.__contains__, _SCREEN)) else []
    if not found and content.lstrip()[:1] in BARE_STARTS:
        for fmt in _BARE:
            found = fmt.find(content)
            if found:
                break
    return found


def find_leaked_calls_in_reasoning(reasoning: str | None) -> list[LeakedCall]:
    """Every tool call written in a marked format into reasoning text, in order of appearance.

    Whole-text JSON and Python lists are not looked for: reasoning drafts JSON freely, and the
    model's own call tokens are what mark a call it meant to make. Returns an empty list for
    None, or reasoning without a call.
    """
    if not reasoning or not any(map(reasoning.__contains__, _SCREEN)):
        return []
    return _marked(reasoning)


def _marked(text: str) -> list[LeakedCall]:
    """The marked calls in `text`, which holds one of `_SCREEN` (the callers screen it, so
    that prose costs no call)."""
    due: dict[LeakFormat, None] = {}
    for gate, families in _PLAN:
        if gate is not None and gate not in text:
            continue
        for family, pairs in families:
            if family in text:
                for fmt, marker in pairs:
                    if fmt not in due and marker in text:
                        due[fmt] = None
    if not due:
        return []
    found = [call for fmt in due for call in fmt.find(text)]
    found = _without_overlaps(found) if len(due) > 1 else sorted(found, key=_position)
    if HERMES_CLOSE in text:
        found = _with_unread_elements(text, found)
    return found


def _with_unread_elements(text: str, found: list[LeakedCall]) -> list[LeakedCall]:
    """`found` and, in order, every closed `<tool_call>` element that opens a line, holds more
    than blanks and overlaps none of them: the model's call syntax around a body no format reads
    (a tag pair inside a sentence is prose that names it)."""
    unread = [
        LeakedCall("", None, text[block.start : block.end], "hermes", True, block.start)
        for block in blocks(text, HERMES_OPEN, HERMES_CLOSE)
        if block.closed
        and block.body.strip()
        and not text[text.rfind("\n", 0, block.start) + 1 : block.start].strip()
        and not any(call.start < block.end and block.start < call.end for call in found)
    ]
    return sorted([*found, *unread], key=_position) if unread else found


def _without_overlaps(calls: list[LeakedCall]) -> list[LeakedCall]:
    """The calls in order of appearance; where formats claim the same text, the one earlier in
    the registry keeps it."""
    kept: list[LeakedCall] = []
    claimed: list[tuple[int, int, str]] = []
    for call in sorted(calls, key=lambda c: (_PRECEDENCE[c.format], c.start)):
        overlaps = any(
            fmt != call.format and call.start < end and start < call.end
            for start, end, fmt in claimed
        )
        if not overlaps:
            kept.append(call)
            claimed.append((call.start, call.end, call.format))
    return sorted(kept, key=_position)


def _position(call: LeakedCall) -> int:
    return call.start
