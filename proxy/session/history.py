"""A conversation told by its history: the digests that let a request that names no session
join the conversation it continues (DESIGN §5), and the rule a store applies to them.

A request's history is its model, its system text and its messages, each protocol's read into
one vocabulary of items (`SYSTEM`, `USER`, `ASSISTANT`, `TOOL`): a protocol's `history` reader
(`proxy.protocols.*.request`) builds the items, `digest_history` hashes them in one pass. A client
that resends its conversation sends, on its next turn, the previous request's history followed by
the assistant's answer and what came after it (tool results, a user message); so a request
continues the conversation whose last request's history is one of this request's `prefixes`,
the histories that end right before one of its assistant turns. `follow` is the rule every
store applies to those digests in one atomic step.

Its limit: two conversations identical so far (the same task run twice, the same opening at
temperature 0) cannot be told apart until they differ; until then their requests share one
session, and from the first difference each goes on in a session of its own. A client that
rewrites or truncates its history starts a new session; memory is bounded (`MAX_PREFIXES`
prefixes a request, `MAX_PER_TIP` conversations a history, and each store's own caps and TTL).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple

import orjson

SYSTEM: Final = "system"
USER: Final = "user"
ASSISTANT: Final = "assistant"
TOOL: Final = "tool"

MAX_PREFIXES: Final = 8
"""Prefixes looked up per request: the histories before its last 8 assistant turns."""
MAX_PER_TIP: Final = 8
"""Conversations remembered per history (identical conversations under way at once)."""
CONVERSATION_PREFIX: Final = "conv-"
"""The session id of a conversation found by its history starts with this."""

Item = tuple[Any, ...]
"""One entry of a history: `(SYSTEM | USER, text)`, `(TOOL, call id, text)` or
`(ASSISTANT, text, calls)` where `calls` is a tuple of `(call id, name, arguments)`; any other
role as `(role, text)`."""

Entry = tuple[str, float]
"""A conversation remembered under a history: its session id and when it was put there."""


class History(NamedTuple):
    """The digests of a request's history: `tip`, of the whole of it; `prefixes`, of the history
    up to each of its last `MAX_PREFIXES` assistant turns, longest first."""

    tip: str
    prefixes: tuple[str, ...]


def assistant(text: str, calls: Sequence[tuple[str, str, str]] = ()) -> Item:
    """An assistant turn's item: its text and its tool calls (id, name, arguments)."""
    return (ASSISTANT, text, tuple(calls))


def arguments_text(arguments: object) -> str:
    """A call's arguments as one text: a string as sent, anything else as canonical JSON (a
    Messages `tool_use.input` object)."""
    if isinstance(arguments, str):
        return arguments
    return canonical_json(arguments)


def canonical_json(value: object) -> str:
    """`value` as JSON with sorted keys, whatever it holds (lone surrogates, odd numbers)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:  # orjson refuses lone surrogates, big integers, non-string keys
        return json.dumps(value, sort_keys=True, default=str)


def digest_history(model: object, items: Iterable[Item]) -> History:
    """The `History` of a request for `model` whose history is `items`, in one pass: a hash
    chained over the history a segment at a time, each segment the items from one assistant
    turn's start (an `ASSISTANT` item after one that is not) to the next, encoded as one JSON
    array, so no two histories hash alike by running into each other; the chain is copied at
    each of the last `MAX_PREFIXES` starts. A segment ends at every start, whether its digest
    is kept or not, so a history hashes alike as a tip and as the prefix of a longer one."""
    listed = items if isinstance(items, list) else list(items)
    starts = [
        i
        for i, item in enumerate(listed)
        if item[0] == ASSISTANT and (i == 0 or listed[i - 1][0] != ASSISTANT)
    ]
    kept = len(starts) - MAX_PREFIXES  # the starts before this one keep no digest
    chain = hashlib.sha256(_encoded([model if isinstance(model, str) else ""]))
    prefixes: list[str] = []
    begin = 0
    for n, end in enumerate(starts):
        if end > begin:
            chain.update(_encoded(listed[begin:end]))
        if n >= kept:
            prefixes.append(chain.copy().hexdigest()[:_DIGEST_HEX])
        begin = end
    if begin < len(listed):
        chain.update(_encoded(listed[begin:]))
    prefixes.reverse()
    return History(chain.hexdigest()[:_DIGEST_HEX], tuple(prefixes))


_DIGEST_HEX: Final = 32  # 128 bits: no two histories meet by chance


def _encoded(segment: Sequence[Any]) -> bytes:
    try:
        return orjson.dumps(segment)
    except TypeError:  # a lone surrogate in a text: Python's encoder escapes it
        return json.dumps(segment, default=str).encode()


def follow(
    lists: Mapping[str, Sequence[Entry]],
    history: History,
    new_session: str,
    *,
    now: float,
    ttl: float,
) -> tuple[str, dict[str, list[Entry]]]:
    """The session of a request whose history is `history`, given the conversations remembered
    under its digests (`lists`: digest -> entries, oldest first; a digest not there has none),
    and the lists to write back (digest -> entries; an empty list is one to delete).

    1. For each prefix, longest first: the oldest live conversation under it continues here; it
       leaves that list and is put last under `tip` (the first-in-first-out lists make two
       identical conversations under way at once two sessions).
    2. Else a live conversation under `tip` is an exact repeat (a client's retry): the oldest
       one, its entry refreshed.
    3. Else `new_session`, put last under `tip`.

    An entry is live while `at + ttl > now`; a list keeps its newest `MAX_PER_TIP` entries.
    """
    writes: dict[str, list[Entry]] = {}
    for prefix in history.prefixes:
        entries = _live(lists.get(prefix, ()), now, ttl)
        if entries:
            session = entries.pop(0)[0]
            writes[prefix] = entries
            break
    else:
        entries = _live(lists.get(history.tip, ()), now, ttl)
        if entries:
            entries[0] = (entries[0][0], now)
            writes[history.tip] = entries
            return entries[0][0], writes
        session = new_session
    tip = writes.get(history.tip)
    if tip is None:
        tip = _live(lists.get(history.tip, ()), now, ttl)
    tip.append((session, now))
    writes[history.tip] = tip[-MAX_PER_TIP:]
    return session, writes


def _live(entries: Iterable[Entry], now: float, ttl: float) -> list[Entry]:
    return [(session, at) for session, at in entries if at + ttl > now]
