"""Shadow comparison (DESIGN §11): a sample of sessions is answered by a reference upstream too,
in the background, and both answers' tool decisions are compared and counted.

The turn hands a `ShadowRequest` to `Shadow.submit` once the client's answer is settled; nothing
here can delay or change that answer. `submit` never awaits: it starts one background task, or,
with `max_in_flight` tasks already running, drops the pair and counts the drop. A request the
reference could not be asked as is — a Responses turn that continues a response or conversation
stored at the primary's upstream (`shadowstats.skip_reason`) — is not sent: it is counted as
skipped, with its reason (the proxy keeps no copy of the stored context to rebuild it from, and
the reference's own earlier answer would not be the same context). The reference is
asked once (no retries), within `timeout`; a slow or failing reference is counted by kind. Each
pair is counted three ways — Prometheus (`toolsentry_shadow_*`), the session store (the figures
`GET /v1/stats/shadow` shows, the same from every worker and replica) and, when configured, the
shadow log (JSONL, written by a thread of its own, rotated by size).

Counts in the store, per (model, reference):
    shadow:index                      field "{model}|{reference}" -> pairs (which pairs exist)
    shadow:{model}|{reference}        the bounded fields of `shadowstats.pair_counts`, drops,
                                      errors, skips
    shadow-names:{model}|{reference}  signatures and argument keys, capped at `MAX_NAMES` fields
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import logging.handlers
import os
import queue
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import orjson

from proxy.config import Settings, ShadowConfig, UpstreamConfig
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
from proxy.shadowstats import (
    DROPPED,
    PAIRS,
    Decision,
    Pair,
    Side,
    Tally,
    error_field,
    figures,
    is_sampled,
    pair_counts,
    skip_field,
    skip_reason,
)
from proxy.tracing import CURRENT as CURRENT_TRACE
from proxy.upstream import AiohttpUpstream, Upstream

MAX_NAMES: Final = 2000
MAX_MODEL_PAIRS: Final = 64
INDEX_KEY: Final = "shadow:index"
_LOG_QUEUE: Final = 10_000

Judge = Callable[[Any], Decision]
"""The reference's reply (parsed JSON) → its decision: the protocol's adapter and the guard,
against the same request as the primary's answer. Raises ToolsentryError (or ValueError) when
the reply is not an answer of the protocol."""


@dataclass(frozen=True, slots=True)
class ShadowRequest:
    """What the turn hands over once the client's answer is settled.

    `body` is the request as the primary's first attempt sent it and `headers` the headers it
    forwarded; the shadow sends it non-streamed with the reference's model name. `primary` is
    the decision of the primary's first answer (before any repair). `judge` reads the
    reference's reply. `bodies` are written to the log only with `log_bodies`.
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
) -> AiohttpUpstream:
    """A client of its own for the reference: its own connection pool (never the hot path's),
    the shadow's timeout, no retries."""
    dedicated = reference.model_copy(
        update={"timeout": config.timeout, "max_connections": config.max_in_flight}
    )
    return AiohttpUpstream(dedicated, api_key=api_key, retries=0)


class ShadowLog:
    """The shadow log: JSONL, one line per event, written by a thread of its own (stdlib
    logging's queue listener) so the event loop never waits on the disk; rotated by size into
    `path.1`, `path.2`, …. A full queue (a disk that cannot keep up) loses the line and counts it.
    """

    def __init__(self, path: Path, *, max_bytes: int, backups: int) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._handler = logging.handlers.RotatingFileHandler(
                path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=True
            )
        except OSError as exc:
            raise ConfigError(f"cannot open shadow log {str(path)!r}: {exc}") from exc
        self.path = path
        self.lost = 0
        self._queue: queue.Queue[logging.LogRecord] = queue.Queue(_LOG_QUEUE)
        self._listener = logging.handlers.QueueListener(self._queue, self._handler)
        self._listener.start()

    def write(self, line: Mapping[str, Any]) -> None:
        """Queue one line; never blocks."""
        record = logging.makeLogRecord({"msg": orjson.dumps(line).decode(), "args": None})
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.lost += 1

    def close(self) -> None:
        """Write what is queued and close the file."""
        self._listener.stop()
        self._handler.close()


class Shadow:
    """Mirrors sampled requests to the reference and counts the pairs (see the module doc)."""

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
        self._tasks: set[asyncio.Task[None]] = set()
        # Drops and skips are counted in the hot path, which must not await the store: a skip
        # starts a write of its own when there is room, else (and a drop always) they go to
        # the store with the next write (one is in flight when there is no room).
        self._unsent: dict[str, Counter[str]] = {}
        self._log_events = get_logger()

    @property
    def log_path(self) -> Path | None:
        """Where this process writes the shadow log (None: no log)."""
        return None if self._log is None else self._log.path

    @property
    def in_flight(self) -> int:
        """Shadow requests running now."""
        return len(self._tasks)

    def wants(self, model: str, session: str) -> bool:
        """Whether a request of `model` in `session` is shadowed (model filter, session sample)."""
        if self._models and model not in self._models:
            return False
        return is_sampled(session, seed=self.config.seed, rate=self.config.sample)

    def submit(self, request: ShadowRequest) -> bool:
        """Start the shadow request in the background; False when it was skipped or dropped
        (either counted)."""
        reason = skip_reason(request.api, request.body)
        full = len(self._tasks) >= self.config.max_in_flight
        if reason is not None:
            self._metrics.skipped.labels(
                request.model, self.reference_name, reason.value, request.api
            ).inc()
            self._write_log(request, {"event": "skipped", "reason": reason.value})
            self._unsend(request.model, skip_field(reason))
            if not full:
                self._start(self._count(request, {}, {}))
            return False
        if full:
            self._metrics.dropped.labels(request.model, self.reference_name, request.api).inc()
            self._unsend(request.model, DROPPED)
            self._write_log(request, {"event": "dropped"})
            return False
        context = contextvars.copy_context()
        trace = context.run(CURRENT_TRACE.get)
        if trace is not None:  # its try is a span of its own kind under the request's
            context.run(CURRENT_TRACE.set, trace.beside("shadow"))
        self._start(self._run(request), context)
        return True

    def _unsend(self, model: str, field: str) -> None:
        self._unsent.setdefault(model, Counter())[field] += 1

    def _start(
        self, work: Coroutine[Any, Any, None], context: contextvars.Context | None = None
    ) -> None:
        task = asyncio.get_running_loop().create_task(work, context=context)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, request: ShadowRequest) -> None:
        try:
            decision, reply = await self._ask_reference(request)
        except _ReferenceFailed as failed:
            self._metrics.errors.labels(
                request.model, self.reference_name, failed.kind, request.api
            ).inc()
            self._write_log(request, {"event": "error", "kind": failed.kind})
            await self._count(request, {error_field(failed.kind): 1}, {})
            return
        pair = Pair.between(request.primary, decision)
        self._count_metrics(request, pair)
        fixed, names = pair_counts(pair)
        self._write_log(request, {"event": "pair", **pair.to_log()}, reference_body=reply)
        await self._count(request, fixed, names)

    async def _ask_reference(self, request: ShadowRequest) -> tuple[Decision, Any]:
        body = dict(request.body)
        body["stream"] = False
        body.pop("stream_options", None)
        if self.reference_model is not None:
            body["model"] = self.reference_model
        try:
            async with asyncio.timeout(self.config.timeout):
                response = await self.reference.request(
                    "POST", request.path, body=orjson.dumps(body), headers=request.headers
                )
        except (TimeoutError, UpstreamTimeoutError) as exc:
            raise _ReferenceFailed("timeout") from exc
        except UpstreamConnectError as exc:
            raise _ReferenceFailed("connect") from exc
        except ToolsentryError as exc:
            raise _ReferenceFailed("upstream") from exc
        if response.status != 200:
            raise _ReferenceFailed(f"status_{response.status}")
        try:
            reply = response.json()
            return request.judge(reply), reply
        except (UpstreamProtocolError, ToolsentryError, ValueError, TypeError, KeyError) as exc:
            raise _ReferenceFailed("invalid_answer") from exc

    def _count_metrics(self, request: ShadowRequest, pair: Pair) -> None:
        m, ref, api = request.model, self.reference_name, request.api
        self._metrics.pairs.labels(m, ref, pair.outcome.value, api).inc()
        for side in Side:
            for channel in pair.side(side).channels:
                self._metrics.failures.labels(m, ref, side.value, channel, api).inc()

    async def _count(
        self,
        request: ShadowRequest | None,
        fixed: dict[str, int],
        names: dict[str, int],
        *,
        model: str = "",
    ) -> None:
        model = request.model if request is not None else model
        key = _pair_key(model, self.reference_name)
        unsent = self._unsent.pop(model, None)
        if unsent:
            fixed = dict(Counter(fixed) + unsent)
        try:
            await self._store.add_counts(
                INDEX_KEY, {key: fixed.get(PAIRS, 0)}, max_fields=MAX_MODEL_PAIRS
            )
            await self._store.add_counts("shadow:" + key, fixed)
            if names:
                await self._store.add_counts("shadow-names:" + key, names, max_fields=MAX_NAMES)
        except SessionStoreError as exc:
            # The figures in the store miss this pair; the metrics and the log have it.
            api = request.api if request is not None else ""
            self._metrics.errors.labels(model, self.reference_name, "store", api).inc()
            self._log_events.warning("shadow_store_failed", error=str(exc))

    def _write_log(
        self, request: ShadowRequest, event: dict[str, Any], reference_body: Any = None
    ) -> None:
        if self._log is None:
            return
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(self._clock(), UTC).isoformat().replace("+00:00", "Z"),
            "request_id": request.request_id,
            "session": request.session,
            "api": request.api,
            "models": {"primary": request.model, "reference": self.reference_name},
            **event,
        }
        if self.config.log_bodies:
            line["bodies"] = {"primary": request.primary_body, "reference": reference_body}
        self._log.write(line)

    async def flush_drops(self) -> None:
        """Send the drops and skips counted since the last store write to the store."""
        for model in list(self._unsent):
            await self._count(None, {}, {}, model=model)

    async def stats(self) -> dict[str, Any]:
        """`GET /v1/stats/shadow`: the figures of every (model, reference) pair, from the store."""
        await self.flush_drops()
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
        """Wait for the shadow requests in flight (tests, benchmarks)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Cancel what is in flight, send the last drops, close the reference and the log."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)
        with contextlib.suppress(SessionStoreError):
            await self.flush_drops()
        await self.reference.close()
        if self._log is not None:
            self._log.close()


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
