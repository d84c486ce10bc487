"""The SqliteStore's conversations by history (`SessionStore.track_conversation`): one row per
digest holding the conversations remembered under it, read and written in the store's
transaction by the rule of `proxy.session.history.follow`."""

from __future__ import annotations

import sqlite3

import orjson

from proxy.session.history import Entry, History, follow

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    digest     TEXT PRIMARY KEY,
    sessions   TEXT NOT NULL,
    touched_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS conversations_by_time ON conversations (touched_at);
"""
"""`sessions`: the conversations under `digest`, oldest first, as JSON `[[session, at], …]`;
`touched_at`: the newest `at`, after which the row lives `ttl` seconds."""


def track_conversation(
    db: sqlite3.Connection, history: History, new_session: str, *, now: float, ttl: float
) -> str:
    """`follow` over the rows of `history`'s digests, the rows it changed written back; the
    session. Runs inside the caller's `BEGIN IMMEDIATE` transaction, so processes sharing the
    file take their turns. Expired rows are left to `purge` (`follow` skips them)."""
    digests = [history.tip, *history.prefixes]
    marks = ", ".join("?" * len(digests))
    rows = db.execute(
        f"SELECT digest, sessions FROM conversations WHERE digest IN ({marks})", digests
    ).fetchall()
    lists: dict[str, list[Entry]] = {
        digest: [(str(session), float(at)) for session, at in orjson.loads(sessions)]
        for digest, sessions in rows
    }
    session, writes = follow(lists, history, new_session, now=now, ttl=ttl)
    db.executemany(
        "DELETE FROM conversations WHERE digest = ?",
        [(digest,) for digest, entries in writes.items() if not entries],
    )
    db.executemany(
        "INSERT INTO conversations VALUES (?, ?, ?) ON CONFLICT (digest)"
        " DO UPDATE SET sessions = excluded.sessions, touched_at = excluded.touched_at",
        [
            (digest, orjson.dumps(entries).decode(), max(at for _, at in entries))
            for digest, entries in writes.items()
            if entries
        ],
    )
    return session


def purge(db: sqlite3.Connection, cutoff: float) -> None:
    """Delete the rows whose newest conversation was put there at `cutoff` or before."""
    db.execute("DELETE FROM conversations WHERE touched_at <= ?", (cutoff,))
