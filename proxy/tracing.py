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

On, a span on the event loop is a small record (`SpanRecord`: ids, times, a dict of attributes)
put on a bounded queue; a worker thread encodes batches of them in OTLP's protobuf (`encode`,
the encoding the OpenTelemetry SDK's exporter produces, tested against it) and POSTs them to
the endpoint. The SDK's span machinery cost more than the request's own work (locks, attribute
validation, context objects per span, and a protobuf object per attribute at export), so the
proxy keeps of the SDK what configures it: the resource (`OTEL_SERVICE_NAME`,
`OTEL_RESOURCE_ATTRIBUTES`) and the sampler (`OTEL_TRACES_SAMPLER` / `_ARG`, asked once per
request at the server span: its tries and guardrails follow it, as parent-based sampling does).
Context travels as `OTEL_PROPAGATORS` lists (proxy/propagation.py; W3C trace context and
baggage by default). A full queue drops spans,
counted, and so does a failed export: neither latency nor memory grows with a slow endpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import DEFAULT_ON, Sampler
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from proxy.errors import ConfigError
from proxy.guard.channels import Violation
from proxy.otlp import Encoder, Exporter, Sender, SpanRecord, exporter_var, new_id
from proxy.otlp_grpc import DEFAULT_ENDPOINT as GRPC_ENDPOINT
from proxy.otlp_grpc import GrpcSender
from proxy.propagation import W3C, Parent, Propagation
from proxy.protocols.base import API as WireAPI

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
OPERATIONS: dict[str, str] = {
    WireAPI.CHAT: "chat",
    WireAPI.RESPONSES: "chat",
    WireAPI.MESSAGES: "chat",
}


@dataclass(frozen=True)
class TracingConfig:
    """Where spans go; `endpoint` None means the standard variables decide (OTEL_EXPORTER_OTLP_*)."""

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


def _sender(config: TracingConfig, environ: Mapping[str, str]) -> Sender | GrpcSender:
    """The OTLP sender the exporter variables ask for: OTLP/HTTP (protobuf), or gRPC."""
    protocol = (exporter_var(environ, "PROTOCOL") or "http/protobuf").lower()
    if protocol == "grpc":
        endpoint = (
            config.endpoint
            or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            or GRPC_ENDPOINT
        )
        return GrpcSender(endpoint, environ, config.export_timeout_s)
    if protocol != "http/protobuf":
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: toolsentry sends traces as "
            "http/protobuf or grpc"
        )
    if config.endpoint:
        url = traces_url(config.endpoint)
    elif environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        url = environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    else:
        url = traces_url(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318")
    return Sender(url, environ, config.export_timeout_s)


# -- the tracer ------------------------------------------------------------------------------------


class Tracing:
    """The proxy's tracer. Built only when tracing is on (`create`); one per app."""

    def __init__(
        self,
        config: TracingConfig,
        *,
        environ: Mapping[str, str] | None = None,
        on_drop: Callable[[str, int], None] = lambda reason, n: None,
        send: Callable[[bytes], bool] | None = None,
    ) -> None:
        environ = environ or {}
        # Resource.create reads OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, which win; the
        # provider reads OTEL_TRACES_SAMPLER / _ARG (parent-based always-on otherwise). Neither
        # the provider nor its tracer makes a span here.
        resource = Resource.create({"service.name": config.service_name})
        self.sampler: Sampler = TracerProvider(resource=resource, shutdown_on_exit=False).sampler
        # The default decides from the parent's flag alone: then the proxy reads it itself.
        default = DEFAULT_ON.get_description()  # type: ignore[no-untyped-call]  # unannotated
        self._parent_decides = self.sampler.get_description() == default
        self.propagation = Propagation.from_environ(environ)
        self._sender: Sender | GrpcSender | None = None
        if send is None:
            send = self._sender = _sender(config, environ)
        self.encoder = Encoder(resource, "toolsentry", SCHEMA_URL)
        self.exporter = Exporter(
            self.encoder.encode,
            send,
            capacity=config.max_queue_size,
            batch=min(512, config.max_queue_size),
            delay_s=config.schedule_delay_ms / 1000,
            on_drop=on_drop,
        )

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
        return cls(config, environ=environ, on_drop=on_drop)

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
        operation = OPERATIONS.get(api, api)
        name = f"{operation} {model}" if model else operation
        attributes: dict[str, Any] = {
            OPERATION: operation,
            REQUEST_MODEL: model,
            API: api,
            STREAM: stream,
            HTTP_METHOD: method,
            HTTP_ROUTE: route,
        }
        parent = self.propagation.extract(headers)
        trace_state = ""
        if parent is None:
            trace_id, parent_id, sampled = new_id(128), 0, True
        else:
            trace_id, parent_id, trace_state = parent.trace_id, parent.span_id, parent.trace_state
            sampled = bool(parent.flags & 1)
        if not self._parent_decides:
            sampled, trace_state = self._sample(parent, trace_id, trace_state, name, attributes)
        span = SpanRecord(
            name,
            SpanKind.SERVER,
            trace_id,
            parent_id,
            attributes,
            trace_state=trace_state,
            remote_parent=parent is not None,
        )
        return RequestTrace(
            self.exporter if sampled else None, span, operation, model, self.propagation
        )

    def _sample(
        self,
        parent: Parent | None,
        trace_id: int,
        trace_state: str,
        name: str,
        attributes: dict[str, Any],
    ) -> tuple[bool, str]:
        """The configured sampler's decision (a sampler other than the default)."""
        context: Context | None = None
        if parent is not None:
            remote = SpanContext(
                parent.trace_id,
                parent.span_id,
                is_remote=True,
                trace_flags=TraceFlags(parent.flags),
                trace_state=TraceState.from_header([trace_state]) if trace_state else None,
            )
            context = set_span_in_context(NonRecordingSpan(remote))
        result = self.sampler.should_sample(context, trace_id, name, SpanKind.SERVER, attributes)
        if result.attributes:
            attributes.update(result.attributes)
        state = result.trace_state.to_header() if result.trace_state is not None else trace_state
        return result.decision.is_sampled(), state  # type: ignore[no-untyped-call]

    def shutdown(self) -> None:
        """Send what is queued (each batch bounded by the export timeout) and stop the worker."""
        self.exporter.shutdown()
        if self._sender is not None:
            self._sender.close()

    def force_flush(self, timeout_ms: int = 5000) -> bool:
        """Send what is queued now; each batch is bounded by the export timeout, not `timeout_ms`
        (kept for callers written against the SDK's signature)."""
        return self.exporter.force_flush()


CURRENT: ContextVar[RequestTrace | None] = ContextVar("toolsentry_trace", default=None)
"""The trace of the request being served, for the upstream client's attempt spans."""


class RequestTrace:
    """One request's spans. The turn says which attempt it is making (`attempt_kind`) and adds
    violations; the upstream client opens a span per HTTP try (`upstream_try`). Not sampled
    (`exporter` None), it still forwards the trace context and records nothing."""

    def __init__(
        self,
        exporter: Exporter | None,
        span: SpanRecord,
        operation: str,
        model: str,
        propagation: Propagation = W3C,
    ) -> None:
        self._exporter = exporter
        self._propagation = propagation
        self.span = span
        self._operation = operation
        self._model = model
        self._kind = "first"
        self._tries = 0
        self._last_try: SpanRecord | None = None
        self._ended = False
        self._response_model: str | None = None
        self._finish_reasons: list[str] = []
        self._tokens = [0, 0]
        self._found: list[tuple[SpanRecord | None, Sequence[Violation], int]] = []

    def _end(self, span: SpanRecord, end: int | None = None) -> None:
        span.end = time.time_ns() if end is None else end
        if self._exporter is not None:
            self._exporter.add(span)

    def attempt_kind(self, kind: str) -> None:
        """The turn's next upstream call: "first", "reask", "fallback" (a constrained re-ask the
        upstream refused, sent again plain), "shadow"; tries restart at 1."""
        self._kind = kind
        self._tries = 0

    def upstream_try(self, provider: str, url: str, headers: dict[str, str]) -> AttemptSpan:
        """Open the span of one HTTP try and write its `traceparent` into `headers`."""
        self._tries += 1
        server = self.span
        span = SpanRecord(
            f"{self._operation} {self._model}" if self._model else self._operation,
            SpanKind.CLIENT,
            server.trace_id,
            server.span_id,
            {
                OPERATION: self._operation,
                PROVIDER: provider,
                REQUEST_MODEL: self._model,
                ATTEMPT_KIND: self._kind if self._tries == 1 else "retry",
                ATTEMPT_TRY: self._tries,
                URL_FULL: url,
            },
            trace_state=server.trace_state,
        )
        self._last_try = span
        context = Parent(span.trace_id, span.span_id, 0, span.trace_state)
        self._propagation.inject(headers, context, self._exporter is not None)
        return AttemptSpan(self, span)

    def beside(self, kind: str) -> RequestTrace:
        """The request's trace for calls made beside its turn (a shadow call, which may outlive
        the response): its tries are counted apart, of `kind`, under the request's span."""
        other = RequestTrace(
            self._exporter,
            self.span,
            self._operation,
            self._model,
            self._propagation,
        )
        other._kind = kind
        return other

    def checkpoint(self) -> SpanRecord | None:
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
        parent: SpanRecord | None,
        repaired: bool,
        decision: str,
        at: int | None = None,
    ) -> None:
        """Record each violation as an `apply_guardrail` span under the try whose answer held it.

        `decision` in the conventions' words: `modify` (repaired, or the call stripped), `deny`
        (the request refused), `warn` (passed to the client as it came). Message bodies never go
        in: the tool name as called, the channel, the guard's short message and JSON pointers.
        """
        under = parent or self.span
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
            span = SpanRecord(
                f"apply_guardrail {GUARDIAN_NAME}",
                SpanKind.INTERNAL,
                under.trace_id,
                under.span_id,
                attributes,
                trace_state=under.trace_state,
                start=at,
            )
            self._end(span, at)

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
        self.span.name = f"{self._operation} {model}"
        self.span.attributes[REQUEST_MODEL] = model

    def finish(self, status: int, attributes: Mapping[str, Any], error: str | None = None) -> None:
        """End the server span once, with the HTTP status and the turn's figures."""
        if self._ended:
            return
        self._ended = True
        figures = self.span.attributes
        figures[HTTP_STATUS] = status
        if self._response_model is not None:
            figures[RESPONSE_MODEL] = self._response_model
        if self._finish_reasons:
            figures[FINISH_REASONS] = self._finish_reasons
        if any(self._tokens):
            figures[INPUT_TOKENS], figures[OUTPUT_TOKENS] = self._tokens
        for key, value in attributes.items():
            if value is not None:
                figures[key] = value
        if error is not None or status >= 500:
            figures[ERROR_TYPE] = error or str(status)
            self.span.error = error or ""
        self._end(self.span)


class AttemptSpan:
    """One HTTP try to the upstream; ended once with its outcome."""

    __slots__ = ("_ended", "_trace", "span")

    def __init__(self, trace: RequestTrace, span: SpanRecord) -> None:
        self._trace = trace
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
        figures = self.span.attributes
        if status is not None:
            figures[HTTP_STATUS] = status
        if attributes:
            figures.update((k, v) for k, v in attributes.items() if v is not None)
        if error is not None or (status is not None and status >= 400):
            figures[ERROR_TYPE] = error or str(status)
            self.span.error = error or ""
        self._trace._end(self.span)
