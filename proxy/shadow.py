"""Shadow comparison (DESIGN §11): a sample of sessions is answered by a reference upstream too,
in the background, and both answers' tool decisions are compared and counted.

The turn hands a `ShadowRequest` to `Shadow.submit` once the client's answer is settled; nothing
here can delay or change that answer. `submit` never awaits and sends nothing itself: once the
turn's step has ended (the client's response written), the request goes to the reference with
`Upstream.send` — on an idle connection of the reference's own pool, the answer judged and counted
by the connection's callback (no task, no future per pair, which the proxy's CPU shares with the
client's requests), or, with none idle, from a task of the upstream's that makes one; with
`max_in_flight` requests already under way it drops the pair and counts the drop. A request the
reference could not be asked as is — a Responses turn that continues a response or conversation
stored at the primary's upstream (`shadowstats.skip_reason`) — is not sent: it is counted as
skipped, with its reason (the proxy keeps no copy of the stored context to rebuild it from, and
the reference's own earlier answer would not be the same context). The reference is asked once
(no retries), within `timeout`; a slow or failing reference is counted by kind.

What is in flight: `Shadow._flight`, each request submitted and not yet ended, in the order it was
submitted, with its deadline (all share one timeout, so the first is the next to expire) and its
`job`, what `cancel()` stops:

    state      job                      ended by                           counted as
    scheduled  the start (asyncio       (the turn's step ends: `_start`)   — (becomes sent)
               call_soon handle)
    sent       the upstream's `Sent`    its answer (`_replied`)            a pair, or an error
                                        its deadline (`_expire`, one       error "timeout"
                                        timer for the earliest)
    either     —                        `close`                            nothing

How counts are batched: each pair is counted three ways — Prometheus (`toolsentry_shadow_*`), the
session store (the figures `GET /v1/stats/shadow` shows, the same from every worker and replica)
and, when configured, the shadow log (JSONL, written at once by a thread of its own, rotated by
size: `proxy.shadow_log_writer`). The metrics and the store are not written per pair: each event
goes into the process's `_Batch` (pairs added up by what their counts depend on,
`shadowstats.pair_key`; metric increments; store fields per (model, reference)), and one timer,
armed by the first event after a flush, flushes the batch `FLUSH_SECONDS` later: each distinct
pair key counted once, one increment per metric child, three store calls per (model,
reference). A process flushes what it holds before it reads (`stats`), when drained and when
closed, so its own figures are exact at once, and another worker's or replica's, and a scrape of
the metrics, within `FLUSH_SECONDS`.

Counts in the store, per (model, reference):
    shadow:index                      field "{model}|{reference}" -> pairs (which pairs exist)
    shadow:{model}|{reference}        the bounded fields of `shadowstats.pair_counts`, drops,
                                      errors, skips
    shadow-names:{model}|{reference}  signatures and argument keys, capped at `MAX_NAMES` fields
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Protocol

import orjson
import structlog

from proxy.config import Settings, ShadowConfig
from proxy.config_upstream import UpstreamConfig
from proxy.errors import (
    ConfigError,
    SessionStoreError,
    ToolsentryError,
    UpstreamConnectError,
    UpstreamProtocolError,
    UpstreamTimeoutError,
)
from proxy.guard.toolcheck import validate
from proxy.logs import get_logger
from proxy.metrics import Metrics, ShadowMetrics
from proxy.protocols.base import TurnView, WireProtocol
from proxy.session.stores import SessionStore
from proxy.shadow_log_writer import ShadowLog
from proxy.shadowstats import (
    DROPPED,
    PAIRS,
    Decision,
    Pair,
    PairKey,
    Side,
    Tally,
    error_field,
    figures,
    is_sampled,
    pair_counts,
    pair_key,
    skip_field,
    skip_reason,
)
from proxy.tracing import CURRENT as CURRENT_TRACE
from proxy.upstream import HttpUpstream, Sent, Upstream
from proxy.upstream_response import UpstreamResponse

MAX_NAMES: Final = 2000
MAX_MODEL_PAIRS: Final = 64
INDEX_KEY: Final = "shadow:index"
FLUSH_SECONDS: Final = 0.25
_ABSENT: Final = object()
_PRIMARY: Final = Side.PRIMARY.value
_REFERENCE: Final = Side.REFERENCE.value

Judge = Callable[[Any], Decision]
"""The reference's reply (parsed JSON) → its decision: the protocol's adapter and the guard,
against the same request as the primary's answer. Raises ToolsentryError (or ValueError) when
the reply is not an answer of the protocol."""


# Not frozen: a frozen dataclass of this size costs µs per turn to make. Compared and hashed by
# identity: each is one pair under way (the shadow's table of what is in flight is keyed by it).
@dataclass(slots=True, eq=False)
class ShadowRequest:
    """What the turn hands over once the client's answer is settled.

    `body` is the request as the primary's first attempt sent it and `headers` the headers it
    forwarded; the shadow sends it non-streamed with the reference's model name. `primary` is
    the decision of the primary's first answer (before any repair). `judge` reads the
    reference's reply. `bodies` are written to the log only with `log_bodies`. `request_id`
    None: the id the request's log lines are bound to, read from the request's context when
    a log line is written or, for the answer's line, when the request is sent (the start runs
    in a copy of the request's context; the answer's callback does not).
    """

    model: str
    session: str
    api: str
    path: str
    body: Mapping[str, Any]
    headers: Mapping[str, str]
    primary: Decision
    judge: Judge
    request_id: str | None = None
    primary_body: Any = None
    raw: bytes | None = None
    """The bytes the primary's first attempt sent, when they are the client's and `body` is
    what they parse to (None: the shadow encodes `body`)."""


def judge_for(protocol: WireProtocol, view: TurnView, upstream: str) -> Judge:
    """The judge of a reference's reply to a request of `protocol` seen as `view`: the adapter
    reads the reply, the guard checks its first choice against the request's own tools and
    tool_choice, as it checked the primary's."""

    def judge(data: Any) -> Decision:
        reply = protocol.read(data, upstream)
        if not reply.choices:
            raise UpstreamProtocolError(f"upstream {upstream} answered without a choice")
        choice = reply.choices[0]
        found = validate(
            choice.message,
            None,
            view.tool_choice,
            finish_reason=choice.finish_reason,
            index=view.index,
        )
        return Decision.of_message(choice.message, found)

    return judge


def check_shadow(settings: Settings) -> UpstreamConfig | None:
    """The reference upstream the shadow settings name (None when shadowing is off).

    Raises:
        ConfigError: `reference` names no configured upstream.
    """
    config = settings.shadow
    if not config.enabled:
        return None
    for upstream in settings.upstreams:
        if upstream.name == config.reference:
            return upstream
    names = ", ".join(repr(u.name) for u in settings.upstreams) or "none"
    raise ConfigError(
        f"shadow.reference {config.reference!r} names no configured upstream (upstreams: {names})"
    )


def reference_upstream(
    reference: UpstreamConfig, config: ShadowConfig, *, api_key: str | None
) -> HttpUpstream:
    """A client of its own for the reference: its own connection pool (never the hot path's),
    the shadow's timeout, no retries."""
    dedicated = reference.model_copy(
        update={"timeout": config.timeout, "max_connections": config.max_in_flight}
    )
    return HttpUpstream(dedicated, api_key=api_key, retries=0)


class Shadow:
    """Mirrors sampled requests to the reference and counts the pairs (see the module doc: what
    is in flight, what ends it, how counts are batched)."""

    def __init__(
        self,
        config: ShadowConfig,
        reference: Upstream,
        *,
        reference_name: str,
        reference_model: str | None,
        metrics: Metrics,
        store: SessionStore,
        log: ShadowLog | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.reference = reference
        self.reference_name = reference_name
        self.reference_model = reference_model
        self._metrics = ShadowMetrics(metrics)
        self._store = store
        self._log = log
        self._clock = clock
        self._models = frozenset(config.models)
        self._loop: asyncio.AbstractEventLoop | None = None  # the serving loop, once submitted to
        # What is in flight (see the module doc): one timer (`_expiry`) waits for the first
        # deadline, where an `asyncio.timeout` per request would arm and cancel one each.
        # `_drained`: what `drain` waits on until none is left.
        self._flight: dict[ShadowRequest, _InFlight] = {}
        self._expiry: asyncio.TimerHandle | None = None
        self._drained: asyncio.Future[None] | None = None
        # What was counted since the last flush, and the timer that flushes it; `_flushing` is
        # the flush under way (the timer's, or a reader's), one at a time.
        self._batch = _Batch()
        self._flush_timer: asyncio.TimerHandle | None = None
        self._flushing = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._children: dict[tuple[Any, ...], Any] = {}  # metric children, by family and labels
        self._log_events = get_logger()

    @property
    def log_path(self) -> Path | None:
        """Where this process writes the shadow log (None: no log)."""
        return None if self._log is None else self._log.path

    @property
    def in_flight(self) -> int:
        """Shadow requests under way now."""
        return len(self._flight)

    def wants(self, model: str, session: str, *, upstream: str) -> bool:
        """Whether a request of `model` in `session`, served by the upstream named `upstream`, is
        shadowed (model filter, session sample). The reference's own traffic never is: its
        answer would be compared with itself."""
        if upstream == self.reference_name or (self._models and model not in self._models):
            return False
        return is_sampled(session, seed=self.config.seed, rate=self.config.sample)

    def submit(self, request: ShadowRequest) -> bool:
        """Start the shadow request in the background; False when it was skipped or dropped
        (either counted)."""
        reason = skip_reason(request.api, request.body)
        full = len(self._flight) >= self.config.max_in_flight
        if reason is not None:
            self._inc(self._metrics.skipped, request.model, reason.value, request.api)
            self._write_log(request, {"event": "skipped", "reason": reason.value})
            self._count(request.model, {skip_field(reason): 1})
            return False
        if full:
            self._inc(self._metrics.dropped, request.model, request.api)
            self._count(request.model, {DROPPED: 1})
            self._write_log(request, {"event": "dropped"})
            return False
        loop = self._loop
        if loop is None:  # asked once: asyncio asks the OS for the process id every time
            loop = self._loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout
        trace = CURRENT_TRACE.get()
        beside = None if trace is None else trace.beside("shadow")  # its try: a span of its own
        # The turn closes before the client's response is written: the request goes out once
        # this step of the turn has ended (a callback runs in a copy of the request's context).
        entry = self._flight[request] = _InFlight(deadline)
        entry.job = loop.call_soon(self._start, request, entry, beside)
        if self._expiry is None:
            self._expiry = loop.call_at(deadline, self._expire)
        return True

    def _start(self, request: ShadowRequest, entry: _InFlight, trace: Any) -> None:
        """The scheduled start, once the turn's step has ended: scheduled → sent."""
        entry.job = self._send_now(request, trace)

    def _send_now(self, request: ShadowRequest, trace: Any) -> Sent | None:
        """Send `request` to the reference, its answer to `_replied`: the upstream's `Sent`
        (never None: with no idle connection, the upstream sends it from a task of its own)."""
        if self._log is not None and request.request_id is None:
            # The answer's callback runs outside the request's context: its id is kept now.
            request.request_id = structlog.contextvars.get_contextvars().get("request_id")
        return self.reference.send(
            "POST",
            request.path,
            body=self.payload(request),
            headers=request.headers,
            done=functools.partial(self._replied, request),
            trace=trace,
            idle_only=False,
        )

    def _left(self, request: ShadowRequest) -> None:
        """`request` is no longer in flight."""
        del self._flight[request]
        if not self._flight and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _expire(self) -> None:
        """The `_expiry` timer: the requests past their deadline (sent, or in a loop too busy to
        have started them) are cancelled and counted as timeouts; then the timer waits for the
        next deadline."""
        self._expiry = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        late: list[tuple[ShadowRequest, _InFlight]] = []
        for request, entry in self._flight.items():
            if entry.deadline > now:
                self._expiry = loop.call_at(entry.deadline, self._expire)
                break
            late.append((request, entry))
        for request, entry in late:
            if entry.job is not None:
                entry.job.cancel()
            self._left(request)
            self._failed(request, "timeout")

    def _replied(
        self, request: ShadowRequest, sent: Sent, result: UpstreamResponse | ToolsentryError
    ) -> None:
        """sent → ended: the reference's answer (or why none came), judged and counted."""
        self._left(request)
        try:
            if isinstance(result, ToolsentryError):
                raise _ReferenceFailed(_failure_kind(result)) from result
            decision, reply = _judged(request, result)
        except _ReferenceFailed as failed:
            self._failed(request, failed.kind)
            return
        self._answered(request, decision, reply)

    def _answered(self, request: ShadowRequest, decision: Decision, reply: Any) -> None:
        """Count the pair of the primary's decision and the reference's (`reply` its answer):
        one more of its key (`shadowstats.pair_key`), which the next flush expands into the
        metrics' and the store's counts (`_count_pairs`). The log's line is written now."""
        self._batch.pair((request.model, request.api, pair_key(request.primary, decision)))
        if self._flush_timer is None:
            self._arm()
        if self._log is not None:
            pair = Pair.between(request.primary, decision)
            self._write_log(request, {"event": "pair", **pair.to_log()}, reference_body=reply)

    def _failed(self, request: ShadowRequest, kind: str) -> None:
        self._inc(self._metrics.errors, request.model, kind, request.api)
        self._write_log(request, {"event": "error", "kind": kind})
        self._count(request.model, {error_field(kind): 1})

    def payload(self, request: ShadowRequest) -> bytes:
        """The reference's request body: the primary's, non-streamed (`stream: false`, no
        `stream_options`), with the reference's model name. When the primary's bytes are at
        hand and need no more than `stream: false` they go as they are, the member appended
        when absent (the JSON `body` encoded with it added, the same members in the same
        order), instead of the whole request encoded again."""
        body, raw, model = request.body, request.raw, self.reference_model
        if (
            raw is not None
            and "stream_options" not in body
            and (model is None or body.get("model") == model)
        ):
            stream = body.get("stream", _ABSENT)
            if stream is False:
                return raw
            end = raw.rstrip()
            if stream is _ABSENT and body and end.endswith(b"}"):
                return end[:-1] + b',"stream":false}'
        copy = dict(body)
        copy["stream"] = False
        copy.pop("stream_options", None)
        if model is not None:
            copy["model"] = model
        return orjson.dumps(copy)

    def _count_pairs(self, batch: _Batch) -> None:
        """Expand the pairs of `batch` into its metric increments and store counts: each distinct
        key once, `pair_counts` of its pair times how many pairs had it — the figures of counting
        every pair alone (the names a full `_Pending` refuses too: a key's names are first met
        where its first pair would have met them)."""
        for (model, api, key), times in batch.pairs.items():
            pair = Pair.of_key(key)
            batch.inc((self._metrics.pairs, model, pair.outcome, api), times)
            for side, decision in ((_PRIMARY, pair.primary), (_REFERENCE, pair.reference)):
                for channel in decision.channels:
                    batch.inc((self._metrics.failures, model, side, channel, api), times)
            fixed, names = pair_counts(pair)
            batch.hold(_pair_key(model, self.reference_name), fixed, names, times)

    def _inc(self, family: Any, model: str, *labels: str) -> None:
        """Add one to `family{model, reference, *labels}` with the next flush (every event that
        counts one also arms the flush timer, through `_count`)."""
        self._batch.inc((family, model, *labels), 1)

    def _child(self, family: Any, model: str, *labels: str) -> Any:
        key = (family, model, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(model, self.reference_name, *labels)
        return child

    def _count(self, model: str, fixed: Mapping[str, int]) -> None:
        """Add one event's store fields to the batch; the first since a flush arms the timer."""
        self._batch.hold(_pair_key(model, self.reference_name), fixed, None, 1)
        if self._flush_timer is None:
            self._arm()

    def _arm(self) -> None:
        self._flush_timer = asyncio.get_running_loop().call_later(FLUSH_SECONDS, self._on_timer)

    def _on_timer(self) -> None:
        self._flush_timer = None
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self.flush())

    async def flush(self) -> None:
        """Write what this process counted to the metrics and the store (one batch per (model,
        reference))."""
        async with self._flushing:
            if self._flush_timer is not None:
                self._flush_timer.cancel()
                self._flush_timer = None
            batch, self._batch = self._batch, _Batch()
            self._count_pairs(batch)
            for labels, by in batch.increments.items():
                self._child(*labels).inc(by)
            for key, counts in batch.store.items():
                try:
                    await self._store.add_counts(
                        INDEX_KEY, {key: counts.fixed.get(PAIRS, 0)}, max_fields=MAX_MODEL_PAIRS
                    )
                    await self._store.add_counts("shadow:" + key, counts.fixed)
                    if counts.names:
                        await self._store.add_counts(
                            "shadow-names:" + key, counts.names, max_fields=MAX_NAMES
                        )
                except SessionStoreError as exc:
                    # The figures in the store miss these events; the metrics and the log have
                    # them. One error per event missed, as if each had been written alone.
                    model = key.rpartition("|")[0]
                    self._child(self._metrics.errors, model, "store", "").inc(counts.events)
                    self._log_events.warning(
                        "shadow_store_failed", error=str(exc), events=counts.events
                    )

    def _write_log(
        self, request: ShadowRequest, event: dict[str, Any], reference_body: Any = None
    ) -> None:
        if self._log is None:
            return
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(self._clock(), UTC).isoformat().replace("+00:00", "Z"),
            "request_id": (
                request.request_id
                if request.request_id is not None
                else structlog.contextvars.get_contextvars().get("request_id")
            ),
            "session": request.session,
            "api": request.api,
            "models": {"primary": request.model, "reference": self.reference_name},
            **event,
        }
        if self.config.log_bodies:
            line["bodies"] = {"primary": request.primary_body, "reference": reference_body}
        self._log.write(line)

    async def stats(self) -> dict[str, Any]:
        """`GET /v1/stats/shadow`: the figures of every (model, reference) pair, from the store."""
        await self.flush()
        index = await self._store.read_counts(INDEX_KEY)
        out = []
        for key in sorted(index):
            model, _, reference = key.rpartition("|")
            fields = await self._store.read_counts("shadow:" + key)
            fields.update(await self._store.read_counts("shadow-names:" + key))
            out.append({"model": model, "reference": reference, **figures(Tally.parse(fields))})
        return {
            "object": "shadow.stats",
            "enabled": True,
            "reference": self.reference_name,
            "sample": self.config.sample,
            "in_flight": self.in_flight,
            "max_in_flight": self.config.max_in_flight,
            "data": out,
        }

    async def drain(self) -> None:
        """Wait for the shadow requests in flight and write their counts to the store (tests,
        benchmarks)."""
        while self._flight:
            waiter = self._drained
            if waiter is None or waiter.done():  # else another caller's, waited on together
                waiter = self._drained = asyncio.get_running_loop().create_future()
            await asyncio.shield(waiter)
        await self.flush()

    async def close(self) -> None:
        """Cancel what is in flight (uncounted), write the last counts, close the reference (and
        with it the tasks it sends from) and the log."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        for request, entry in list(self._flight.items()):
            if entry.job is not None:
                entry.job.cancel()
            self._left(request)
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self.flush()
        await self.reference.close()
        if self._log is not None:
            self._log.close()


class _Job(Protocol):
    """What carries a request in flight: its scheduled start, or the upstream's `Sent`."""

    def cancel(self) -> None: ...


class _InFlight:
    """A shadow request under way: its deadline, and its job (see the module doc's table)."""

    __slots__ = ("deadline", "job")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.job: _Job | None = None


class _Batch:
    """What this process counted since its last flush, added up by what it is written as:

    pairs       (model, api, pair key) -> pairs    expanded at the flush (`_count_pairs`)
    increments  (family, model, *labels) -> n      one `inc` per metric child
    store       "model|reference" -> `_Pending`    three store calls per key
    """

    __slots__ = ("increments", "pairs", "store")

    def __init__(self) -> None:
        self.pairs: dict[tuple[str, str, PairKey], int] = {}
        self.increments: dict[tuple[Any, ...], int] = {}
        self.store: dict[str, _Pending] = {}

    def pair(self, key: tuple[str, str, PairKey]) -> None:
        pairs = self.pairs
        pairs[key] = pairs.get(key, 0) + 1

    def inc(self, key: tuple[Any, ...], by: int) -> None:
        increments = self.increments
        increments[key] = increments.get(key, 0) + by

    def hold(
        self, key: str, fixed: Mapping[str, int], names: Mapping[str, int] | None, times: int
    ) -> None:
        pending = self.store.get(key)
        if pending is None:
            pending = self.store[key] = _Pending()
        pending.add(fixed, names, times)


class _Pending:
    """The counts of one (model, reference) not yet written to the store."""

    __slots__ = ("events", "fixed", "names")

    def __init__(self) -> None:
        self.events = 0
        self.fixed: dict[str, int] = {}
        self.names: dict[str, int] = {}

    def add(self, fixed: Mapping[str, int], names: Mapping[str, int] | None, times: int) -> None:
        """Add `times` events of these fields each."""
        self.events += times
        mine = self.fixed
        for field, count in fixed.items():
            mine[field] = mine.get(field, 0) + count * times
        if names:
            held = self.names
            for field, count in names.items():
                if field in held:
                    held[field] += count * times
                elif len(held) < MAX_NAMES:  # the store keeps no more either
                    held[field] = count * times


def _failure_kind(error: ToolsentryError) -> str:
    """The error kind a reference's failure is counted as."""
    if isinstance(error, UpstreamTimeoutError):
        return "timeout"
    if isinstance(error, UpstreamConnectError):
        return "connect"
    return "upstream"


def _judged(request: ShadowRequest, response: UpstreamResponse) -> tuple[Decision, Any]:
    """The reference's decision and its reply. Raises _ReferenceFailed when it is not an answer."""
    if response.status != 200:
        raise _ReferenceFailed(f"status_{response.status}")
    try:
        reply = response.json()
        return request.judge(reply), reply
    except (UpstreamProtocolError, ToolsentryError, ValueError, TypeError, KeyError) as exc:
        raise _ReferenceFailed("invalid_answer") from exc


class _ReferenceFailed(Exception):
    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def _pair_key(model: str, reference: str) -> str:
    return f"{model}|{reference}"


def open_shadow(
    settings: Settings,
    *,
    metrics: Metrics,
    store: SessionStore,
    environ: Mapping[str, str],
    reference: Upstream | None = None,
    worker_log_suffix: bool = False,
) -> Shadow | None:
    """The shadow the settings ask for, or None when shadowing is off.

    `reference` may be injected (tests); otherwise a dedicated client is built from the named
    upstream's entry. With `worker_log_suffix` (several worker processes) each worker writes its
    own log, `NAME.PID.jsonl`, so that no two processes rotate one file.

    Raises:
        ConfigError: the reference names no upstream, or the log cannot be opened.
    """
    config = settings.shadow
    if not config.enabled:
        return None
    entry = check_shadow(settings) if settings.upstreams else None
    name = config.reference or ""
    if reference is None:
        if entry is None:
            raise ConfigError(f"shadow.reference {name!r} names no configured upstream")
        key = settings.upstream_api_key(entry, dict(environ))
        reference = reference_upstream(entry, config, api_key=key)
    model = entry.models[0] if entry is not None and entry.models else None
    log = None
    if config.log is not None:
        path = config.log
        if worker_log_suffix:
            path = path.with_name(f"{path.stem}.{os.getpid()}{path.suffix or '.jsonl'}")
        log = ShadowLog(path, max_bytes=config.log_max_bytes, backups=config.log_backups)
    return Shadow(
        config,
        reference,
        reference_name=name,
        reference_model=model,
        metrics=metrics,
        store=store,
        log=log,
    )
