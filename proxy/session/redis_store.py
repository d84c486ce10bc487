"""RedisStore: session counts in Redis, shared by any number of proxy replicas.

One Lua script per write; two sorted sets index sessions by recency and by errors.
"""

from __future__ import annotations

import builtins
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from proxy.errors import ConfigError, SessionStoreError
from proxy.session.stores import (
    DEFAULT_TTL_SECONDS,
    NO_CHANNELS,
    Order,
    SessionRecord,
    check_counts,
    check_ttl,
    without_password,
)

if TYPE_CHECKING:
    from redis.asyncio import Redis

_T = TypeVar("_T")

# -- Redis ---------------------------------------------------------------------------------------
#
# Keys, under a prefix (default "toolsentry:"):
#   {prefix}session:{id}       hash: errors, max_errors, repairs, requests, created_at,
#                              updated_at, and one "c:{channel}" field per channel
#   {prefix}claims:{id}        sorted set: call id -> when it was last claimed
#   {prefix}sessions:recent    sorted set: session id -> updated_at
#   {prefix}counts:{key}       hash: field -> count, shared figures (`add_counts`); no TTL
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

# KEYS: the counter set. ARGV: max fields (0: no cap), then field/count pairs. A field not yet
# there is created only while the set has room.
_ADD_COUNTS_LUA = """
local key, cap = KEYS[1], tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  if cap == 0 or redis.call('HEXISTS', key, ARGV[i]) == 1 or redis.call('HLEN', key) < cap then
    redis.call('HINCRBY', key, ARGV[i], ARGV[i + 1])
  end
end
return 0
"""

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
        check_ttl(ttl_seconds)
        try:
            import redis.asyncio
        except ImportError as exc:
            raise ConfigError(
                f"session store {without_password(url)!r} needs the redis package: "
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
            raise ConfigError(f"invalid session store {without_password(url)!r}: {exc}") from exc
        self._redis: Redis = redis.asyncio.Redis.from_pool(pool)
        self._url = without_password(url)
        self._recent = prefix + "sessions:recent"
        self._failing = prefix + "sessions:failing"
        self._record_script = self._redis.register_script(_RECORD_LUA)
        self._claim_script = self._redis.register_script(_CLAIM_LUA)
        self._delete_script = self._redis.register_script(_DELETE_LUA)
        self._add_counts_script = self._redis.register_script(_ADD_COUNTS_LUA)

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
        check_counts(errors, repairs, requests, channels)
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

    async def add_counts(
        self, key: str, counts: Mapping[str, int], *, max_fields: int | None = None
    ) -> None:
        check_counts(0, 0, 0, counts)
        if max_fields is not None and max_fields < 1:
            return  # no room for any field, and 0 means "no cap" to the script
        args: builtins.list[str | int] = [max_fields or 0]
        for name, count in counts.items():
            args += [name, count]
        async with self._translated():
            await self._add_counts_script(keys=[self._prefix + "counts:" + key], args=args)

    async def read_counts(self, key: str) -> dict[str, int]:
        async with self._translated():
            fields = await self._redis.hgetall(self._prefix + "counts:" + key)
        return {k: int(v) for k, v in _strings(fields).items()}

    async def link_response(self, response_id: str, session: str, *, now: float) -> None:
        # The link's own time decides whether it is live, as for every record of this store;
        # Redis drops the key a TTL later on its own clock, so nothing is kept for ever.
        ttl_ms = max(1, math.ceil(self._ttl * 1000))
        async with self._translated():
            await self._redis.set(self._response_key(response_id), f"{now!r}|{session}", px=ttl_ms)

    async def session_of_response(self, response_id: str) -> str | None:
        async with self._translated():
            value = await self._redis.get(self._response_key(response_id))
        if value is None:
            return None
        linked_at, _, session = str(value).partition("|")
        return None if float(linked_at) + self._ttl <= self._clock() else session

    async def close(self) -> None:
        await self._redis.aclose()

    async def list(
        self, *, order: Order = "recent", limit: int = 50, prefix: str = ""
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
                    candidates = [str(name) for name in names if str(name).startswith(prefix)]
                else:
                    members = await self._redis.zrevrange(self._failing, start, start + page - 1)
                    candidates = []
                    for member in members:
                        rank, _, name = str(member).partition("|")
                        if float(rank) + self._ttl > now and name.startswith(prefix):
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

    def _response_key(self, response_id: str) -> str:
        return f"{self._prefix}response:{response_id}"

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
