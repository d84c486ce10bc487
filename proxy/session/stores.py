"""Where session counters live: the `SessionStore` protocol and its implementations (DESIGN §5).

    MemoryStore   one process; the default
    SqliteStore   survives restarts; several worker processes on one host share one file
    RedisStore    several proxy replicas on any number of hosts share one Redis database

Every operation is one atomic step (one transaction in SQLite, one Lua script in Redis). A session expires `ttl_seconds` after its last update; expiry is judged against the
`now` a write is given, and against the store's `clock` for reads.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import heapq
import math
import sqlite3
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from os import PathLike
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from proxy.errors import ConfigError, SessionStoreError

if TYPE_CHECKING:
    from redis.asyncio import Redis

DEFAULT_TTL_SECONDS = 86_400
DEFAULT_MAX_SESSIONS = 100_000
NO_CHANNELS: Mapping[str, int] = MappingProxyType({})

Order = Literal["recent", "failing"]
_T = TypeVar("_T")


@dataclass(slots=True)
class SessionRecord:
    """A session's counters. `errors` counts failures the agent experienced (the budget);
    `channels` counts every failure per channel, repaired ones included. Times are epoch seconds.
    """

    session: str
    errors: int
    max_errors: int
    repairs: int
    channels: dict[str, int]
    requests: int
    created_at: float
    updated_at: float

    @property
    def exhausted(self) -> bool:
        """Whether the session has used its error budget (`errors >= max_errors`)."""
        return self.errors >= self.max_errors

    def to_dict(self) -> dict[str, Any]:
        """The `GET /v1/sessions/{id}` body; timestamps as ISO-8601 UTC strings."""
        return {
            "session": self.session,
            "errors": self.errors,
            "max_errors": self.max_errors,
            "exhausted": self.exhausted,
            "repairs": self.repairs,
            "channels": dict(self.channels),
            "requests": self.requests,
            "created_at": _iso(self.created_at),
            "updated_at": _iso(self.updated_at),
        }


@runtime_checkable
class SessionStore(Protocol):
    """Per-session counters with atomic increments and a TTL."""

    async def get(self, session: str) -> SessionRecord | None:
        """The live record of `session`, or None if it is unknown or expired."""
        ...

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
        """Add the given counts to `session` in one atomic step and return the updated record.

        Creates the session (or starts an expired one afresh) with `created_at = now`;
        `max_errors` replaces the stored budget, `updated_at` becomes `now`.

        Raises:
            ValueError: a count is negative.
        """
        ...

    async def claim_call_ids(
        self, session: str, call_ids: Sequence[str], *, now: float
    ) -> builtins.list[str]:
        """Mark `call_ids` as counted for `session`; return those that were not marked before.

        The check and the marking are one atomic step, so of concurrent claims of one id exactly
        one gets it back. Re-claiming refreshes a mark; a mark expires `ttl_seconds` after it was
        last claimed, independently of the session record. Order follows `call_ids`, without
        duplicates.
        """
        ...

    async def delete(self, session: str) -> bool:
        """Forget `session` and its marked call ids; return whether a live record existed."""
        ...

    async def close(self) -> None:
        """Release connections and threads; the store is unusable afterwards."""
        ...

    async def list(
        self, *, order: Order = "recent", limit: int = 50
    ) -> builtins.list[SessionRecord]:
        """Up to `limit` live sessions, most recently updated first (`recent`) or with the most
        errors first (`failing`, ties broken by recency).
        """
        ...


def open_store(
    url: str, *, ttl_seconds: float = DEFAULT_TTL_SECONDS, clock: Callable[[], float] = time.time
) -> SessionStore:
    """The store a `session_store` setting names.

    `memory`, `sqlite:///abs/path.db` (absolute), `sqlite:///./rel.db` (relative to the working
    directory), `redis://[:password@]host:port/db` or `rediss://…` (TLS).

    Raises:
        ConfigError: an unknown or unsupported form, or a database that cannot be opened.
    """
    forms = (
        "'memory', 'sqlite:///abs/path.db', 'sqlite:///./relative/path.db' "
        "or 'redis://host:port/db'"
    )
    if url in ("memory", "memory://"):
        return MemoryStore(ttl_seconds, clock)
    if url.startswith("sqlite:///"):
        rest = url.removeprefix("sqlite:///")
        if not rest or rest.endswith("/"):
            raise ConfigError(f"session store {url!r} names no database file; use {forms}")
        path = rest if rest.startswith(".") else "/" + rest
        return SqliteStore(path, ttl_seconds, clock)
    if url.startswith(("redis://", "rediss://")):
        return RedisStore(url, ttl_seconds, clock)
    raise ConfigError(f"unknown session store {_without_password(url)!r}; use {forms}")


class MemoryStore:
    """Sessions in a dict of this process. Each operation runs without awaiting, so it is atomic
    on the event loop. Bounded: expired sessions are evicted on writes, and beyond `max_sessions`
    the least recently updated go first.
    """

    def __init__(
        self,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        clock: Callable[[], float] = time.time,
        *,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
    ) -> None:
        _check_ttl(ttl_seconds)
        self._ttl = ttl_seconds
        self._clock = clock
        self._max_sessions = max_sessions
        # Both ordered least recently touched first, so eviction pops from the front.
        self._records: OrderedDict[str, SessionRecord] = OrderedDict()
        self._claims: OrderedDict[str, _Claims] = OrderedDict()

    async def get(self, session: str) -> SessionRecord | None:
        current = self._records.get(session)
        if current is None or self._expired(current.updated_at, self._clock()):
            return None
        return _copy(current)

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
        _check_counts(errors, repairs, requests, channels)
        self._evict(now)
        current = self._records.get(session)
        if current is None or self._expired(current.updated_at, now):
            current = SessionRecord(session, 0, max_errors, 0, {}, 0, now, now)
            self._records[session] = current
        current.errors += errors
        current.repairs += repairs
        current.requests += requests
        for channel, count in channels.items():
            if count:
                current.channels[channel] = current.channels.get(channel, 0) + count
        current.max_errors = max_errors
        current.updated_at = max(current.updated_at, now)
        self._records.move_to_end(session)
        while len(self._records) > self._max_sessions:
            self._records.popitem(last=False)
        return _copy(current)

    async def claim_call_ids(
        self, session: str, call_ids: Sequence[str], *, now: float
    ) -> builtins.list[str]:
        self._evict(now)
        claims = self._claims.get(session)
        if claims is None:
            claims = self._claims[session] = _Claims()
        self._claims.move_to_end(session)
        fresh: dict[str, None] = {}
        for call_id in call_ids:
            claimed_at = claims.ids.get(call_id)
            if claimed_at is None or self._expired(claimed_at, now):
                fresh.setdefault(call_id, None)
            claims.ids[call_id] = now
        claims.touched = max(claims.touched, now)
        # Marks whose ids stopped arriving: clients drop old turns from the history.
        claims.ids = {k: t for k, t in claims.ids.items() if not self._expired(t, now)}
        while len(self._claims) > self._max_sessions:
            self._claims.popitem(last=False)
        return list(fresh)

    async def delete(self, session: str) -> bool:
        self._claims.pop(session, None)
        current = self._records.pop(session, None)
        return current is not None and not self._expired(current.updated_at, self._clock())

    async def close(self) -> None:
        self._records.clear()
        self._claims.clear()

    async def list(
        self, *, order: Order = "recent", limit: int = 50
    ) -> builtins.list[SessionRecord]:
        now = self._clock()
        live = (r for r in self._records.values() if not self._expired(r.updated_at, now))
        return [_copy(r) for r in heapq.nlargest(limit, live, key=_sort_key(order))]

    def _expired(self, touched_at: float, now: float) -> bool:
        return touched_at + self._ttl <= now

    def _evict(self, now: float) -> None:
        while self._records:
            oldest = next(iter(self._records.values()))
            if not self._expired(oldest.updated_at, now):
                break
            self._records.popitem(last=False)
        while self._claims:
            oldest_claims = next(iter(self._claims.values()))
            if not self._expired(oldest_claims.touched, now):
                break
            self._claims.popitem(last=False)


@dataclass(slots=True)
class _Claims:
    ids: dict[str, float] = field(default_factory=dict)
    touched: float = float("-inf")


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
        _check_ttl(ttl_seconds)
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
        _check_counts(errors, repairs, requests, channels)
        counts = (errors, repairs, requests)
        return await self._run(self._record, session, max_errors, counts, dict(channels), now)

    async def claim_call_ids(
        self, session: str, call_ids: Sequence[str], *, now: float
    ) -> builtins.list[str]:
        return await self._run(self._claim, session, builtins.list(call_ids), now)

    async def delete(self, session: str) -> bool:
        return await self._run(self._delete, session, self._clock())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._executor, self._db.close)
        self._executor.shutdown(wait=False)

    async def list(
        self, *, order: Order = "recent", limit: int = 50
    ) -> builtins.list[SessionRecord]:
        if order not in _ORDER_SQL:
            raise ValueError(f"unknown order {order!r}; use 'recent' or 'failing'")
        return await self._run(self._list, _ORDER_SQL[order], limit, self._clock())

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
        channels: dict[str, int],
        now: float,
    ) -> SessionRecord:
        db = self._db
        with _transaction(db):
            row = db.execute(
                "SELECT updated_at FROM sessions WHERE session = ?", (session,)
            ).fetchone()
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

    def _claim(self, session: str, call_ids: builtins.list[str], now: float) -> builtins.list[str]:
        db = self._db
        fresh: dict[str, None] = {}
        with _transaction(db):
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

    def _delete(self, session: str, now: float) -> bool:
        db = self._db
        with _transaction(db):
            row = db.execute(
                "SELECT updated_at FROM sessions WHERE session = ?", (session,)
            ).fetchone()
            self._forget(session)
            db.execute("DELETE FROM claimed_calls WHERE session = ?", (session,))
        return row is not None and row[0] + self._ttl > now

    def _list(self, order_sql: str, limit: int, now: float) -> builtins.list[SessionRecord]:
        db = self._db
        with _transaction(db, "BEGIN"):
            rows = db.execute(
                "SELECT session, errors, max_errors, repairs, requests, created_at, updated_at"
                f" FROM sessions WHERE updated_at > ? ORDER BY {order_sql} LIMIT ?",
                (now - self._ttl, max(limit, 0)),
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
    for statement in _SCHEMA.split(";"):
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


# -- Redis ---------------------------------------------------------------------------------------
#
# Keys, under a prefix (default "toolsentry:"):
#   {prefix}session:{id}       hash: errors, max_errors, repairs, requests, created_at,
#                              updated_at, and one "c:{channel}" field per channel
#   {prefix}claims:{id}        sorted set: call id -> when it was last claimed
#   {prefix}sessions:recent    sorted set: session id -> updated_at
#   {prefix}sessions:failing   sorted set: "{rank}|{id}" -> errors, where rank is updated_at as a
#                              fixed-width decimal, so equal error counts order by recency, then id
#
# Listing reads these two sorted sets (one ZREVRANGE page per call) rather than SCANning every
# session key: SCAN would read and sort the whole keyspace on each `GET /v1/sessions`. The cost is
# one ZADD per index on each write, inside the script that writes anyway. Every script computes
# the rank itself (string.format in Lua), so the member it removes is always the one it added.

_LUA_RANK = """
local function rank(t) return string.format('%020.6f', t) end
"""

# KEYS: session hash, recent index, failing index.
# ARGV: session, now, cutoff (now - ttl), ttl, ttl_ms, max_errors, errors, repairs, requests,
#       session key prefix, purge batch, then channel/count pairs.
_RECORD_LUA = (
    _LUA_RANK
    + """
local hash, recent, failing = KEYS[1], KEYS[2], KEYS[3]
local session, now_s = ARGV[1], ARGV[2]
local now, ttl = tonumber(ARGV[2]), tonumber(ARGV[4])

local function forget(key, name, updated)
  if updated then redis.call('ZREM', failing, rank(tonumber(updated)) .. '|' .. name) end
  redis.call('ZREM', recent, name)
  redis.call('DEL', key)
end

-- Sessions last updated a TTL ago leave the indexes, a bounded batch per write. Their hash may
-- already be gone (Redis expired it), so the rank is rebuilt from the recent index's score.
local stale = redis.call('ZRANGEBYSCORE', recent, '-inf', ARGV[3], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[11]))
for i = 1, #stale, 2 do
  local name = stale[i]
  local key = ARGV[10] .. name
  local updated = redis.call('HGET', key, 'updated_at')
  if not updated or tonumber(updated) + ttl <= now then
    redis.call('ZREM', failing, rank(tonumber(stale[i + 1])) .. '|' .. name)
    forget(key, name, updated)
  end
end

local updated = redis.call('HGET', hash, 'updated_at')
if updated and tonumber(updated) + ttl <= now then
  forget(hash, session, updated)
  updated = false
end
if not updated then
  redis.call('HSET', hash, 'created_at', now_s, 'updated_at', now_s,
             'errors', 0, 'repairs', 0, 'requests', 0)
else
  redis.call('ZREM', failing, rank(tonumber(updated)) .. '|' .. session)
  if now > tonumber(updated) then redis.call('HSET', hash, 'updated_at', now_s) end
end
local errors = redis.call('HINCRBY', hash, 'errors', ARGV[7])
redis.call('HINCRBY', hash, 'repairs', ARGV[8])
redis.call('HINCRBY', hash, 'requests', ARGV[9])
redis.call('HSET', hash, 'max_errors', ARGV[6])
for i = 12, #ARGV, 2 do
  redis.call('HINCRBY', hash, 'c:' .. ARGV[i], ARGV[i + 1])
end
updated = redis.call('HGET', hash, 'updated_at')
redis.call('ZADD', recent, updated, session)
redis.call('ZADD', failing, tostring(errors), rank(tonumber(updated)) .. '|' .. session)
redis.call('PEXPIRE', hash, ARGV[5])
return redis.call('HGETALL', hash)
"""
)

# KEYS: the session's claims. ARGV: now, cutoff (now - ttl), ttl_ms, then the call ids.
_CLAIM_LUA = """
local claims = KEYS[1]
redis.call('ZREMRANGEBYSCORE', claims, '-inf', ARGV[2])
local fresh, seen = {}, {}
for i = 4, #ARGV do
  local id = ARGV[i]
  if not seen[id] then
    seen[id] = true
    if not redis.call('ZSCORE', claims, id) then fresh[#fresh + 1] = id end
    redis.call('ZADD', claims, 'GT', ARGV[1], id)
  end
end
if #ARGV >= 4 then redis.call('PEXPIRE', claims, ARGV[3]) end
return fresh
"""

# KEYS: session hash, claims, recent index, failing index. ARGV: session.
_DELETE_LUA = (
    _LUA_RANK
    + """
local updated = redis.call('HGET', KEYS[1], 'updated_at')
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
if updated then redis.call('ZREM', KEYS[4], rank(tonumber(updated)) .. '|' .. ARGV[1]) end
return updated
"""
)

_PURGE_BATCH = 100
_LIST_PAGE = 64


class RedisStore:
    """Sessions in Redis, shared by every proxy replica that points at the same database.

    Each write is one Lua script (`record`, `claim_call_ids`, `delete`), so increments from any
    number of processes are atomic without locks or retries. Expiry is judged against the `now`
    a write is given (and the store's `clock` for reads), like the other stores; besides, every
    key gets a Redis TTL so an idle deployment cleans itself. Expired sessions leave the listing
    indexes in bounded batches during writes. Scripts name keys they compute, so all keys must
    live on one Redis node (a plain server, or one cluster slot via a `{hash tag}` prefix).

    `url` is `redis://[:password@]host:port/db` or `rediss://…` (TLS). The connection is made on
    first use; a store that cannot be reached then raises `SessionStoreError`.

    Raises:
        ConfigError: the URL cannot be parsed, or the `redis` package is not installed.
    """

    def __init__(
        self,
        url: str,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        clock: Callable[[], float] = time.time,
        *,
        prefix: str = "toolsentry:",
        socket_timeout_s: float = 5.0,
        max_connections: int = 64,
    ) -> None:
        _check_ttl(ttl_seconds)
        try:
            import redis.asyncio
        except ImportError as exc:
            raise ConfigError(
                f"session store {_without_password(url)!r} needs the redis package: "
                "pip install 'toolsentry[redis]'"
            ) from exc
        self._ttl = ttl_seconds
        self._ttl_ms = max(1, math.ceil(ttl_seconds * 1000))
        self._clock = clock
        self._prefix = prefix
        try:
            # A blocking pool: a burst of requests waits for a connection (up to the socket
            # timeout) instead of failing once `max_connections` are in use.
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                url,
                max_connections=max_connections,
                timeout=socket_timeout_s,
                decode_responses=True,
                socket_timeout=socket_timeout_s,
                socket_connect_timeout=socket_timeout_s,
                health_check_interval=30,
            )
        except ValueError as exc:
            raise ConfigError(f"invalid session store {_without_password(url)!r}: {exc}") from exc
        self._redis: Redis = redis.asyncio.Redis.from_pool(pool)
        self._url = _without_password(url)
        self._recent = prefix + "sessions:recent"
        self._failing = prefix + "sessions:failing"
        self._record_script = self._redis.register_script(_RECORD_LUA)
        self._claim_script = self._redis.register_script(_CLAIM_LUA)
        self._delete_script = self._redis.register_script(_DELETE_LUA)

    async def get(self, session: str) -> SessionRecord | None:
        async with self._translated():
            fields = await self._redis.hgetall(self._session_key(session))
        return self._live(session, _strings(fields), self._clock())

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
        _check_counts(errors, repairs, requests, channels)
        args: builtins.list[str | int] = [
            session,
            repr(float(now)),
            repr(float(now) - self._ttl),
            repr(float(self._ttl)),
            self._ttl_ms,
            max_errors,
            errors,
            repairs,
            requests,
            self._prefix + "session:",
            _PURGE_BATCH,
        ]
        for channel, count in channels.items():
            if count:
                args += [channel, count]
        keys = [self._session_key(session), self._recent, self._failing]
        async with self._translated():
            flat = await self._record_script(keys=keys, args=args)
        record = _record_from_hash(session, _pairs(flat))
        assert record is not None  # the script has just written it
        return record

    async def claim_call_ids(
        self, session: str, call_ids: Sequence[str], *, now: float
    ) -> builtins.list[str]:
        args: builtins.list[str | int] = [
            repr(float(now)),
            repr(float(now) - self._ttl),
            self._ttl_ms,
            *call_ids,
        ]
        async with self._translated():
            fresh = await self._claim_script(keys=[self._claims_key(session)], args=args)
        return [str(call_id) for call_id in fresh]

    async def delete(self, session: str) -> bool:
        keys = [self._session_key(session), self._claims_key(session), self._recent, self._failing]
        async with self._translated():
            updated = await self._delete_script(keys=keys, args=[session])
        return updated is not None and float(updated) + self._ttl > self._clock()

    async def close(self) -> None:
        await self._redis.aclose()

    async def list(
        self, *, order: Order = "recent", limit: int = 50
    ) -> builtins.list[SessionRecord]:
        if order not in ("recent", "failing"):
            raise ValueError(f"unknown order {order!r}; use 'recent' or 'failing'")
        now = self._clock()
        found: builtins.list[SessionRecord] = []
        start = 0
        async with self._translated():
            while len(found) < limit:
                page = max(limit - len(found), _LIST_PAGE)
                if order == "recent":
                    # Most recent first, so the first expired entry ends the live ones.
                    names = await self._redis.zrevrangebyscore(
                        self._recent, "+inf", f"({now - self._ttl!r}", start=start, num=page
                    )
                    candidates = [str(name) for name in names]
                else:
                    members = await self._redis.zrevrange(self._failing, start, start + page - 1)
                    candidates = []
                    for member in members:
                        rank, _, name = str(member).partition("|")
                        if float(rank) + self._ttl > now:
                            candidates.append(name)
                    names = members
                if not names:
                    break
                start += len(names)
                async with self._redis.pipeline(transaction=False) as pipe:
                    for name in candidates:
                        pipe.hgetall(self._session_key(name))
                    hashes = await pipe.execute()
                for name, fields in zip(candidates, hashes, strict=True):
                    live = self._live(name, _strings(fields), now)
                    if live is not None and len(found) < limit:
                        found.append(live)
        return found

    def _session_key(self, session: str) -> str:
        return f"{self._prefix}session:{session}"

    def _claims_key(self, session: str) -> str:
        return f"{self._prefix}claims:{session}"

    def _live(self, session: str, fields: Mapping[str, str], now: float) -> SessionRecord | None:
        record = _record_from_hash(session, fields)
        if record is None or record.updated_at + self._ttl <= now:
            return None
        return record

    @asynccontextmanager
    async def _translated(self) -> AsyncIterator[None]:
        from redis.exceptions import RedisError

        try:
            yield
        except RedisError as exc:
            raise SessionStoreError(
                f"session store {self._url} failed: {exc.__class__.__name__}: {exc}"
            ) from exc


def _strings(fields: Mapping[Any, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in fields.items()}


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


def _record_from_hash(session: str, fields: Mapping[str, str]) -> SessionRecord | None:
    if "updated_at" not in fields:
        return None
    channels = {k[2:]: int(v) for k, v in fields.items() if k.startswith("c:") and int(v)}
    return SessionRecord(
        session,
        int(fields["errors"]),
        int(fields.get("max_errors", 0)),
        int(fields["repairs"]),
        channels,
        int(fields["requests"]),
        float(fields["created_at"]),
        float(fields["updated_at"]),
    )


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _sort_key(order: Order) -> Callable[[SessionRecord], tuple[Any, ...]]:
    if order == "recent":
        return lambda r: (r.updated_at, r.session)
    if order == "failing":
        return lambda r: (r.errors, r.updated_at, r.session)
    raise ValueError(f"unknown order {order!r}; use 'recent' or 'failing'")


def _copy(record: SessionRecord) -> SessionRecord:
    return SessionRecord(
        record.session,
        record.errors,
        record.max_errors,
        record.repairs,
        dict(record.channels),
        record.requests,
        record.created_at,
        record.updated_at,
    )


def _check_ttl(ttl_seconds: float) -> None:
    if ttl_seconds <= 0:
        raise ConfigError(f"session ttl must be positive, got {ttl_seconds}")


def _check_counts(errors: int, repairs: int, requests: int, channels: Mapping[str, int]) -> None:
    named = {"errors": errors, "repairs": repairs, "requests": requests, **channels}
    negative = {name: n for name, n in named.items() if n < 0}
    if negative:
        raise ValueError(f"session counts only grow; negative increments: {negative}")


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")
