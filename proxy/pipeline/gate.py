"""The pipeline every turn of one app passes through: the parts its turns share (settings,
upstreams, the session store, the metrics) and the gate where a turn begins (session, the
client's overrides, tool errors claimed, the budget) or a request is counted as refused.

    Pipeline.begin(protocol, body, headers, exchange) -> Turn   (proxy/pipeline/turn.py)
    Pipeline.refused(exchange, status, error)                   a request no turn began for
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from proxy.config import Settings
from proxy.errors import EXHAUSTION_STATUS, BadRequestError, BudgetExhaustedError, SessionStoreError
from proxy.guard.channels import Channel
from proxy.guard.dialect import SchemaFallback
from proxy.guard.repair import ConstraintSupport, OnUnrepaired, RepairMode, StructuredOutputs
from proxy.guard.tool_errors import ToolErrorTable, identify_client
from proxy.guard.toolcheck import GuardLimits, ToolIndex, configure_cache
from proxy.guard.unrepaired import UnrepairedPolicy
from proxy.headers import MAX_ERRORS_HEADER, REPAIR_HEADER
from proxy.logs import get_logger, log_request
from proxy.metrics import Metrics, ModelLabels, UnknownToolStats
from proxy.pipeline.turn import Exchange, Turn
from proxy.protocols.base import TurnView, WireProtocol
from proxy.protocols.constrain import FOR_API, Constrain
from proxy.session.budget import ErrorBudget, ExhaustionPolicy, SessionHints, named_session
from proxy.session.stores import SessionRecord, SessionStore, SessionUpdate
from proxy.session.tracking import unnamed_session
from proxy.shadow import Shadow
from proxy.tracing import Tracing
from proxy.upstream_router import Router


class Pipeline:
    """What every turn of one app shares: settings, upstreams, the session store, the metrics."""

    def __init__(
        self,
        settings: Settings,
        router: Router,
        store: SessionStore,
        metrics: Metrics,
        unknown_tools: UnknownToolStats,
        tracing: Tracing | None = None,
    ) -> None:
        self.settings = settings
        self.tracing = tracing
        self.router = router
        self.store = store
        self.metrics = metrics
        self.unknown_tools = unknown_tools
        self.limits = GuardLimits(
            max_tools=settings.max_tools,
            max_schema_bytes=settings.max_schema_bytes,
            max_schema_depth=settings.max_schema_depth,
            max_tools_bytes=settings.max_tools_bytes,
            schema_dialect=settings.schema_dialect,
        )
        configure_cache(settings.tool_cache_bytes)
        self._session_headers = tuple(name.lower() for name in settings.session_headers)
        # Set by the app when shadow comparison is on (proxy/shadow.py).
        self.shadow: Shadow | None = None
        self.constraints = ConstraintSupport()
        self._structured_outputs = {u.name: u.structured_outputs for u in settings.upstreams}
        self._model_labels = ModelLabels(m for u in settings.upstreams for m in u.models)
        self.tool_errors = ToolErrorTable(
            settings.tool_error_prefix, [p.compiled() for p in settings.tool_errors]
        )
        # The budget of a request that overrides none (frozen, so every such turn shares it).
        self._budget = ErrorBudget(settings.max_errors, settings.exhaustion_policy)
        status = settings.exhaustion_status
        self._exhaustion_status: dict[str, int] = (
            dict.fromkeys(EXHAUSTION_STATUS, status)
            if isinstance(status, int)
            else {**EXHAUSTION_STATUS, **{api.value: n for api, n in status.items()}}
        )
        self.unrepaired = UnrepairedPolicy.read(settings.on_unrepaired)
        # `repair: off` validates and counts only: no call is changed unless the operator set
        # on_unrepaired (the default strips undeclared tools only where repair was tried).
        self._unrepaired_off = (
            self.unrepaired
            if "on_unrepaired" in settings.model_fields_set
            else UnrepairedPolicy.read(OnUnrepaired.PASSTHROUGH.value)
        )

    async def begin(
        self,
        protocol: WireProtocol,
        body: dict[str, Any],
        headers: Mapping[str, str],
        exchange: Exchange,
        *,
        index: ToolIndex | None = None,
    ) -> Turn:
        """Check the request, count the tool errors it reports, and apply the budget gate.

        `headers`: the client's, keyed by lower-case names; `index`: the body's tools compiled,
        when known. Returns the Turn; under the `finish` policy of a spent budget it is already
        closed and `ending` holds the text to answer with.

        Raises BadRequestError, NotFoundError (no upstream serves the model) and, under the
        `reject` policy of a spent budget, BudgetExhaustedError (the turn closed with the
        protocol's `exhaustion_status`).
        """
        view = protocol.view(body, index)
        model = self.model_label(view.model)
        if view.index.fallbacks:
            self._report_fallbacks(model, view.index.fallbacks)
        upstream = self.router.pick(view.model)
        previous = view.hints.previous_response_id
        chained = await self.store.session_of_response(previous) if previous else None
        session = named_session(
            headers,
            view.hints,
            header_names=self._session_headers,
            chained=chained,
            owner=exchange.key,
        )
        if session is None:
            session = await self._unnamed_session(body, view.hints, exchange.key)
        budget, repair = self._overrides(headers)
        record, tool_errors = await self._count_request(session, budget, view, headers, protocol)
        if tool_errors:
            self.metrics.violations.labels(model, Channel.TOOL_ERROR.value, protocol.api).inc(
                tool_errors
            )
            if budget.spent_by(record.errors, tool_errors):
                self.metrics.budget_exhausted.labels(model, protocol.api).inc()
        turn = Turn(self, protocol, body, view, headers, exchange, model, session, budget, repair)
        turn.upstream = upstream
        turn.record = record
        turn.shadowed = self.shadow is not None and self.shadow.wants(
            model, session, upstream=upstream.name
        )
        exchange.turn = turn
        if budget.exhausted(record.errors) and budget.policy is not ExhaustionPolicy.OBSERVE:
            self.metrics.budget_refusals.labels(model, protocol.api).inc()
            text = exhausted_text(
                turn.shown_session, record.errors, budget.max_errors, record.channels
            )
            if budget.policy is ExhaustionPolicy.REJECT:
                status = self._exhaustion_status[protocol.api]
                report = await turn.close(status)
                raise BudgetExhaustedError(
                    text, status=status, code="error_budget_exhausted", headers=report.headers()
                )
            turn.ending = text
            await turn.close(200)
        elif self.settings.enforce_strict:
            turn.mark_strict()
        return turn

    def constrainer(self, upstream: str, api: str) -> Constrain | None:
        """How to write a constrained request of protocol `api` for `upstream`; None where its
        `structured_outputs` are off, it refused them (`auto`), or the protocol has no such form."""
        constrain = FOR_API.get(api)
        if constrain is None or not self.constraints.allows(
            upstream, self.structured_outputs(upstream)
        ):
            return None
        return constrain

    def structured_outputs(self, upstream: str) -> StructuredOutputs:
        """The configured `structured_outputs` of the upstream named `upstream`."""
        return self._structured_outputs.get(upstream, StructuredOutputs.AUTO)

    def unrepaired_for(self, repair: RepairMode) -> UnrepairedPolicy:
        """`on_unrepaired` as it applies to a turn under `repair`: with repair off, what the
        operator set, else every call passed on (validated and counted only)."""
        return self._unrepaired_off if repair is RepairMode.OFF else self.unrepaired

    def store_failed(self, exc: SessionStoreError, *, api: str, phase: str) -> None:
        """Count and log a session store failure of a request of protocol `api` (its phase:
        `begin`, `count`); the request's own log line follows when it ends."""
        self.metrics.session_store_errors.labels(phase, api).inc()
        get_logger().error("session_store_failed", api=api, phase=phase, error=exc.message)

    def model_label(self, model: object) -> str:
        """The `model` label of a request's metrics, bounded (see ModelLabels)."""
        return self._model_labels(model)

    def refused(self, exchange: Exchange, status: int, error: str) -> None:
        """Count and log a request refused before its turn began (400, 401, 404, 413, …)."""
        model = exchange.model
        label = self.model_label(model)
        self.metrics.for_model(label, exchange.api).requests(str(status)).inc()
        if exchange.key is not None:
            self.metrics.for_key(exchange.key, str(status)).inc()
        log_request(
            {
                "api": exchange.api,
                "model": model if isinstance(model, str) else None,
                "status": status,
                "error": error,
                "latency_ms": round((time.perf_counter() - exchange.started) * 1000, 3),
            }
        )

    def _report_fallbacks(self, model: str, fallbacks: tuple[SchemaFallback, ...]) -> None:
        """Say that this request's tools are checked only in part: counted per reason, in the
        statistics, and logged once per tool list."""
        if self.metrics.count_schema_fallbacks(model, fallbacks):
            get_logger().warning(
                "schema_fallback",
                model=model,
                tools=[
                    {"tool": f.tool, "reason": f.reason.value, "detail": f.detail}
                    for f in fallbacks
                ],
            )

    async def _unnamed_session(
        self, body: dict[str, Any], hints: SessionHints, owner: str | None
    ) -> str:
        """The session of a request that names none: the conversation its history continues,
        found in one store round trip (`proxy.session.tracking`); raises SessionStoreError."""
        tracking = self.settings.session_tracking
        return await unnamed_session(
            self.store, body, hints, owner=owner, tracking=tracking, now=time.time()
        )

    async def _count_request(
        self,
        session: str,
        budget: ErrorBudget,
        view: TurnView,
        headers: Mapping[str, str],
        protocol: WireProtocol,
    ) -> tuple[SessionRecord, int]:
        """Count the request in its session, in one atomic step (one round trip): the tool
        errors it reports claimed by their call ids, the fresh ones counted. Returns the record
        after it and how many tool errors were fresh."""
        claimed = self._tool_error_ids(view, headers, protocol.api)
        if not claimed:  # the common request: counted as `apply` would, without building one
            record = await self.store.record(
                session, max_errors=budget.max_errors, requests=1, now=time.time()
            )
            return record, 0
        update = SessionUpdate(
            budget.max_errors,
            requests=1,
            claims=claimed,
            claimed_channel=Channel.TOOL_ERROR.value,
        )
        record, fresh = await self.store.apply(session, update, now=time.time())
        return record, len(fresh)

    def _tool_error_ids(self, view: TurnView, headers: Mapping[str, str], api: str) -> list[str]:
        """The call ids of the tool results this request reports as failed, in order, once each."""
        if not view.tool_results:
            return []
        failed = self.tool_errors.judge(identify_client(headers), api)
        ids: dict[str, None] = {}
        for result in view.tool_results:
            if result.call_id and failed(result.text, result.is_error):
                ids[result.call_id] = None
        return list(ids)

    def _overrides(self, headers: Mapping[str, str]) -> tuple[ErrorBudget, RepairMode]:
        max_errors = self.settings.max_errors
        repair = self.settings.repair
        if self.settings.allow_overrides:
            raw = headers.get(MAX_ERRORS_HEADER)
            if raw is not None:
                try:
                    asked = int(raw)
                except ValueError:
                    raise BadRequestError(
                        f"{MAX_ERRORS_HEADER} must be an integer, got {raw!r}",
                        param=MAX_ERRORS_HEADER,
                    ) from None
                if asked < 1:
                    raise BadRequestError(
                        f"{MAX_ERRORS_HEADER} must be at least 1",
                        param=MAX_ERRORS_HEADER,
                    )
                max_errors = min(max_errors, asked)
            mode = headers.get(REPAIR_HEADER)
            if mode is not None:
                try:
                    repair = RepairMode(mode.strip().lower())
                except ValueError:
                    valid = ", ".join(m.value for m in RepairMode)
                    raise BadRequestError(
                        f"{REPAIR_HEADER} must be one of {valid}, got {mode!r}",
                        param=REPAIR_HEADER,
                    ) from None
        budget, policy = self._budget, self.settings.exhaustion_policy
        if max_errors == budget.max_errors and policy is budget.policy:
            return budget, repair
        return ErrorBudget(max_errors, policy), repair


def exhausted_text(session: str, errors: int, max_errors: int, channels: Mapping[str, int]) -> str:
    """What a request of a spent session is told: the errors against the budget, and the
    session's failures by channel (repaired ones included) so the reader learns what spent it."""
    seen = ", ".join(f"{n} {channel}" for channel, n in sorted(channels.items()) if n)
    return (
        f"session '{session}' has used its error budget: {errors} errors of {max_errors} allowed"
        + (f" (failures by channel, repaired ones included: {seen})" if seen else "")
    )
