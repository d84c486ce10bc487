"""SqliteStore: session counts in one SQLite file, shared by the worker processes of one host.

WAL mode, one `BEGIN IMMEDIATE` transaction per operation; counts survive restarts and crashes.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from proxy.errors import ConfigError
from proxy.session.history import History
from proxy.session.sqlite_conversations import SCHEMA as CONVERSATIONS_SCHEMA
from proxy.session.sqlite_conversations import purge as purge_conversations
from proxy.session.sqlite_conversations import track_conversation as track_in_db
from proxy.session.stores import (
    DEFAULT_TTL_SECONDS,
    NO_CHANNELS,
    Applied,
    Order,
    SessionRecord,
    SessionUpdate,
    check_counts,
    check_ttl,
)

if TYPE_CHECKING:
    pass

_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session    TEXT PRIMARY KEY,
    errors     INTEGER NOT NULL,
    max_errors INTEGER NOT NULL,
    repairs    INTEGER NOT NULL,
    requests   INTEGER NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sessions_by_update ON sessions (updated_at);
CREATE INDEX IF NOT EXISTS sessions_by_errors ON sessions (errors, updated_at);
CREATE TABLE IF NOT EXISTS channels (
    session TEXT NOT NULL,
    channel TEXT NOT NULL,
    count   INTEGER NOT NULL,
    PRIMARY KEY (session, channel)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS claimed_calls (
    session    TEXT NOT NULL,
    call_id    TEXT NOT NULL,
    claimed_at REAL NOT NULL,
    PRIMARY KEY (session, call_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS claimed_calls_by_time ON claimed_calls (claimed_at);
CREATE TABLE IF NOT EXISTS counts (
    key   TEXT NOT NULL,
    field TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (key, field)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS responses (
    response_id TEXT PRIMARY KEY,
    session     TEXT NOT NULL,
    linked_at   REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS responses_by_time ON responses (linked_at);
"""

_ORDER_SQL: dict[str, str] = {
    "recent": "updated_at DESC, session DESC",
    "failing": "errors DESC, updated_at DESC, session DESC",
}


class SqliteStore:
    """Sessions in one SQLite file (WAL mode), shared by every process that opens it.

    Writes run in `BEGIN IMMEDIATE` transactions, so increments from several worker processes
    serialise on the database lock (waiting up to `busy_timeout_s`). The blocking calls run on
    one dedicated thread that owns the connection. Expired rows are purged during writes, at
    most once every `purge_interval_s`.

    Raises:
        ConfigError: the file or its directory cannot be created or opened as a database.
    """

    def __init__(
        self,
        path: str | PathLike[str],
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        clock: Callable[[], float] = time.time,
        *,
        busy_timeout_s: float = 30.0,
        purge_interval_s: float = 60.0,
    ) -> None:
        check_ttl(ttl_seconds)
        self.path = Path(path)
        self._ttl = ttl_seconds
        self._clock = clock
        self._purge_interval = purge_interval_s
        self._purged_at = float("-inf")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolsentry-sqlite")
        self._closed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = self._executor.submit(self._connect, busy_timeout_s).result()
        except (OSError, sqlite3.Error) as exc:
            self._executor.shutdown(wait=False)
            raise ConfigError(f"cannot open session database {str(self.path)!r}: {exc}") from exc

    async def get(self, session: str) -> SessionRecord | None:
        return await self._run(self._get, session, self._clock())

    async def record(
        self,
        session: str,
        *,
        max_errors: int,
        errors: int = 0,
        repairs: int = 0,
        channels: Mapping[str, int] = NO_CHANNELS,
        requests: int = 0,
        now: float,
    ) -> SessionRecord:
        check_counts(errors, repairs, requests, channels)
        counts = (errors, repairs, requests)
        return await self._run(self._record, session, max_errors, counts, dict(channels), now)

    async def claim_call_ids(
        self, session: str, call_ids: Sequence[str], *, now: float
    ) -> builtins.list[str]:
        return await self._run(self._claim, session, builtins.list(call_ids), now)

    async def apply(self, session: str, update: SessionUpdate, *, now: float) -> Applied:
        update.check()
        return await self._run(self._apply, session, update, now)

    async def delete(self, session: str) -> bool:
        return await self._run(self._delete, session, self._clock())

    async def add_counts(
        self, key: str, counts: Mapping[str, int], *, max_fields: int | None = None
    ) -> None:
        check_counts(0, 0, 0, counts)
        await self._run(self._add_counts, key, dict(counts), max_fields)

    async def read_counts(self, key: str) -> dict[str, int]:
        return await self._run(self._read_counts, key)

    async def link_response(self, response_id: str, session: str, *, now: float) -> None:
        await self._run(self._link, response_id, session, now)

    async def session_of_response(self, response_id: str) -> str | None:
        return await self._run(self._linked, response_id, self._clock())

    async def track_conversation(self, history: History, new_session: str, *, now: float) -> str:
        return await self._run(self._track, history, new_session, now)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._executor, self._db.close)
        self._executor.shutdown(wait=False)

    async def list(
        self, *, order: Order = "recent", limit: int = 50, prefix: str = ""
    ) -> builtins.list[SessionRecord]:
        if order not in _ORDER_SQL:
            raise ValueError(f"unknown order {order!r}; use 'recent' or 'failing'")
        return await self._run(self._list, _ORDER_SQL[order], limit, prefix, self._clock())

    # Everything below runs on the store's thread.

    def _connect(self, busy_timeout_s: float) -> sqlite3.Connection:
        # isolation_level=None: no implicit transactions; every write says BEGIN IMMEDIATE itself.
        db = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None)
        try:
            _enable_wal(db, deadline=time.monotonic() + busy_timeout_s)
            # In WAL mode NORMAL survives a crash of the process; only a power loss can lose
            # the last commits, which is acceptable for counters.
            db.execute("PRAGMA synchronous=NORMAL")
            with _transaction(db):
                _create_schema(db)
        except BaseException:
            db.close()
            raise
        return db

    def _get(self, session: str, now: float) -> SessionRecord | None:
        with _transaction(self._db, "BEGIN"):
            return self._read(session, now)

    def _record(
        self,
        session: str,
        max_errors: int,
        counts: tuple[int, int, int],
        channels: Mapping[str, int],
        now: float,
    ) -> SessionRecord:
        with _transaction(self._db):
            return self._add(session, max_errors, counts, channels, now)

    def _claim(self, session: str, call_ids: builtins.list[str], now: float) -> builtins.list[str]:
        with _transaction(self._db):
            return self._mark(session, call_ids, now)

    def _link(self, response_id: str, session: str, now: float) -> None:
        with _transaction(self._db):
            self._link_row(response_id, session, now)

    def _track(self, history: History, new_session: str, now: float) -> str:
        with _transaction(self._db):
            session = track_in_db(self._db, history, new_session, now=now, ttl=self._ttl)
            self._purge(now)
            return session

    def _apply(self, session: str, update: SessionUpdate, now: float) -> Applied:
        # One transaction for the phase: its claims, its counts and its links commit together.
        with _transaction(self._db):
            fresh = self._mark(session, builtins.list(update.claims), now) if update.claims else []
            errors, channels = update.counts(len(fresh))
            counts = (errors, update.repairs, update.requests)
            current = self._add(session, update.max_errors, counts, channels, now)
            for response_id in update.responses:
                self._link_row(response_id, session, now)
        return Applied(current, fresh)

    # Below: the statements of one operation, run inside the transaction of their caller.

    def _add(
        self,
        session: str,
        max_errors: int,
        counts: tuple[int, int, int],
        channels: Mapping[str, int],
        now: float,
    ) -> SessionRecord:
        db = self._db
        row = db.execute("SELECT updated_at FROM sessions WHERE session = ?", (session,)).fetchone()
        if row is not None and row[0] + self._ttl <= now:
            self._forget(session)
        errors, repairs, requests = counts
        db.execute(
            "INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (session) DO UPDATE SET"
            " errors = errors + excluded.errors,"
            " max_errors = excluded.max_errors,"
            " repairs = repairs + excluded.repairs,"
            " requests = requests + excluded.requests,"
            " updated_at = max(updated_at, excluded.updated_at)",
            (session, errors, max_errors, repairs, requests, now, now),
        )
        db.executemany(
            "INSERT INTO channels VALUES (?, ?, ?)"
            " ON CONFLICT (session, channel) DO UPDATE SET count = count + excluded.count",
            [(session, channel, count) for channel, count in channels.items() if count],
        )
        self._purge(now)
        current = self._read(session, now)
        assert current is not None  # written in this very transaction
        return current

    def _mark(self, session: str, call_ids: builtins.list[str], now: float) -> builtins.list[str]:
        db = self._db
        fresh: dict[str, None] = {}
        for call_id in call_ids:
            row = db.execute(
                "SELECT claimed_at FROM claimed_calls WHERE session = ? AND call_id = ?",
                (session, call_id),
            ).fetchone()
            if row is None or row[0] + self._ttl <= now:
                fresh.setdefault(call_id, None)
            db.execute(
                "INSERT INTO claimed_calls VALUES (?, ?, ?) ON CONFLICT (session, call_id)"
                " DO UPDATE SET claimed_at = max(claimed_at, excluded.claimed_at)",
                (session, call_id, now),
            )
        self._purge(now)
        return builtins.list(fresh)

    def _link_row(self, response_id: str, session: str, now: float) -> None:
        self._db.execute(
            "INSERT INTO responses VALUES (?, ?, ?) ON CONFLICT (response_id)"
            " DO UPDATE SET session = excluded.session, linked_at = excluded.linked_at",
            (response_id, session, now),
        )
        self._db.execute("DELETE FROM responses WHERE linked_at <= ?", (now - self._ttl,))

    def _linked(self, response_id: str, now: float) -> str | None:
        row = self._db.execute(
            "SELECT session FROM responses WHERE response_id = ? AND linked_at > ?",
            (response_id, now - self._ttl),
        ).fetchone()
        return None if row is None else str(row[0])

    def _delete(self, session: str, now: float) -> bool:
        db = self._db
        with _transaction(db):
            row = db.execute(
                "SELECT updated_at FROM sessions WHERE session = ?", (session,)
            ).fetchone()
            self._forget(session)
            db.execute("DELETE FROM claimed_calls WHERE session = ?", (session,))
        return row is not None and row[0] + self._ttl > now

    def _add_counts(self, key: str, counts: dict[str, int], max_fields: int | None) -> None:
        db = self._db
        with _transaction(db):
            db.executemany(
                "UPDATE counts SET count = count + ? WHERE key = ? AND field = ?",
                [(count, key, name) for name, count in counts.items()],
            )
            present = {
                row[0] for row in db.execute("SELECT field FROM counts WHERE key = ?", (key,))
            }
            room = None if max_fields is None else max(0, max_fields - len(present))
            new = [(key, n, c) for n, c in counts.items() if n not in present][:room]
            db.executemany("INSERT INTO counts VALUES (?, ?, ?)", new)

    def _read_counts(self, key: str) -> dict[str, int]:
        with _transaction(self._db, "BEGIN"):
            return dict(
                self._db.execute("SELECT field, count FROM counts WHERE key = ?", (key,)).fetchall()
            )

    def _list(
        self, order_sql: str, limit: int, prefix: str, now: float
    ) -> builtins.list[SessionRecord]:
        db = self._db
        with _transaction(db, "BEGIN"):
            # substr, not LIKE: a prefix's own % and _ are characters, not patterns.
            rows = db.execute(
                "SELECT session, errors, max_errors, repairs, requests, created_at, updated_at"
                " FROM sessions WHERE updated_at > ? AND substr(session, 1, ?) = ?"
                f" ORDER BY {order_sql} LIMIT ?",
                (now - self._ttl, len(prefix), prefix, max(limit, 0)),
            ).fetchall()
            return [self._from_row(row) for row in rows]

    def _read(self, session: str, now: float) -> SessionRecord | None:
        row = self._db.execute(
            "SELECT session, errors, max_errors, repairs, requests, created_at, updated_at"
            " FROM sessions WHERE session = ?",
            (session,),
        ).fetchone()
        if row is None or row[6] + self._ttl <= now:
            return None
        return self._from_row(row)

    def _from_row(self, row: tuple[Any, ...]) -> SessionRecord:
        session, errors, max_errors, repairs, requests, created_at, updated_at = row
        channels = dict(
            self._db.execute(
                "SELECT channel, count FROM channels WHERE session = ? ORDER BY channel",
                (session,),
            ).fetchall()
        )
        return SessionRecord(
            session, errors, max_errors, repairs, channels, requests, created_at, updated_at
        )

    def _forget(self, session: str) -> None:
        self._db.execute("DELETE FROM sessions WHERE session = ?", (session,))
        self._db.execute("DELETE FROM channels WHERE session = ?", (session,))

    def _purge(self, now: float) -> None:
        if now - self._purged_at < self._purge_interval:
            return
        self._purged_at = now
        cutoff = now - self._ttl
        self._db.execute("DELETE FROM sessions WHERE updated_at <= ?", (cutoff,))
        self._db.execute("DELETE FROM channels WHERE session NOT IN (SELECT session FROM sessions)")
        self._db.execute("DELETE FROM claimed_calls WHERE claimed_at <= ?", (cutoff,))
        purge_conversations(self._db, cutoff)

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))


def _enable_wal(db: sqlite3.Connection, *, deadline: float) -> None:
    # Switching a fresh file to WAL while another process does the same answers "database is
    # locked" at once, without waiting on the busy timeout; so wait here (worker processes
    # started together all open the file at the same moment).
    pause = 0.005
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def _create_schema(db: sqlite3.Connection) -> None:
    # executescript() would commit the open transaction; run the statements one by one instead.
    for statement in (_SCHEMA + CONVERSATIONS_SCHEMA).split(";"):
        if statement.strip():
            db.execute(statement)


@contextmanager
def _transaction(db: sqlite3.Connection, begin: str = "BEGIN IMMEDIATE") -> Iterator[None]:
    db.execute(begin)
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
