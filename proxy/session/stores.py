"""Where session counters live: the `SessionStore` protocol and its implementations (DESIGN §5).

    MemoryStore   one process; the default (here)
    SqliteStore   survives restarts; several worker processes on one host share one file (sqlite_store.py)
    RedisStore    several proxy replicas on any number of hosts share one Redis database (redis_store.py)

Every operation is one atomic step (one transaction in SQLite, one Lua script in Redis). A session expires `ttl_seconds` after its last update; expiry is judged against the
`now` a write is given, and against the store's `clock` for reads.
"""

from __future__ import annotations

import builtins
import heapq
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from proxy.errors import ConfigError
from proxy.session.history import Entry, History, follow

if TYPE_CHECKING:
    pass

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
            "created_at": iso_time(self.created_at),
            "updated_at": iso_time(self.updated_at),
        }


class SessionUpdate(NamedTuple):
    """What one phase of a turn writes to its session, in one atomic step (`SessionStore.apply`).

    The counts are added as `record` adds them. `claims`: call ids marked as `claim_call_ids`
    marks them; where `claimed_channel` is given, the fresh ones (not marked before) also count
    as errors, in that channel. `responses`: ids linked to the session as `link_response` links
    them. A named tuple: one or two a request, made in a fraction of a dataclass's time.
    """

    max_errors: int
    errors: int = 0
    repairs: int = 0
    channels: Mapping[str, int] = NO_CHANNELS
    requests: int = 0
    claims: Sequence[str] = ()
    claimed_channel: str | None = None
    responses: Sequence[str] = ()

    def counts(self, fresh: int) -> tuple[int, Mapping[str, int]]:
        """The errors and channels to add once `fresh` claims were fresh."""
        if not fresh or self.claimed_channel is None:
            return self.errors, self.channels
        channels = dict(self.channels)
        channels[self.claimed_channel] = channels.get(self.claimed_channel, 0) + fresh
        return self.errors + fresh, channels

    def check(self) -> None:
        """Raise ValueError for a negative count (see `check_counts`)."""
        check_counts(self.errors, self.repairs, self.requests, self.channels)


class Applied(NamedTuple):
    """What `SessionStore.apply` wrote: the session's record after it, and the claimed call ids
    that were not marked before, in the order given, once each."""

    record: SessionRecord
    fresh: builtins.list[str]


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

    async def apply(self, session: str, update: SessionUpdate, *, now: float) -> Applied:
        """Write one phase of a turn in one atomic step (one round trip where the store is
        remote): mark `update.claims`, add the counts (the fresh claims' too, see
        `SessionUpdate`) as `record` does, link `update.responses`.

        Raises:
            ValueError: a count is negative (nothing is written).
        """
        ...

    async def delete(self, session: str) -> bool:
        """Forget `session` and its marked call ids; return whether a live record existed."""
        ...

    async def add_counts(
        self, key: str, counts: Mapping[str, int], *, max_fields: int | None = None
    ) -> None:
        """Add `counts` to the counter set `key` in one atomic step (figures every worker and
        replica share, such as the shadow comparison's; they do not expire).

        A field not yet in the set is created only while the set has fewer than `max_fields`
        fields (None: no cap), so names a model made up cannot grow it without bound; fields
        already there are always added to.

        Raises:
            ValueError: a count is negative.
        """
        ...

    async def read_counts(self, key: str) -> dict[str, int]:
        """The counter set `key` (empty when nothing was counted)."""
        ...

    async def link_response(self, response_id: str, session: str, *, now: float) -> None:
        """Remember that the response `response_id` was answered in `session`, for `ttl_seconds`
        (a Responses chain that sends only `previous_response_id` stays in its session)."""
        ...

    async def session_of_response(self, response_id: str) -> str | None:
        """The session `link_response` linked `response_id` to, or None (unknown or expired)."""
        ...

    async def track_conversation(self, history: History, new_session: str, *, now: float) -> str:
        """The session of a request that names none, by its history's digests (scoped to its
        client key): the conversation it continues, an exact repeat's, else `new_session`; the
        digests remembered for the next request, all in one atomic step (the rule of
        `proxy.session.history.follow`). What is remembered under a digest expires
        `ttl_seconds` after it was put there."""
        ...

    async def close(self) -> None:
        """Release connections and threads; the store is unusable afterwards."""
        ...

    async def list(
        self, *, order: Order = "recent", limit: int = 50, prefix: str = ""
    ) -> builtins.list[SessionRecord]:
        """Up to `limit` live sessions whose ids start with `prefix` (one client key's, see
        `budget.scoped`), most recently updated first (`recent`) or with the most errors first
        (`failing`, ties broken by recency).
        """
        ...


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
        check_ttl(ttl_seconds)
        self._ttl = ttl_seconds
        self._clock = clock
        self._max_sessions = max_sessions
        # Both ordered least recently touched first, so eviction pops from the front.
        self._records: OrderedDict[str, SessionRecord] = OrderedDict()
        self._claims: OrderedDict[str, _Claims] = OrderedDict()
        self._counts: dict[str, dict[str, int]] = {}
        self._responses: OrderedDict[str, tuple[str, float]] = OrderedDict()
        # Digest -> conversations, least recently written first (see `track_conversation`).
        self._conversations: OrderedDict[str, list[Entry]] = OrderedDict()

    async def get(self, session: str) -> SessionRecord | None:
        current = self._records.get(session)
        if current is None or self._expired(current.updated_at, self._clock()):
            return None
        return copy_record(current)

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
        return copy_record(current)

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

    async def apply(self, session: str, update: SessionUpdate, *, now: float) -> Applied:
        # Nothing here awaits (no I/O), so the steps below are one atomic step on the loop.
        update.check()
        fresh = await self.claim_call_ids(session, update.claims, now=now) if update.claims else []
        errors, channels = update.counts(len(fresh))
        record = await self.record(
            session,
            max_errors=update.max_errors,
            errors=errors,
            repairs=update.repairs,
            channels=channels,
            requests=update.requests,
            now=now,
        )
        for response_id in update.responses:
            await self.link_response(response_id, session, now=now)
        return Applied(record, fresh)

    async def delete(self, session: str) -> bool:
        self._claims.pop(session, None)
        current = self._records.pop(session, None)
        return current is not None and not self._expired(current.updated_at, self._clock())

    async def add_counts(
        self, key: str, counts: Mapping[str, int], *, max_fields: int | None = None
    ) -> None:
        check_counts(0, 0, 0, counts)
        current = self._counts.setdefault(key, {})
        for name, count in counts.items():
            if name in current:
                current[name] += count
            elif max_fields is None or len(current) < max_fields:
                current[name] = count

    async def read_counts(self, key: str) -> dict[str, int]:
        return dict(self._counts.get(key, {}))

    async def link_response(self, response_id: str, session: str, *, now: float) -> None:
        self._responses[response_id] = (session, now)
        self._responses.move_to_end(response_id)
        while self._responses:
            _, linked_at = next(iter(self._responses.values()))
            if not self._expired(linked_at, now) and len(self._responses) <= self._max_sessions:
                break
            self._responses.popitem(last=False)

    async def session_of_response(self, response_id: str) -> str | None:
        linked = self._responses.get(response_id)
        if linked is None or self._expired(linked[1], self._clock()):
            return None
        return linked[0]

    async def track_conversation(self, history: History, new_session: str, *, now: float) -> str:
        # Nothing here awaits, so the lookup and the writes are one atomic step on the loop.
        known = self._conversations
        lists = {d: known[d] for d in (history.tip, *history.prefixes) if d in known}
        session, writes = follow(lists, history, new_session, now=now, ttl=self._ttl)
        for digest, entries in writes.items():
            if entries:
                known[digest] = entries
                known.move_to_end(digest)
            else:
                known.pop(digest, None)
        # Bounded as the sessions are: expired lists first, then the least recently written.
        while known:
            entries = next(iter(known.values()))
            if len(known) <= self._max_sessions and max(at for _, at in entries) + self._ttl > now:
                break
            known.popitem(last=False)
        return session

    async def close(self) -> None:
        self._conversations.clear()
        self._records.clear()
        self._claims.clear()
        self._counts.clear()
        self._responses.clear()

    async def list(
        self, *, order: Order = "recent", limit: int = 50, prefix: str = ""
    ) -> builtins.list[SessionRecord]:
        now = self._clock()
        live = (
            r
            for r in self._records.values()
            if r.session.startswith(prefix) and not self._expired(r.updated_at, now)
        )
        return [copy_record(r) for r in heapq.nlargest(limit, live, key=sort_key(order))]

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


def sort_key(order: Order) -> Callable[[SessionRecord], tuple[Any, ...]]:
    """The key that orders records for `list(order=...)`, largest first when reversed."""
    if order == "recent":
        return lambda r: (r.updated_at, r.session)
    if order == "failing":
        return lambda r: (r.errors, r.updated_at, r.session)
    raise ValueError(f"unknown order {order!r}; use 'recent' or 'failing'")


def copy_record(record: SessionRecord) -> SessionRecord:
    """A copy a caller may change without touching the store's own record."""
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


def check_ttl(ttl_seconds: float) -> None:
    """Raise ConfigError unless the session TTL is positive."""
    if ttl_seconds <= 0:
        raise ConfigError(f"session ttl must be positive, got {ttl_seconds}")


def check_counts(errors: int, repairs: int, requests: int, channels: Mapping[str, int]) -> None:
    """Raise ValueError for a negative increment: session counts only grow."""
    if min(errors, repairs, requests) >= 0 and (not channels or min(channels.values()) >= 0):
        return
    named = {"errors": errors, "repairs": repairs, "requests": requests, **channels}
    negative = {name: n for name, n in named.items() if n < 0}
    if negative:
        raise ValueError(f"session counts only grow; negative increments: {negative}")


def iso_time(epoch: float) -> str:
    """An epoch time as ISO-8601 UTC with a trailing Z."""
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
