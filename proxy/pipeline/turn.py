"""The protocol-neutral turn: one client request from its budget gate to its report (DESIGN §3).

    Pipeline.begin(protocol, body, headers)   session, budget gate, tool errors claimed (gate.py)
      -> Turn.settle(choice)                  validate, local fix, re-ask, on_unrepaired
      -> Turn.commit()                        the counts so far to the session store, before
                                              the client gets what they count
      -> Turn.close(status)                   once: what is left to commit, metrics, the log line
      -> TurnReport                           headers, the stream's summary comment

The drivers (`plain.py`, `stream.py`) only move bytes between the client, the upstream and the
protocol's adapter; every count the turn makes is made here, and `close` runs once whatever
happened (a second call returns the first report). Count, then send: a driver commits before it
sends a settled answer (a held tool call included), so a store that fails there fails the
request (the protocol's error) instead of losing the count of what the client got.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson

from proxy.config import Settings
from proxy.errors import (
    SessionStoreError,
    UnrepairedToolCallError,
    UpstreamBusyError,
    UpstreamError,
    UpstreamStatusError,
)
from proxy.guard.channels import Channel, Violation
from proxy.guard.repair import (
    ConstraintSupport,
    OnUnrepaired,
    ReaskPlan,
    RepairMode,
    StructuredOutputs,
    local_fix,
    plan_reask,
    refuses_constraint,
    strict_forms,
    strip_invalid,
)
from proxy.guard.strict import StrictForm, restore_calls
from proxy.guard.toolcheck import validate
from proxy.guard.unrepaired import UnrepairedPolicy
from proxy.logs import get_logger, log_request
from proxy.metrics import CallOutcome, Metrics, RepairResult, UnknownToolStats
from proxy.pipeline.report import TurnReport
from proxy.protocols.base import Choice, Message, Settled, TurnView, WireProtocol
from proxy.protocols.constrain import Constrain
from proxy.session.budget import ErrorBudget, owned
from proxy.session.stores import SessionRecord, SessionStore, SessionUpdate
from proxy.shadow import Shadow, ShadowRequest, judge_for
from proxy.shadowstats import Decision
from proxy.tracing import CURRENT as CURRENT_TRACE
from proxy.upstream import Upstream, chat_request_headers
from proxy.upstream_response import UpstreamResponse, raise_for_status


@dataclass(slots=True)
class Exchange:
    """One HTTP request to a turn route, as the dispatch sees it. Its log line and its count are
    written once: by its turn's `close` when a turn began (`turn`), else by `Pipeline.refused`.
    `model`: the body's `model` once the body is parsed; `query`: the request's query string as
    sent (Claude Code's `?beta=true`), forwarded with the protocol's upstream requests; `key`:
    the name of the client key that sent it, once checked (None where no keys exist)."""

    api: str
    started: float
    model: object = None
    query: str = ""
    turn: Turn | None = None
    key: str | None = None


class PipelineParts(Protocol):
    """What a turn uses of the pipeline that began it (`proxy.pipeline.gate.Pipeline`), named
    here so that the turn does not import the module that begins it."""

    settings: Settings
    store: SessionStore
    metrics: Metrics
    unknown_tools: UnknownToolStats
    shadow: Shadow | None
    constraints: ConstraintSupport

    def constrainer(self, upstream: str, api: str) -> Constrain | None: ...

    def store_failed(self, exc: SessionStoreError, *, api: str, phase: str) -> None: ...

    def unrepaired_for(self, repair: RepairMode) -> UnrepairedPolicy: ...

    def structured_outputs(self, upstream: str) -> StructuredOutputs: ...


class Turn:
    """One client request from `Pipeline.begin` to `close`, whatever its protocol or driver.

    The drivers read `body`, `view`, `forward` (the client's headers for the upstream) and
    `upstream`, call `send` for non-streamed upstream requests (time spent there is the
    upstream's), `settle` for each choice, `fail` when the upstream failed, `commit` before the
    client gets what was settled, and `close` once.
    """

    __slots__ = (
        "_client_body",
        "_closed",
        "_failed",
        "_first_raw",
        "_found",
        "_outcomes",
        "_pipeline",
        "_query",
        "_repaired",
        "_responses",
        "_shadow_first",
        "_started",
        "_store_error",
        "_stored",
        "_strict_first",
        "_unrepaired",
        "_upstream_failures",
        "body",
        "budget",
        "ending",
        "forward",
        "key",
        "model",
        "protocol",
        "record",
        "repair",
        "session",
        "shadowed",
        "upstream",
        "upstream_seconds",
        "view",
    )

    upstream: Upstream
    record: SessionRecord

    def __init__(
        self,
        pipeline: PipelineParts,
        protocol: WireProtocol,
        body: dict[str, Any],
        view: TurnView,
        headers: Mapping[str, str],
        exchange: Exchange,
        model: str,
        session: str,
        budget: ErrorBudget,
        repair: RepairMode,
    ) -> None:
        self._pipeline = pipeline
        self.protocol = protocol
        self.body = body
        self.view = view
        self._query = exchange.query  # not the exchange: it refers to this turn (no cycle)
        self.model = model
        self.session = session  # as stored: scoped to the client key `key`
        self.key = exchange.key
        self.budget = budget
        self.repair = repair
        self.forward = chat_request_headers(headers)
        self.ending: str | None = None
        self.upstream_seconds = 0.0
        self._started = exchange.started
        self._found: list[Violation] = []
        self._repaired = 0
        self._unrepaired: list[Violation] = []
        # Calls delivered by outcome; a plain dict, as a Counter costs a few µs to create.
        self._outcomes: dict[CallOutcome, int] = {}
        self._failed = False
        self._responses: list[str] = []
        self.shadowed = False
        self._shadow_first: tuple[Decision, Message] | None = None
        self._closed: TurnReport | None = None
        self._client_body = body
        self._first_raw: bytes | None = None
        self._strict_first: Mapping[str, StrictForm] = {}
        # What `commit` has written: lengths of `_found`, `_unrepaired` and `_responses`, then
        # `_repaired` and the upstream failures. Counts past them are not in the store yet.
        self._stored = _Stored()
        self._upstream_failures = 0
        self._store_error: SessionStoreError | None = None

    def mark_strict(self) -> None:
        """`enforce_strict`: declare the client's tools strict (in their strict forms) on the
        first attempt, where the upstream's structured outputs allow it; the client's
        `tool_choice` stays as it is. Tools that cannot be strict stay as declared."""
        constrain = self._pipeline.constrainer(self.upstream.name, self.protocol.api)
        forms = {n: f for n, f in strict_forms(self.view.index).items() if f.convertible}
        if constrain is None or not forms:
            return
        self._strict_first = forms
        self.body = constrain(self._client_body, ReaskPlan(None, "enforce_strict", forms))

    # -- the upstream ---------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The upstream path of this turn's requests: the protocol's, with the client's query."""
        query = self._query
        return f"{self.protocol.path}?{query}" if query else self.protocol.path

    async def send(
        self, body: dict[str, Any] | None, *, raw: bytes | None = None
    ) -> UpstreamResponse:
        """One non-streamed request to the protocol's upstream path: `raw` as it is when given
        (the client's bytes), else `body` encoded. Returns a 2xx/3xx response; raises
        UpstreamError (UpstreamStatusError for an error status), which the caller counts."""
        start = time.perf_counter()
        try:
            response = await self.upstream.request(
                "POST",
                self.path,
                body=raw if raw is not None else orjson.dumps(body),
                headers=self.forward,
            )
            raise_for_status(response, self.upstream.name)
            return response
        finally:
            self.upstream_seconds += time.perf_counter() - start

    def first_payload(self, raw: bytes | None) -> bytes:
        """The first attempt's body: the client's bytes as sent (`raw`, when given), unless the
        turn declared the tools strict (`enforce_strict`)."""
        if raw is not None and self.body is self._client_body:
            self._first_raw = raw  # the shadow sends these bytes too, when they need no change
            return raw
        return orjson.dumps(self.body)

    async def send_first(self, raw: bytes | None = None) -> UpstreamResponse:
        """The turn's first, non-streamed request (see `first_payload`); when the upstream
        refuses the strict tools (`refused_strict`), the client's own request, as sent."""
        try:
            return await self.send(None, raw=self.first_payload(raw))
        except UpstreamStatusError as exc:
            if not self.refused_strict(exc):
                raise
        return await self.send(None, raw=self.first_payload(raw))

    def refused_strict(self, exc: UpstreamStatusError) -> bool:
        """Whether the first attempt's strict tools were refused (`structured_outputs: auto`);
        if so the turn goes back to the client's own body, and the refusal is remembered."""
        if not self._strict_first or not self._refused(exc):
            return False
        self._strict_first = {}
        self.body = self._client_body
        return True

    def _refused(self, exc: UpstreamStatusError) -> bool:
        """Whether `exc` refuses the constrained fields of an upstream whose structured outputs
        are `auto`; the refusal is remembered (the upstream gets plain requests from now on)
        and logged."""
        pipeline, upstream = self._pipeline, self.upstream.name
        said = exc.upstream_body if exc.upstream_body is not None else exc.message
        if pipeline.structured_outputs(upstream) is not StructuredOutputs.AUTO or not (
            refuses_constraint(exc.status, said)
        ):
            return False
        first = pipeline.constraints.refuse(upstream)
        get_logger().warning(
            "structured_outputs_refused",
            upstream=upstream,
            status=exc.status,
            error=exc.message,
            first=first,
        )
        return True

    def fail(self, exc: UpstreamError, *, ends_request: bool = True) -> None:
        """Count an upstream failure (after retries) in the metrics now and in the session at the
        turn's next `commit` (with its other counts: no store round trip of its own).

        A refusal (4xx) is the upstream answering, not failing, and a pool with no connection
        free is the proxy's own back-pressure (the client is told to retry): neither is charged. With
        `ends_request` the client's request fails with it: the report names `upstream_error`
        (for a failure) and the caller closes the turn with the error's status.
        """
        if isinstance(exc, UpstreamStatusError) and exc.status < 500:
            return
        if isinstance(exc, UpstreamBusyError):
            return
        self._upstream_failures += 1  # written by the next `commit`, with the turn's other counts
        self._pipeline.metrics.violations.labels(
            self.model, Channel.UPSTREAM_ERROR.value, self.protocol.api
        ).inc()
        self._failed = self._failed or ends_request

    def answered(self, response_id: str | None) -> None:
        """Note the id of an upstream response of this turn (`Reply.response_id`): `commit` links
        it to the session, so a request continuing from it stays in the session."""
        if response_id is not None:
            self._responses.append(response_id)

    # -- settling a choice ----------------------------------------------------------------------

    async def settle(self, choice: Choice) -> Settled:
        """Validate one choice, repair it by re-asking if allowed, apply `on_unrepaired`.

        Raises UnrepairedToolCallError under `on_unrepaired: reject` (the turn closed with 422).
        """
        view, settings = self.view, self._pipeline.settings
        original, reason = choice.message, choice.finish_reason
        message = restore_calls(original, self._strict_first, view.index)
        found = validate(message, None, view.tool_choice, finish_reason=reason, index=view.index)
        trace = CURRENT_TRACE.get()
        if self.shadowed and self._shadow_first is None and choice.index == 0:
            # The upstream's first answer, decided now: a repair may change the message later.
            self._shadow_first = (Decision.of_message(message, found), message)
        if not found:
            self._tally(CallOutcome.VALID, len(message.get("tool_calls") or ()))
            if trace is not None:
                trace.finish_reason(reason)
            return Settled(choice.index, message, reason, message is not original)

        self._count(found)
        if trace is not None:
            trace.found(found)
        current, remaining = message, found
        usage: list[Mapping[str, Any]] = []
        attempted = False  # a repair tried: a local fix made, or a re-ask sent
        if settings.local_fixes:
            current, fixed = local_fix(current, remaining, view.index)
            if fixed:
                attempted = True
                remaining = validate(
                    current, None, view.tool_choice, finish_reason=reason, index=view.index
                )
                self._count_repairs(fixed, RepairResult.LOCAL_FIX)

        if remaining and self.repair.reasks and settings.max_reasks > 0:
            attempted = True
            current, reason, remaining, usage = await self._reask(current, reason, remaining)

        repaired = not remaining
        if attempted:
            # Without repair (`repair: off`, no re-asks) a violation is counted as a violation
            # only: a repair that was never tried did not fail.
            self._count_repairs(found, RepairResult.SUCCESS if repaired else RepairResult.FAILURE)
        if trace is not None:
            policy = self._pipeline.unrepaired_for(self.repair).strongest(remaining)
            trace.settled(repaired=repaired, decision=_decision(repaired, policy))
            trace.finish_reason(reason)
        if repaired:
            self._repaired += len(found)
            self._tally(CallOutcome.REPAIRED, len(current.get("tool_calls") or ()))
            return Settled(choice.index, current, reason, True, usage)
        settled = Settled(choice.index, current, reason, current is not original, usage)
        return await self._apply_on_unrepaired(settled, remaining, found)

    async def _apply_on_unrepaired(
        self, answer: Settled, remaining: list[Violation], found: list[Violation]
    ) -> Settled:
        """Apply `on_unrepaired` to `answer`, whose `remaining` violations no repair removed
        (`found`: the upstream's first response's), and count what the client gets.

        Raises UnrepairedToolCallError under `on_unrepaired: reject` (the turn closed with 422).
        """
        policy, message = self._pipeline.unrepaired_for(self.repair), answer.message
        if policy.strongest(remaining) is OnUnrepaired.STRIP:
            # The calls of a channel that strips go; what the rest of the message carries, and
            # a failure of the message itself (a call leaked into content, an empty answer, a
            # required call not made: no call to remove), the client gets, and it counts.
            gone = {
                v.call_index
                for v in remaining
                if v.call_index is not None and policy.of(v.channel) is OnUnrepaired.STRIP
            }
            stripped = strip_invalid(message, [v for v in remaining if v.call_index in gone])
            kept = [v for v in remaining if v.call_index not in gone]
            left = len(stripped.get("tool_calls") or ())
            passed = len({v.call_index for v in kept} - {None})
            self._tally(CallOutcome.STRIPPED, len(remaining) - len(kept))
            self._tally(CallOutcome.INVALID, passed)
            self._tally(CallOutcome.VALID, left - passed)
            reason = answer.finish_reason
            if reason == "tool_calls" and not left:
                reason = "stop"
            # A stripped call is a failure the agent experienced (the call it was to make is
            # lost): it costs its error like one passed through, so a default that strips an
            # undeclared tool's call leaves the budget's arithmetic as it was.
            self._unrepaired.extend(remaining)
            self._count(beyond(remaining, found))
            return replace(answer, message=stripped, finish_reason=reason, changed=True)
        self._unrepaired.extend(remaining)
        # What the client gets is reported and counted in its channels, also where a re-ask
        # failed otherwise than the original response did.
        self._count(beyond(remaining, found))
        bad = {v.call_index for v in remaining}
        calls = message.get("tool_calls") or []
        self._tally(CallOutcome.INVALID, sum(1 for i in range(len(calls)) if i in bad))
        self._tally(CallOutcome.VALID, sum(1 for i in range(len(calls)) if i not in bad))
        if policy.strongest(remaining) is OnUnrepaired.REJECT:
            await self.commit()  # the 422 names the failure: counted before it goes out
            report = await self.close(UnrepairedToolCallError.status_code)
            raise UnrepairedToolCallError(
                "the model's tool call could not be repaired: "
                + "; ".join(v.message for v in remaining),
                code=remaining[0].channel.value,
                headers=report.headers(),
            )
        return answer

    async def _reask(
        self, message: Message, reason: str | None, violations: list[Violation]
    ) -> tuple[Message, str | None, list[Violation], list[Mapping[str, Any]]]:
        """Re-ask up to max_reasks times; return the last message, its finish, its violations
        and the re-asks' usages."""
        view, protocol = self.view, self.protocol
        request = self.body
        usages: list[Mapping[str, Any]] = []
        trace = CURRENT_TRACE.get()
        for _ in range(self._pipeline.settings.max_reasks):
            request = protocol.reask(request, message, violations, view.index)
            if trace is not None:
                trace.attempt_kind("reask")
            # A failed re-ask leaves the failure it was to repair in place; the request goes on.
            try:
                response, forms = await self._send_reask(request, message, violations)
                reply = protocol.read(response.json(), self.upstream.name)
                self.answered(reply.response_id)
                if trace is not None:
                    trace.answered(reply.body)
            except UpstreamError as exc:
                self.fail(exc, ends_request=False)
                get_logger().warning(
                    "reask_failed", session=self.session, model=self.model, error=exc.message
                )
                break
            usage = reply.body.get("usage")
            if isinstance(usage, dict):
                usages.append(usage)
            if not reply.choices:
                break
            message, reason = reply.choices[0].message, reply.choices[0].finish_reason
            message = restore_calls(message, forms, view.index)
            violations = validate(
                message, None, view.tool_choice, finish_reason=reason, index=view.index
            )
            if trace is not None:
                trace.found(violations)
            if not violations:
                break
        return message, reason, violations, usages

    async def _send_reask(
        self, request: dict[str, Any], message: Message, violations: Sequence[Violation]
    ) -> tuple[UpstreamResponse, Mapping[str, StrictForm]]:
        """Send one re-ask: under `constrain`, as `plan_reask` plans it in the protocol's form,
        and plainly where the upstream refuses that (counted as a `fallback` per violation).
        Returns the response and the strict forms its answer was decoded under."""
        constrain = (
            self._pipeline.constrainer(self.upstream.name, self.protocol.api)
            if self.repair is RepairMode.CONSTRAIN
            else None
        )
        if constrain is None:
            return await self.send(request), self._strict_first
        plan = plan_reask(message, violations, self.view.index, self.view.tool_choice)
        get_logger().debug("reask_constrained", upstream=self.upstream.name, **plan.to_dict())
        try:
            response = await self.send(constrain(request, plan))
            return response, {**self._strict_first, **plan.strict}
        except UpstreamStatusError as exc:
            if not self._refused(exc):
                raise
        self._count_repairs(violations, RepairResult.FALLBACK)
        trace = CURRENT_TRACE.get()
        if trace is not None:
            trace.attempt_kind("fallback")
        return await self.send(request), self._strict_first

    def _tally(self, outcome: CallOutcome, calls: int) -> None:
        self._outcomes[outcome] = self._outcomes.get(outcome, 0) + calls

    def _count_repairs(self, violations: Sequence[Violation], result: RepairResult) -> None:
        repairs, api = self._pipeline.metrics.repairs, self.protocol.api
        for violation in violations:
            repairs.labels(self.model, violation.channel.value, result, api).inc()

    def _count(self, violations: Sequence[Violation]) -> None:
        self._found.extend(violations)
        metrics, api = self._pipeline.metrics, self.protocol.api
        for violation in violations:
            metrics.violations.labels(self.model, violation.channel.value, api).inc()
            if violation.channel is Channel.UNKNOWN_TOOL and violation.tool_name is not None:
                self._pipeline.unknown_tools.add(self.model, violation.tool_name)
            if violation.format is not None:
                where = "reasoning" if violation.in_reasoning else "content"
                metrics.leaked_calls.labels(self.model, violation.format, where, api).inc()
                self._pipeline.unknown_tools.add_leak(self.model, violation.format)

    # -- the report -----------------------------------------------------------------------------

    @property
    def shown_session(self) -> str:
        """The session id as its client knows it (in headers, summaries and the log line)."""
        return owned(self.key, self.session) or self.session

    def report(self) -> TurnReport:
        """The turn's report as it stands now (the closed one, once closed)."""
        if self._closed is not None:
            return self._closed
        return self._report(200, final=False)

    def _report(self, status: int, *, final: bool) -> TurnReport:
        violations: tuple[str, ...] = ()
        if self._found or self._failed:
            channels = dict.fromkeys(v.channel.value for v in self._found)
            if self._failed:
                channels[Channel.UPSTREAM_ERROR.value] = None
            violations = tuple(channels)
        return TurnReport(
            self.protocol.api,
            self.model,
            self.shown_session,
            self.record.errors,
            self.budget.max_errors,
            self._repaired,
            violations,
            status,
            final,
        )

    @property
    def closed(self) -> bool:
        """Whether `close` has run."""
        return self._closed is not None

    async def commit(self) -> None:
        """Write to the session store what this turn counted and has not written yet: the
        violations found, the repairs, the failures its client gets (their call ids claimed, so
        that a later tool error for one is not counted again), the upstream's failures, and the
        links of its response ids. Nothing to write, no round trip.

        Count, then send: a driver commits before the client gets what the counts are about.

        Raises:
            SessionStoreError: the store failed (now or at an earlier commit of this turn,
                which is not tried again); counted and logged once.
        """
        if self._store_error is not None:
            raise self._store_error
        stored = self._stored
        if (  # the common case, nothing new, decided without building anything
            len(self._found) == stored.found
            and len(self._responses) == stored.responses
            and self._repaired == stored.repaired
            and self._upstream_failures == stored.failures
            and len(self._unrepaired) == stored.unrepaired
        ):
            return
        found, unrepaired = self._found[stored.found :], self._unrepaired[stored.unrepaired :]
        repairs = self._repaired - stored.repaired
        failures = self._upstream_failures - stored.failures
        links = self._responses[stored.responses :]
        pipeline, now = self._pipeline, time.time()
        try:
            if found or unrepaired or repairs or failures:
                channels = Counter(v.channel.value for v in found)
                if failures:
                    channels[Channel.UPSTREAM_ERROR.value] += failures
                # One round trip: the counts, the delivered failures' call ids claimed (a later
                # tool error for one must not count again), the responses' links.
                update = SessionUpdate(
                    self.budget.max_errors,
                    errors=len(unrepaired),
                    repairs=repairs,
                    channels=channels,
                    claims=[v.call_id for v in unrepaired if v.call_id],
                    responses=links,
                )
                self.record = (await pipeline.store.apply(self.session, update, now=now)).record
            else:
                for response_id in links:
                    await pipeline.store.link_response(response_id, self.session, now=now)
        except SessionStoreError as exc:
            self._store_error = exc
            pipeline.store_failed(exc, api=self.protocol.api, phase="count")
            raise
        if self.budget.spent_by(self.record.errors, len(unrepaired)):
            pipeline.metrics.budget_exhausted.labels(self.model, self.protocol.api).inc()
        self._stored = _Stored(
            len(self._found),
            len(self._unrepaired),
            self._repaired,
            self._upstream_failures,
            len(self._responses),
        )

    async def close(self, status: int) -> TurnReport:
        """Commit what is left (see `commit`), account the turn in the metrics, write its log
        line, and return its final report. Runs once; a later call returns the first report.

        `status` is the request's as counted: the HTTP status, 499 for a client gone mid-stream,
        an error's status for a stream that ended in one. A store that fails here does not
        raise: the request counts as failed by it (503, unless it failed otherwise already),
        and its log line says so.
        """
        if self._closed is not None:
            return self._closed
        pipeline = self._pipeline
        if self._store_error is None:
            # A bare try, not contextlib.suppress: free on 3.11, where suppress() builds a
            # context manager for every request.
            try:  # noqa: SIM105
                await self.commit()
            except SessionStoreError:
                pass  # counted and logged by commit; said in the report and the log line below
        if self._store_error is not None and status < 400:
            status = SessionStoreError.status_code
        report = self._closed = self._report(status, final=True)
        series = pipeline.metrics.for_model(self.model, self.protocol.api)
        for outcome, count in self._outcomes.items():
            series.tool_calls(outcome).inc(count)
        series.requests(str(status)).inc()
        if self.key is not None:
            pipeline.metrics.for_key(self.key, str(status)).inc()
        total = time.perf_counter() - self._started
        series.upstream_seconds.observe(self.upstream_seconds)
        series.overhead_seconds.observe(max(0.0, total - self.upstream_seconds))
        fields = {
            "api": self.protocol.api,
            "model": self.view.model if isinstance(self.view.model, str) else None,
            **report.log_fields(),
            "stream": self.view.stream or None,
            "latency_ms": round(total * 1000, 3),
        }
        if self.key is not None:
            fields["key"] = self.key  # the key's name, never the key
        if self._store_error is not None:
            fields["error"] = SessionStoreError.error_type
        if pipeline.settings.log_bodies:
            fields["body"] = self.body
        log_request(fields)
        # Whatever the client got (a repair, a 422 of on_unrepaired: reject, a stream it left),
        # the model answered once: that first answer is compared.
        if self._shadow_first is not None and pipeline.shadow is not None:
            pipeline.shadow.submit(self._shadow_request(pipeline.shadow, *self._shadow_first))
        return report

    def _shadow_request(self, shadow: Shadow, primary: Decision, message: Message) -> ShadowRequest:
        """What the shadow sends the reference: this turn's request as its first attempt sent
        it, and the primary's first answer, decided."""
        return ShadowRequest(
            model=self.model,
            session=self.session,
            api=self.protocol.api,
            path=self.protocol.path,
            body=self.body,
            raw=self._first_raw if self.body is self._client_body else None,
            headers=self.forward,
            primary=primary,
            judge=judge_for(self.protocol, self.view, shadow.reference_name),
            primary_body=message,
        )


@dataclass(slots=True)
class _Stored:
    """How much of a turn's counts `Turn.commit` has written: lengths of its violations found,
    of the failures its client gets, its repairs, its upstream failures, its response ids."""

    found: int = 0
    unrepaired: int = 0
    repaired: int = 0
    failures: int = 0
    responses: int = 0


def _decision(repaired: bool, policy: OnUnrepaired) -> str:
    """What the guard did with a failed answer, in the security conventions' words."""
    if repaired or policy is OnUnrepaired.STRIP:
        return "modify"
    return "deny" if policy is OnUnrepaired.REJECT else "warn"


def beyond(delivered: list[Violation], found: list[Violation]) -> list[Violation]:
    """The violations of `delivered` that `found` has no counterpart for, channel by channel.

    A turn counts, per channel, the larger of what the upstream's first response had and what
    the client finally got: a failure repeated on every re-ask is one failure, a different one
    is another. Returns the delivered violations in excess, in order.
    """
    spare = Counter(v.channel for v in found)
    extra = []
    for violation in delivered:
        if spare[violation.channel]:
            spare[violation.channel] -= 1
        else:
            extra.append(violation)
    return extra
