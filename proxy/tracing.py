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
Context travels as W3C trace context (`traceparent`, `tracestate`). A full queue drops spans,
counted, and so does a failed export: neither latency nor memory grows with a slow endpoint.
"""

from __future__ import annotations

import gzip
import http.client
import random
import re
import ssl
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

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
from opentelemetry.util.re import parse_env_headers

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


# -- spans as the event loop records them ------------------------------------------------------

_KINDS = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3}


class SpanRecord:
    """One span: what the OTLP encoding needs and nothing else. `error` None is status UNSET;
    a string (possibly empty) is status ERROR with that description."""

    __slots__ = (
        "attributes",
        "end",
        "error",
        "kind",
        "name",
        "parent_id",
        "remote_parent",
        "span_id",
        "start",
        "trace_id",
        "trace_state",
    )

    def __init__(
        self,
        name: str,
        kind: SpanKind,
        trace_id: int,
        parent_id: int,
        attributes: dict[str, Any],
        *,
        trace_state: str = "",
        remote_parent: bool = False,
        start: int | None = None,
    ) -> None:
        self.name = name
        self.kind = kind
        self.trace_id = trace_id
        self.span_id = _new_id(64)
        self.parent_id = parent_id
        self.remote_parent = remote_parent
        self.trace_state = trace_state
        self.attributes = attributes
        self.start = time.time_ns() if start is None else start
        self.end = self.start
        self.error: str | None = None


def _new_id(bits: int) -> int:
    """A random, non-zero id (what the SDK's RandomIdGenerator draws)."""
    while True:
        value = random.getrandbits(bits)
        if value:
            return value


# -- W3C trace context ---------------------------------------------------------------------------

_TRACEPARENT = re.compile(
    r"^[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?[ \t]*$"
)


def parse_traceparent(value: str | None) -> tuple[int, int, int] | None:
    """(trace id, span id, flags) of a `traceparent` header, None when it is absent or invalid
    (W3C trace context: version ff, all-zero ids, or a version-00 header with more fields)."""
    if not value:
        return None
    match = _TRACEPARENT.match(value)
    if match is None:
        return None
    version, trace_hex, span_hex, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, int(flags, 16)


def traceparent(trace_id: int, span_id: int, sampled: bool) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


# -- OTLP protobuf -------------------------------------------------------------------------------
# ExportTraceServiceRequest of opentelemetry-proto's trace/v1 and common/v1, written field by
# field: a tag byte ((field << 3) | wire type), then a varint, fixed-size bytes, or a length and
# that many bytes.


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field."""
    return tag + _varint(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    """An AnyValue, as the SDK's exporter encodes attribute values (bool before int)."""
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int64: two's complement
    if isinstance(value, float):
        return b"\x21" + struct.pack("<d", value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(v)) for v in value))
    raise TypeError(f"an attribute value cannot be {type(value).__name__}")


def _key_value(key: str, value: Any) -> bytes:
    """A KeyValue message."""
    return _field(b"\x0a", key.encode()) + _field(b"\x12", _any_value(value))


_SEEN: dict[tuple[str, type, Any], bytes] = {}
"""Span attribute fields already encoded, by key, type and value: most repeat from request to
request (operation, model, route, status, channel). Bounded: past `_SEEN_MAX` entries a new
value is encoded each time it comes."""
_SEEN_MAX = 4096


def _span_attributes(attributes: Mapping[str, Any]) -> list[bytes]:
    """A span's attribute fields (9); None values are left out, as the SDK does."""
    out = []
    for key, value in attributes.items():
        if value is None:
            continue
        kind = value.__class__
        if kind is list:
            out.append(_field(b"\x4a", _key_value(key, value)))
            continue
        encoded = _SEEN.get((key, kind, value))
        if encoded is None:
            encoded = _field(b"\x4a", _key_value(key, value))
            if len(_SEEN) < _SEEN_MAX:
                _SEEN[key, kind, value] = encoded
        out.append(encoded)
    return out


def _span(span: SpanRecord) -> bytes:
    parts = [
        b"\x0a\x10" + span.trace_id.to_bytes(16, "big"),
        b"\x12\x08" + span.span_id.to_bytes(8, "big"),
    ]
    if span.trace_state:
        parts.append(_field(b"\x1a", span.trace_state.encode()))
    if span.parent_id:
        parts.append(b"\x22\x08" + span.parent_id.to_bytes(8, "big"))
    parts.append(_field(b"\x2a", span.name.encode()))
    parts.append(b"\x30" + _varint(_KINDS[span.kind]))
    parts.append(b"\x39" + struct.pack("<Q", span.start))
    parts.append(b"\x41" + struct.pack("<Q", span.end))
    parts.extend(_span_attributes(span.attributes))
    if span.error is None:
        parts.append(b"\x7a\x00")  # status UNSET
    else:
        status = _field(b"\x12", span.error.encode()) if span.error else b""
        parts.append(_field(b"\x7a", status + b"\x18\x02"))  # status ERROR
    # SpanFlags: whether the parent is remote is known (0x100), and whether it is (0x200).
    parts.append(b"\x85\x01" + struct.pack("<I", 0x300 if span.remote_parent else 0x100))
    return b"".join(parts)


class Encoder:
    """ExportTraceServiceRequest payloads for one resource and the proxy's one scope: what the
    SDK's OTLP exporter (`encode_spans`) sends for the same spans."""

    def __init__(self, resource: Resource, scope: str, schema_url: str) -> None:
        self._resource = _field(
            b"\x0a",
            b"".join(_field(b"\x0a", _key_value(k, v)) for k, v in resource.attributes.items()),
        )
        self._resource_schema = (
            _field(b"\x1a", resource.schema_url.encode()) if resource.schema_url else b""
        )
        self._scope = _field(b"\x0a", _field(b"\x0a", scope.encode()))
        self._scope_schema = _field(b"\x1a", schema_url.encode()) if schema_url else b""

    def encode(self, spans: Sequence[SpanRecord]) -> bytes:
        scope_spans = b"".join(
            [self._scope, *(_field(b"\x12", _span(s)) for s in spans), self._scope_schema]
        )
        resource_spans = self._resource + _field(b"\x12", scope_spans) + self._resource_schema
        return _field(b"\x0a", resource_spans)


# -- the OTLP/HTTP endpoint ------------------------------------------------------------------------

_RETRYABLE = frozenset({429, 502, 503, 504})


class Sender:
    """POSTs payloads to an OTLP/HTTP traces URL over one kept-alive connection, with the
    exporter variables' headers, compression and TLS files; a failure worth retrying (no
    connection, 429, 502-504) is retried with backoff until `timeout_s` has passed."""

    def __init__(self, url: str, environ: Mapping[str, str], timeout_s: float) -> None:
        def var(name: str) -> str:
            return (
                environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}")
                or environ.get(f"OTEL_EXPORTER_OTLP_{name}")
                or ""
            ).strip()

        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an OTLP/HTTP URL: {url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout_s = timeout_s
        self._headers = {"Content-Type": "application/x-protobuf"}
        self._headers.update(parse_env_headers(var("HEADERS"), liberal=True))
        compression = var("COMPRESSION").lower()
        self._compress: Callable[[bytes], bytes] | None = None
        if compression == "gzip":
            self._compress, self._headers["Content-Encoding"] = gzip.compress, "gzip"
        elif compression == "deflate":
            self._compress, self._headers["Content-Encoding"] = zlib.compress, "deflate"
        self._tls: ssl.SSLContext | None = None
        if self._https:
            self._tls = ssl.create_default_context(cafile=var("CERTIFICATE") or None)
            if var("CLIENT_CERTIFICATE"):
                self._tls.load_cert_chain(var("CLIENT_CERTIFICATE"), var("CLIENT_KEY") or None)
        self._connection: http.client.HTTPConnection | None = None

    def __call__(self, payload: bytes) -> bool:
        """Whether the endpoint took the payload (a 2xx)."""
        body = self._compress(payload) if self._compress else payload
        deadline = time.monotonic() + self.timeout_s
        backoff = 0.1
        while True:
            status = self._post(body, deadline)
            if status is not None and 200 <= status < 300:
                return True
            if status is not None and status not in _RETRYABLE:
                return False
            pause = min(backoff, deadline - time.monotonic())
            if pause <= 0:
                return False
            time.sleep(pause)
            backoff *= 2

    def _post(self, body: bytes, deadline: float) -> int | None:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            connection = self._connection
            if connection is None:
                if self._https:
                    connection = http.client.HTTPSConnection(
                        self._host, self._port, timeout=left, context=self._tls
                    )
                else:
                    connection = http.client.HTTPConnection(self._host, self._port, timeout=left)
                self._connection = connection
            else:
                connection.timeout = left
                if connection.sock is not None:
                    connection.sock.settimeout(left)
            connection.request("POST", self._path, body, self._headers)
            response = connection.getresponse()
            response.read()
            if response.will_close:
                self.close()
            return response.status
        except (OSError, http.client.HTTPException):
            self.close()
            return None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


# -- the queue and its worker ----------------------------------------------------------------------


class Exporter:
    """Spans queue here from the event loop (`add`, a lock and an append); a worker thread takes
    them in batches, encodes and sends them. The queue holds at most `capacity` spans: beyond,
    a span is dropped and counted (`queue_full`), and a batch the endpoint did not take is
    counted too (`export_failed`); every span ended is either delivered or counted."""

    def __init__(
        self,
        encode: Callable[[Sequence[SpanRecord]], bytes],
        send: Callable[[bytes], bool],
        *,
        capacity: int,
        batch: int,
        delay_s: float,
        on_drop: Callable[[str, int], None],
    ) -> None:
        self._encode = encode
        self._send = send
        self.capacity = capacity
        self._batch = batch
        self._delay_s = delay_s
        self._on_drop = on_drop
        self._queue: deque[SpanRecord] = deque()
        self._lock = threading.Lock()
        self._sending = threading.Lock()  # one batch in flight: the worker's or a flush's
        self._wake = threading.Event()
        self.stopping = False
        self._worker = threading.Thread(target=self._run, name="toolsentry-otlp", daemon=True)
        self._worker.start()

    def add(self, span: SpanRecord) -> None:
        with self._lock:
            queued = len(self._queue)
            if queued < self.capacity:
                self._queue.append(span)
        if queued >= self.capacity:
            self._on_drop("queue_full", 1)
        elif queued + 1 >= self._batch:
            self._wake.set()

    def _run(self) -> None:
        while not self.stopping:
            self._wake.wait(self._delay_s)
            self._wake.clear()
            self._drain()

    def _drain(self, *, last: bool = False) -> None:
        """Send batches until the queue is empty. At shutdown (`last`, or the worker's drain
        when shutdown began), after a batch the endpoint did not take, the rest is counted as
        failed too instead of waited for: stopping takes one export timeout, not one a batch."""
        with self._sending:
            while True:
                with self._lock:
                    n = min(len(self._queue), self._batch)
                    spans = [self._queue.popleft() for _ in range(n)]
                if not spans:
                    return
                try:
                    delivered = self._send(self._encode(spans))
                except Exception:  # a bug here must not end the worker: the spans are counted
                    delivered = False
                if not delivered:
                    if last or self.stopping:
                        with self._lock:
                            n += len(self._queue)
                            self._queue.clear()
                    self._on_drop("export_failed", n)

    def force_flush(self) -> bool:
        """Send what is queued now, in the caller's thread; whether the queue is empty after."""
        self._drain()
        with self._lock:
            return not self._queue

    def shutdown(self) -> None:
        self.stopping = True
        self._wake.set()
        self._worker.join()
        self._drain(last=True)


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
        self._sender: Sender | None = None
        if send is None:
            if config.endpoint:
                url = traces_url(config.endpoint)
            elif environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
                url = environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
            else:
                url = traces_url(
                    environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
                )
            send = self._sender = Sender(url, environ, config.export_timeout_s)
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
        parent = parse_traceparent(headers.get("traceparent"))
        trace_state = ""
        if parent is None:
            trace_id, parent_id, sampled = _new_id(128), 0, True
        else:
            trace_id, parent_id, flags = parent
            sampled = bool(flags & 1)
            if headers.get("tracestate"):
                trace_state = TraceState.from_header([headers["tracestate"]]).to_header()
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
        return RequestTrace(self.exporter if sampled else None, span, operation, model)

    def _sample(
        self,
        parent: tuple[int, int, int] | None,
        trace_id: int,
        trace_state: str,
        name: str,
        attributes: dict[str, Any],
    ) -> tuple[bool, str]:
        """The configured sampler's decision (a sampler other than the default)."""
        context: Context | None = None
        if parent is not None:
            remote = SpanContext(
                parent[0],
                parent[1],
                is_remote=True,
                trace_flags=TraceFlags(parent[2]),
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
        self, exporter: Exporter | None, span: SpanRecord, operation: str, model: str
    ) -> None:
        self._exporter = exporter
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
        headers["traceparent"] = traceparent(
            span.trace_id, span.span_id, self._exporter is not None
        )
        if span.trace_state:
            headers["tracestate"] = span.trace_state
        return AttemptSpan(self, span)

    def beside(self, kind: str) -> RequestTrace:
        """The request's trace for calls made beside its turn (a shadow call, which may outlive
        the response): its tries are counted apart, of `kind`, under the request's span."""
        other = RequestTrace(self._exporter, self.span, self._operation, self._model)
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
