"""The session of a request that names none: the conversation its history continues, looked up
in the session store in one atomic step (`SessionStore.track_conversation`, the rule of
`proxy.session.history.follow`), or the fingerprint of its opening (`session_tracking:
fingerprint`)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from typing import Any

from proxy.session.budget import SessionHints, SessionTracking, fingerprint_of, scoped
from proxy.session.history import CONVERSATION_PREFIX, History
from proxy.session.stores import SessionStore


async def unnamed_session(
    store: SessionStore,
    body: Mapping[str, Any],
    hints: SessionHints,
    *,
    owner: str | None,
    tracking: SessionTracking,
    now: float,
) -> str:
    """The stored session of a request that names none (`budget.named_session` gave None):
    under `history`, the conversation of `owner` its history continues, else a new one
    (`"conv-"` + 16 hex digits, unique to it); under `fingerprint`, or for a protocol without a
    history reader, the fingerprint of its opening. Scoped to `owner` as `budget.scoped`
    scopes: one key's conversation never joins another's.

    Raises:
        SessionStoreError: the store failed (as every store operation of a turn).
    """
    read = hints.history
    if tracking is SessionTracking.FINGERPRINT or read is None:
        return scoped(owner, fingerprint_of(*hints.fingerprint))
    history = read(body)
    if owner is not None:
        history = History(
            scoped(owner, history.tip), tuple(scoped(owner, p) for p in history.prefixes)
        )
    fresh = scoped(owner, f"{CONVERSATION_PREFIX}{_PROCESS}{next(_COUNTER) & 0xFFFFFFFF:08x}")
    return await store.track_conversation(history, fresh, now=now)


# A new conversation's id: 8 random hex digits drawn once a process (each worker imports this
# module anew, and a forked child draws its own), then a count from a random start: unique
# across replicas and restarts as 16 random digits were, at a fraction of os.urandom's cost.
def _draw() -> None:
    global _PROCESS, _COUNTER
    _PROCESS = os.urandom(4).hex()
    _COUNTER = itertools.count(int.from_bytes(os.urandom(4), "big"))


_PROCESS = ""
_COUNTER = itertools.count()
_draw()
os.register_at_fork(after_in_child=_draw)
