"""RedisStore: session counts in Redis, shared by any number of proxy replicas.

One Lua script per write, one round trip per phase of a turn; two sorted sets index sessions by
recency and, those with errors, by errors.
"""

from __future__ import annotations

import builtins
import math
import time
from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any

from proxy.errors import SessionStoreError
from proxy.session.history import History
from proxy.session.redis_connections import Connections, Script, command, lua_string
from proxy.session.redis_conversations import TRACK_CONVERSATION, track_call
from proxy.session.stores import (
    DEFAULT_TTL_SECONDS,
    NO_CHANNELS,
    Applied,
    Order,
    SessionRecord,
    SessionUpdate,
    check_counts,
    check_ttl,
    without_password,
)

# -- Redis ---------------------------------------------------------------------------------------
#
# Keys, under a prefix (default "toolsentry:"):
#   {prefix}session:{id}       hash: errors, max_errors, repairs, requests, created_at,
#                              updated_at, and one "c:{channel}" field per channel
#   {prefix}claims:{id}        sorted set: call id -> when it was last claimed
#   {prefix}sessions:recent    sorted set: session id -> updated_at
#   {prefix}counts:{key}       hash: field -> count, shared figures (`add_counts`); no TTL
#   {prefix}sessions:failing   sorted set: "{rank}|{id}" -> errors, of the sessions with errors,
#                              where rank is updated_at as a fixed-width decimal, so equal error
#                              counts order by recency, then id
#   {prefix}response:{id}      string: "{linked_at}|{session}", a Responses chain's link
#   {prefix}conversation:{d}   list: the conversations whose last request's history has the
#                              digest d (redis_conversations.py)
#
# Listing reads these two sorted sets (one ZREVRANGE page per call) rather than SCANning every
# session key: SCAN would read and sort the whole keyspace on each `GET /v1/sessions`. The cost is
# one ZADD per index on each write, inside the script that writes anyway; the failing index
# leaves out sessions without errors (most), which its listing takes from the recent index. Every script computes
# the rank itself (string.format in Lua), so the member it removes is always the one it added.

_LUA_RANK = """
local function rank(t) return string.format('%020.6f', t) end
"""

# The write of one phase of a turn (`RedisStore.apply`): claims, counts, links, in one script.
# KEYS: session hash, claims, recent index, failing index.
# ARGV: session, now, max_errors, errors, repairs, requests, the number of claims, the number of
#       links, purge (1: purge a batch of expired sessions first), the claimed channel ("" when
#       fresh claims count nowhere), then the claimed call ids, the response ids to link, and
#       channel/count pairs.
# The store's constants (TTL, TTL_MS, PREFIX, BATCH) are written into the script's text.
# Returns the fresh claims, then the record as written: errors, max_errors, repairs, requests (as
# integers), created_at, updated_at (as written), and the channels counted (name, count, …).
# Integers and the channels picked out here cost the proxy less than the hash's fields and
# values did, to merge and parse itself (bench.hotpath --stores).
#
# Commands, for a session that exists: HGETALL, one HSET, ZADD recent, PEXPIRE; the failing
# index only when the session has errors (it holds no session without), the claims set only
# when there are claims, the purge only when asked (now and then, not on every write).
_APPLY_LUA = """
local hash, claims, recent, failing = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local session, now_s = ARGV[1], ARGV[2]
local now = tonumber(now_s)
local max_errors, add_errors = tonumber(ARGV[3]), tonumber(ARGV[4])
local add_repairs, add_requests = tonumber(ARGV[5]), tonumber(ARGV[6])
local nclaims, nlinks, purge = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
local claimed_channel = ARGV[10]
local function member(t, name) return string.format('%020.6f', t) .. '|' .. name end
local function cutoff() return string.format('%.17g', now - TTL) end

-- Sessions last updated a TTL ago leave the indexes, a bounded batch. Their hash may already
-- be gone (Redis expired it), so the rank is rebuilt from the recent index's score.
if purge == '1' then
  local stale = redis.call('ZRANGEBYSCORE', recent, '-inf', cutoff(), 'WITHSCORES', 'LIMIT', 0, BATCH)
  for i = 1, #stale, 2 do
    local name = stale[i]
    local key = PREFIX .. 'session:' .. name
    local updated = redis.call('HGET', key, 'updated_at')
    if not updated or tonumber(updated) + TTL <= now then
      redis.call('ZREM', failing, member(tonumber(stale[i + 1]), name))
      if updated then redis.call('ZREM', failing, member(tonumber(updated), name)) end
      redis.call('ZREM', recent, name)
      redis.call('DEL', key)
    end
  end
end

local fresh = {}
if nclaims > 0 then
  redis.call('ZREMRANGEBYSCORE', claims, '-inf', cutoff())
  local ids, seen = {}, {}
  for i = 11, 10 + nclaims do
    if not seen[ARGV[i]] then
      seen[ARGV[i]] = true
      ids[#ids + 1] = ARGV[i]
    end
  end
  for first = 1, #ids, 1000 do
    local last = math.min(first + 999, #ids)
    local scores = redis.call('ZMSCORE', claims, unpack(ids, first, last))
    local marks = {}
    for i = first, last do
      if not scores[i - first + 1] then fresh[#fresh + 1] = ids[i] end
      marks[#marks + 1] = now_s
      marks[#marks + 1] = ids[i]
    end
    redis.call('ZADD', claims, 'GT', unpack(marks))
  end
  redis.call('PEXPIRE', claims, TTL_MS)
end

local h = {}
local flat = redis.call('HGETALL', hash)
for i = 1, #flat, 2 do h[flat[i]] = flat[i + 1] end
local updated = tonumber(h.updated_at)
local before = tonumber(h.errors) or 0
if updated and updated + TTL <= now then
  redis.call('DEL', hash)
  if before > 0 then redis.call('ZREM', failing, member(updated, session)) end
  h, flat, updated, before = {}, {}, nil, 0
end
local set = {}
local function put(field, value)
  h[field] = value
  set[#set + 1] = field
  set[#set + 1] = value
end
local function add(field, count)
  if count ~= 0 or not h[field] then
    put(field, string.format('%d', (tonumber(h[field]) or 0) + count))
  end
end
if not updated then
  put('created_at', now_s)
  put('updated_at', now_s)
elseif now > updated then
  put('updated_at', now_s)
end
local claimed = 0
if claimed_channel ~= '' then claimed = #fresh end
add('errors', add_errors + claimed)
add('repairs', add_repairs)
add('requests', add_requests)
if tonumber(h.max_errors) ~= max_errors then put('max_errors', string.format('%d', max_errors)) end
for i = 11 + nclaims + nlinks, #ARGV, 2 do
  add('c:' .. ARGV[i], tonumber(ARGV[i + 1]))
end
if claimed > 0 then add('c:' .. claimed_channel, claimed) end
if #set > 0 then redis.call('HSET', hash, unpack(set)) end
redis.call('PEXPIRE', hash, TTL_MS)

local errors, latest = tonumber(h.errors), tonumber(h.updated_at)
redis.call('ZADD', recent, h.updated_at, session)
if errors ~= before or latest ~= updated then
  if before > 0 then redis.call('ZREM', failing, member(updated, session)) end
  if errors > 0 then redis.call('ZADD', failing, errors, member(latest, session)) end
end

for i = 11 + nclaims, 10 + nclaims + nlinks do
  redis.call('SET', PREFIX .. 'response:' .. ARGV[i], now_s .. '|' .. session, 'PX', TTL_MS)
end

local channels = {}
for field, value in pairs(h) do
  local c, colon = string.byte(field, 1, 2)  -- 'c:', without making a string of it
  if c == 99 and colon == 58 and value ~= '0' then
    channels[#channels + 1] = string.sub(field, 3)
    channels[#channels + 1] = tonumber(value)
  end
end
return {fresh, errors, tonumber(h.max_errors), tonumber(h.repairs), tonumber(h.requests),
        h.created_at, h.updated_at, channels}
"""

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

_PURGE_BATCH = 250
# A write purges expired sessions at most this often (by the `now` writes are given), per store:
# most writes then run no purge command at all, and each store still clears up to 1,000 a second.
_PURGE_INTERVAL_S = 0.25
_LIST_PAGE = 64


class RedisStore:
    """Sessions in Redis, shared by every proxy replica that points at the same database.

    Each write is one Lua script (`apply`, `record`, `claim_call_ids`, `delete`), so increments
    from any number of processes are atomic without locks or retries. Expiry is judged against
    the `now` a write is given (and the store's `clock` for reads), like the other stores;
    besides, every key gets a Redis TTL so an idle deployment cleans itself. Expired sessions
    leave the listing indexes in bounded batches during writes. Scripts name keys they compute,
    so all keys must live on one Redis node (a plain server, or one cluster slot via a
    `{hash tag}` prefix).

    `url` is `redis://[:password@]host:port/db` or `rediss://…` (TLS). Connections are made on
    first use; a store that cannot be reached then raises `SessionStoreError`.

    Raises:
        ConfigError: the URL cannot be parsed, or the `redis` or `hiredis` package is not
            installed.
    """

    def __init__(
        self,
        url: str,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        clock: Callable[[], float] = time.time,
        *,
        prefix: str = "toolsentry:",
        socket_timeout_s: float = 5.0,
    ) -> None:
        check_ttl(ttl_seconds)
        self._ttl = ttl_seconds
        self._ttl_ms = max(1, math.ceil(ttl_seconds * 1000))
        self._clock = clock
        self._prefix = prefix
        self._url = without_password(url)
        self._connections = Connections(url, socket_timeout_s)
        self._translated = _Translated(self._url, self._connections.errors)
        self._recent = prefix + "sessions:recent"
        self._failing = prefix + "sessions:failing"
        self._purged_at = float("-inf")
        constants = {
            "TTL": repr(float(ttl_seconds)),
            "TTL_MS": str(self._ttl_ms),
            "PREFIX": lua_string(prefix),
            "BATCH": str(_PURGE_BATCH),
        }
        header = "".join(f"local {name} = {value}\n" for name, value in constants.items())
        self._apply_script = Script(header + _APPLY_LUA)
        self._claim_script = Script(_CLAIM_LUA)
        self._delete_script = Script(_DELETE_LUA)
        self._add_counts_script = Script(_ADD_COUNTS_LUA)

    async def get(self, session: str) -> SessionRecord | None:
        with self._translated:
            flat = await self._connections.call(command("HGETALL", self._session_key(session)))
        return self._live(session, _pairs(flat), self._clock())

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
        update = SessionUpdate(max_errors, errors, repairs, channels, requests)
        return (await self.apply(session, update, now=now)).record

    async def apply(self, session: str, update: SessionUpdate, *, now: float) -> Applied:
        update.check()
        purge = now - self._purged_at >= _PURGE_INTERVAL_S
        if purge:
            self._purged_at = now
        claims, links = update.claims, update.responses
        now = float(now)
        now_s = repr(now)
        args = [
            session,
            now_s,
            str(update.max_errors),
            str(update.errors),
            str(update.repairs),
            str(update.requests),
            str(len(claims)),
            str(len(links)),
            "1" if purge else "0",
            update.claimed_channel or "",
            *claims,
            *links,
        ]
        for channel, count in update.channels.items():
            if count:
                args += (channel, str(count))
        keys = (
            self._session_key(session),
            self._claims_key(session),
            self._recent,
            self._failing,
        )
        # A bare try rather than `with self._translated`: free on 3.11, where the context
        # costs two calls a request.
        try:
            reply = await self._connections.run(self._apply_script, keys, args)
        except self._translated.errors as exc:
            raise self._translated.failure(exc) from exc
        return _applied(session, reply, now_s, now)

    async def claim_call_ids(
        self, session: str, call_ids: Sequence[str], *, now: float
    ) -> builtins.list[str]:
        args = [repr(float(now)), repr(float(now) - self._ttl), str(self._ttl_ms), *call_ids]
        with self._translated:
            fresh = await self._connections.run(
                self._claim_script, (self._claims_key(session),), args
            )
        return [str(call_id) for call_id in fresh]

    async def delete(self, session: str) -> bool:
        keys = (self._session_key(session), self._claims_key(session), self._recent, self._failing)
        with self._translated:
            updated = await self._connections.run(self._delete_script, keys, (session,))
        return updated is not None and float(updated) + self._ttl > self._clock()

    async def add_counts(
        self, key: str, counts: Mapping[str, int], *, max_fields: int | None = None
    ) -> None:
        check_counts(0, 0, 0, counts)
        if max_fields is not None and max_fields < 1:
            return  # no room for any field, and 0 means "no cap" to the script
        args = [str(max_fields or 0)]
        for name, count in counts.items():
            args += (name, str(count))
        with self._translated:
            await self._connections.run(
                self._add_counts_script, (self._prefix + "counts:" + key,), args
            )

    async def read_counts(self, key: str) -> dict[str, int]:
        with self._translated:
            flat = await self._connections.call(command("HGETALL", self._prefix + "counts:" + key))
        return {k: int(v) for k, v in _pairs(flat).items()}

    async def link_response(self, response_id: str, session: str, *, now: float) -> None:
        # The link's own time decides whether it is live, as for every record of this store;
        # Redis drops the key a TTL later on its own clock, so nothing is kept for ever.
        key, value = self._response_key(response_id), f"{now!r}|{session}"
        with self._translated:
            await self._connections.call(command("SET", key, value, "PX", str(self._ttl_ms)))

    async def session_of_response(self, response_id: str) -> str | None:
        with self._translated:
            value = await self._connections.call(command("GET", self._response_key(response_id)))
        if value is None:
            return None
        linked_at, _, session = str(value).partition("|")
        return None if float(linked_at) + self._ttl <= self._clock() else session

    async def track_conversation(self, history: History, new_session: str, *, now: float) -> str:
        keys, args = track_call(
            self._prefix, history, new_session, now=now, ttl=self._ttl, ttl_ms=self._ttl_ms
        )
        with self._translated:
            return str(await self._connections.run(TRACK_CONVERSATION, keys, args))

    async def close(self) -> None:
        await self._connections.close()

    async def list(
        self, *, order: Order = "recent", limit: int = 50, prefix: str = ""
    ) -> builtins.list[SessionRecord]:
        if order not in ("recent", "failing"):
            raise ValueError(f"unknown order {order!r}; use 'recent' or 'failing'")
        now = self._clock()
        found: builtins.list[SessionRecord] = []
        with self._translated:
            if order == "failing":
                # The failing index holds the sessions with errors; those without follow, most
                # recent first, from the recent index.
                await self._collect(found, "failing", limit, prefix, now)
                listed = {record.session for record in found}
                await self._collect(found, "recent", limit, prefix, now, skip=listed)
            else:
                await self._collect(found, "recent", limit, prefix, now)
        return found

    async def _collect(
        self,
        found: builtins.list[SessionRecord],
        index: Order,
        limit: int,
        prefix: str,
        now: float,
        *,
        skip: Container[str] | None = None,
    ) -> None:
        """Append to `found`, up to `limit`, the live sessions of the index `index`: of the
        failing index, those with errors; of the recent index, all, or with `skip`, those
        without errors that are not in `skip`."""
        start = 0
        while len(found) < limit:
            names, candidates = await self._page(
                index, start, max(limit - len(found), _LIST_PAGE), prefix, now
            )
            if not names:
                return
            start += len(names)
            if skip is not None:
                candidates = [name for name in candidates if name not in skip]
            hashes = await self._connections.call_many(
                [command("HGETALL", self._session_key(name)) for name in candidates]
            )
            for name, flat in zip(candidates, hashes, strict=True):
                live = self._live(name, _pairs(flat), now)
                if live is None or len(found) >= limit:
                    continue
                if index == "failing" and live.errors == 0:
                    continue  # left by an older version, which indexed every session here
                if skip is not None and live.errors > 0:
                    continue  # listed from the failing index
                found.append(live)

    async def _page(
        self, index: Order, start: int, size: int, prefix: str, now: float
    ) -> tuple[builtins.list[str], builtins.list[str]]:
        """Up to `size` members of the index `index` from `start` on, and the names of the live
        sessions among them whose ids start with `prefix`."""
        if index == "recent":
            # Most recent first, so the first expired entry ends the live ones.
            bound = f"({now - self._ttl!r}"
            names = await self._connections.call(
                command(
                    "ZREVRANGEBYSCORE", self._recent, "+inf", bound, "LIMIT", str(start), str(size)
                )
            )
            return names, [name for name in names if name.startswith(prefix)]
        members = await self._connections.call(
            command("ZREVRANGE", self._failing, str(start), str(start + size - 1))
        )
        candidates = []
        for member in members:
            rank, _, name = member.partition("|")
            if float(rank) + self._ttl > now and name.startswith(prefix):
                candidates.append(name)
        return members, candidates

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


class _Translated:
    """A context that turns the Redis client's errors into SessionStoreError (a class, not a
    generator: it is entered on every call)."""

    __slots__ = ("_url", "errors")

    def __init__(self, url: str, errors: type[Exception]) -> None:
        self._url = url
        self.errors = errors
        """What is translated: the client's root error."""

    def failure(self, exc: Exception) -> SessionStoreError:
        """The SessionStoreError that `exc`, one of `errors`, becomes."""
        return SessionStoreError(
            f"session store {self._url} failed: {exc.__class__.__name__}: {exc}"
        )

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, traceback: object) -> None:
        if exc is not None and isinstance(exc, self.errors):
            raise self.failure(exc) from exc


def _applied(session: str, reply: Sequence[Any], now_s: str, now: float) -> Applied:
    """The record and fresh claims of the apply script's reply (see `_APPLY_LUA`) to a write
    at `now` (`now_s`: its repr, as sent); texts decoded, a script's tables arrays, whatever
    the protocol."""
    fresh, errors, max_errors, repairs, requests, created_at, updated_at, channels = reply
    # A time the script wrote is `now_s`, whose value is `now`: not parsed again (a float's
    # full repr takes strtod's slow, exact path; 3,000 instructions a request, callgrind).
    record = SessionRecord(
        session,
        errors,
        max_errors,
        repairs,
        dict(zip(channels[::2], channels[1::2], strict=True)),
        requests,
        now if created_at == now_s else float(created_at),
        now if updated_at == now_s else float(updated_at),
    )
    return Applied(record, fresh)


def _pairs(reply: Any) -> dict[str, str]:
    """A hash as HGETALL answers it: a map (RESP3) or a flat list of fields and values."""
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    return {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}


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
