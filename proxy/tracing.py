"""OpenTelemetry traces of every turn, upstream attempt and violation (DESIGN §9).

Followed: the OpenTelemetry semantic conventions for generative AI, `SEMCONV_VERSION` (still in
development; the proxy always emits the latest experimental names, as the stability variable
`OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental` asks of instrumentations), with the
`apply_guardrail` span of their security section for each violation. No convention has a word
for an invalid tool call, so the channel and its details go in attributes of our own namespace,
`toolsentry.*`.

Shape of a request's trace:

    SERVER  "chat MODEL"               one per request, continues the client's `traceparent`
      CLIENT  "chat MODEL"             one per upstream HTTP try: first, retries, each re-ask
        INTERNAL "apply_guardrail toolsentry"   one per violation found in that try's answer

Tracing is off unless an OTLP endpoint is configured; then `Tracing.create` returns None and
the hot path does no tracing work: the routes and the upstream client test one reference.
Spans are exported in batches from the SDK's worker thread; a bounded queue in front of it drops
(and counts) spans when the endpoint is down or slow, so neither latency nor memory grows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context

from proxy.guard.channels import Violation

SEMCONV_VERSION = "1.44.0"
"""The GenAI semantic conventions release followed (gen_ai_latest_experimental)."""

SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
GUARDIAN_NAME = "toolsentry"

# Attribute names, spelled once. The gen_ai.* ones are the conventions'; toolsentry.* are ours.
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CONVERSATION = "gen_ai.conversation.id"
STREAM = "gen_ai.request.stream"
GUARDIAN = "gen_ai.guardian.name"
TARGET_TYPE = "gen_ai.security.target.type"
TARGET_ID = "gen_ai.security.target.id"
DECISION = "gen_ai.security.decision.type"
DECISION_REASON = "gen_ai.security.decision.reason"
ERROR_TYPE = "error.type"
HTTP_STATUS = "http.response.status_code"
HTTP_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
SERVER_ADDRESS = "server.address"
URL_FULL = "url.full"

API = "toolsentry.api"
ATTEMPT_KIND = "toolsentry.attempt.kind"
ATTEMPT_TRY = "toolsentry.attempt.try"
CHANNEL = "toolsentry.violation.channel"
TOOL_NAME = "toolsentry.violation.tool_name"
CALL_INDEX = "toolsentry.violation.call_index"
REPAIRED = "toolsentry.violation.repaired"
SCHEMA_POINTER = "toolsentry.violation.schema_pointer"
MESSAGE = "toolsentry.violation.message"
SESSION_ERRORS = "toolsentry.session.errors"
SESSION_MAX_ERRORS = "toolsentry.session.max_errors"
SESSION_EXHAUSTED = "toolsentry.session.exhausted"
REPAIRS = "toolsentry.repairs"
VIOLATIONS = "toolsentry.violations"

# What each protocol's operation is called in the conventions.
OPERATIONS = {"chat": "chat", "responses": "chat", "messages": "chat"}


@dataclass(frozen=True)
class TracingConfig:
    """Where spans go; `endpoint` None means the OTel SDK's own variables decide (OTEL_*)."""

    endpoint: str | None = None
    service_name: str = "toolsentry"
    max_queue_size: int = 2048
    export_timeout_s: float = 5.0
    schedule_delay_ms: float = 500.0


def wanted(endpoint: str | None, environ: Mapping[str, str]) -> bool:
    """Whether tracing is on: an endpoint given, or the standard OTLP variables set (and the SDK
    not disabled with OTEL_SDK_DISABLED / OTEL_TRACES_EXPORTER=none)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(
        endpoint
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL for a collector base URL (as OTEL_EXPORTER_OTLP_ENDPOINT is read)."""
    base = endpoint.rstrip("/")
    return base if base.endswith("/v1/traces") else f"{base}/v1/traces"


class _CountingExporter(SpanExporter):
    """The OTLP exporter, counting what reached it and what it failed to deliver."""

    def __init__(self, inner: SpanExporter, queue: _Bound) -> None:
        self._inner = inner
        self._queue = queue

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._queue.left(len(spans))
        try:
            result = self._inner.export(spans)
        except Exception:  # an exporter bug must not kill the SDK's worker thread
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._queue.drop("export_failed", len(spans))
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _Bound:
    """Spans handed to the batch processor and not yet taken by the exporter, capped."""

    def __init__(self, capacity: int, on_drop: Callable[[str, int], None]) -> None:
        self.capacity = capacity
        self._pending = 0
        self._lock = threading.Lock()
        self._on_drop = on_drop

    def enter(self) -> bool:
        with self._lock:
            if self._pending >= self.capacity:
                full = True
            else:
                self._pending += 1
                full = False
        if full:
            self.drop("queue_full", 1)
        return not full

    def left(self, n: int) -> None:
        with self._lock:
            self._pending = max(0, self._pending - n)

    def drop(self, reason: str, n: int) -> None:
        self._on_drop(reason, n)


class _BoundedBatch(SpanProcessor):
    """The SDK's batch processor behind a counted bound: a full queue drops here, counted,
    instead of inside the SDK's deque, which would drop silently."""

    def __init__(self, inner: BatchSpanProcessor, bound: _Bound) -> None:
        self._inner = inner
        self._bound = bound

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        if self._bound.enter():
            self._inner.on_end(span)

    def shutdown(self) -> None:
        self._inner.shutdown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class Tracing:
    """The proxy's tracer. Built only when tracing is on (`create`); one per app."""

    def __init__(
        self,
        config: TracingConfig,
        *,
        on_drop: Callable[[str, int], None] = lambda reason, n: None,
        exporter: SpanExporter | None = None,
    ) -> None:
        bound = _Bound(config.max_queue_size, on_drop)
        inner = exporter or OTLPSpanExporter(
            endpoint=traces_url(config.endpoint) if config.endpoint else None,
            timeout=config.export_timeout_s,
        )
        batch = BatchSpanProcessor(
            _CountingExporter(inner, bound),
            max_queue_size=config.max_queue_size,
            schedule_delay_millis=config.schedule_delay_ms,
            max_export_batch_size=min(512, config.max_queue_size),
        )
        # Resource.create reads OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, which win.
        resource = Resource.create({"service.name": config.service_name})
        # The sampler comes from OTEL_TRACES_SAMPLER / _ARG when set (parent-based always-on
        # otherwise), as every OTel SDK reads them.
        self._provider = TracerProvider(resource=resource)
        self._provider.add_span_processor(_BoundedBatch(batch, bound))
        self.tracer: Tracer = self._provider.get_tracer("toolsentry", schema_url=SCHEMA_URL)

    @classmethod
    def create(
        cls,
        config: TracingConfig,
        environ: Mapping[str, str],
        *,
        on_drop: Callable[[str, int], None] = lambda reason, n: None,
    ) -> Tracing | None:
        """A tracer when tracing is wanted (`wanted`), else None (and then nothing is traced)."""
        if not wanted(config.endpoint, environ):
            return None
        return cls(config, on_drop=on_drop)

    def request(
        self,
        *,
        api: str,
        model: str,
        method: str,
        route: str,
        headers: Mapping[str, str],
        stream: bool,
    ) -> RequestTrace:
        """Start the server span of one request, continuing the client's `traceparent`."""
        parent = propagate.extract(headers)
        operation = OPERATIONS.get(api, api)
        span = self.tracer.start_span(
            f"{operation} {model}" if model else operation,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                OPERATION: operation,
                REQUEST_MODEL: model,
                API: api,
                STREAM: stream,
                HTTP_METHOD: method,
                HTTP_ROUTE: route,
            },
        )
        return RequestTrace(self.tracer, span, operation, model)

    def shutdown(self) -> None:
        """Flush what is queued (bounded by the export timeout) and stop the worker thread."""
        self._provider.shutdown()

    def force_flush(self, timeout_ms: int = 5000) -> bool:
        return self._provider.force_flush(timeout_ms)


CURRENT: ContextVar[RequestTrace | None] = ContextVar("toolsentry_trace", default=None)
"""The trace of the request being served, for the upstream client's attempt spans."""


class RequestTrace:
    """One request's spans. The turn says which attempt it is making (`attempt_kind`) and adds
    violations; the upstream client opens a span per HTTP try (`upstream_try`)."""

    def __init__(self, tracer: Tracer, span: Span, operation: str, model: str) -> None:
        self._tracer = tracer
        self.span = span
        self._operation = operation
        self._model = model
        self._kind = "first"
        self._tries = 0
        self._last_try: Span | None = None
        self._ended = False
        self._response_model: str | None = None
        self._finish_reasons: list[str] = []
        self._tokens = [0, 0]
        self._found: list[tuple[Span | None, Sequence[Violation], int]] = []

    def attempt_kind(self, kind: str) -> None:
        """The turn's next upstream call: "first", "reask", "shadow"; tries restart at 1."""
        self._kind = kind
        self._tries = 0

    def upstream_try(self, provider: str, url: str, headers: dict[str, str]) -> AttemptSpan:
        """Open the span of one HTTP try and write its `traceparent` into `headers`."""
        self._tries += 1
        kind = self._kind if self._tries == 1 else "retry"
        span = self._tracer.start_span(
            f"{self._operation} {self._model}" if self._model else self._operation,
            context=set_span_in_context(self.span),
            kind=SpanKind.CLIENT,
            attributes={
                OPERATION: self._operation,
                PROVIDER: provider,
                REQUEST_MODEL: self._model,
                ATTEMPT_KIND: kind,
                ATTEMPT_TRY: self._tries,
                URL_FULL: url,
            },
        )
        self._last_try = span
        propagate.inject(headers, context=set_span_in_context(span, otel_context.Context()))
        return AttemptSpan(span)

    def checkpoint(self) -> Span | None:
        """The span of the latest upstream try: the parent of the violations found in its answer."""
        return self._last_try

    def found(self, violations: Sequence[Violation]) -> None:
        """Violations found in the answer of the latest upstream try (the first answer's, or a
        re-ask's): recorded under that try's span when the choice is settled (`settled`)."""
        if violations:
            self._found.append((self._last_try, violations, time.time_ns()))

    def settled(self, *, repaired: bool, decision: str) -> None:
        """The choice is settled: every violation `found` on its way becomes a guardrail record
        with the outcome (`repaired`, `decision`) of the whole repair."""
        for parent, violations, at in self._found:
            self.guardrails(violations, parent=parent, repaired=repaired, decision=decision, at=at)
        self._found.clear()

    def guardrails(
        self,
        violations: Sequence[Violation],
        *,
        parent: Span | None,
        repaired: bool,
        decision: str,
        at: int | None = None,
    ) -> None:
        """Record each violation as an `apply_guardrail` span under the try whose answer held it.

        `decision` in the conventions' words: `modify` (repaired, or the call stripped), `deny`
        (the request refused), `warn` (passed to the client as it came). Message bodies never go
        in: the tool name as called, the channel, the guard's short message and JSON pointers.
        """
        context = set_span_in_context(parent or self.span)
        if at is None:
            at = time.time_ns()
        for violation in violations:
            attributes: dict[str, Any] = {
                OPERATION: "apply_guardrail",
                GUARDIAN: GUARDIAN_NAME,
                TARGET_TYPE: "tool_call",
                DECISION: decision,
                DECISION_REASON: violation.channel.value,
                CHANNEL: violation.channel.value,
                REPAIRED: repaired,
                MESSAGE: violation.message,
            }
            if violation.tool_name is not None:
                attributes[TOOL_NAME] = violation.tool_name
            if violation.call_index is not None:
                attributes[CALL_INDEX] = violation.call_index
            if violation.call_id:
                attributes[TARGET_ID] = violation.call_id
            if violation.pointers:
                attributes[SCHEMA_POINTER] = list(violation.pointers)
            span = self._tracer.start_span(
                f"apply_guardrail {GUARDIAN_NAME}",
                context=context,
                kind=SpanKind.INTERNAL,
                attributes=attributes,
                start_time=at,
            )
            span.end(end_time=at)

    def answered(self, body: Mapping[str, Any]) -> None:
        """An upstream answer was read: its model, and its usage added to the request's (the
        try's span has ended with its response; the figures go on the request's span)."""
        model = body.get("model")
        usage = body.get("usage")
        if isinstance(model, str):
            self._response_model = model
        if isinstance(usage, Mapping):
            # chat names them prompt/completion tokens; Responses and Messages input/output.
            tokens_in = usage.get("input_tokens", usage.get("prompt_tokens"))
            tokens_out = usage.get("output_tokens", usage.get("completion_tokens"))
            if isinstance(tokens_in, int):
                self._tokens[0] += tokens_in
            if isinstance(tokens_out, int):
                self._tokens[1] += tokens_out

    def finish_reason(self, reason: str | None) -> None:
        """The finish reason of a choice as the client gets it."""
        if reason:
            self._finish_reasons.append(reason)

    def name(self, model: str) -> None:
        """The request's model, once its body is read."""
        self._model = model
        self.span.update_name(f"{self._operation} {model}")
        self.span.set_attribute(REQUEST_MODEL, model)

    def finish(self, status: int, attributes: Mapping[str, Any], error: str | None = None) -> None:
        """End the server span once, with the HTTP status and the turn's figures."""
        if self._ended:
            return
        self._ended = True
        # One call: each set_attribute(s) call validates and locks on its own.
        figures: dict[str, Any] = {HTTP_STATUS: status}
        if self._response_model is not None:
            figures[RESPONSE_MODEL] = self._response_model
        if self._finish_reasons:
            figures[FINISH_REASONS] = self._finish_reasons
        if any(self._tokens):
            figures[INPUT_TOKENS], figures[OUTPUT_TOKENS] = self._tokens
        for key, value in attributes.items():
            if value is not None:
                figures[key] = value
        self.span.set_attributes(figures)
        if error is not None or status >= 500:
            self.span.set_attribute(ERROR_TYPE, error or str(status))
            self.span.set_status(Status(StatusCode.ERROR, error))
        self.span.end()


class AttemptSpan:
    """One HTTP try to the upstream; ended once with its outcome."""

    __slots__ = ("_ended", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self._ended = False

    def finish(
        self,
        *,
        status: int | None = None,
        error: str | None = None,
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        if self._ended:
            return
        self._ended = True
        if status is not None:
            self.span.set_attribute(HTTP_STATUS, status)
        if attributes:
            self.span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        if error is not None or (status is not None and status >= 400):
            self.span.set_attribute(ERROR_TYPE, error or str(status))
            self.span.set_status(Status(StatusCode.ERROR, error))
        self.span.end()
