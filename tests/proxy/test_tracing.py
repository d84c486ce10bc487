"""The tracer against a real OTLP/HTTP receiver on loopback, through the real OTLP exporter."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from proxy import tracing
from proxy.guard.channels import Channel, Violation
from proxy.otlp import Encoder, Exporter, SpanRecord
from proxy.propagation import parse_traceparent
from proxy.tracing import (
    Tracing,
    TracingConfig,
    traces_url,
    wanted,
)
from tests.proxy.otlp_receiver import OTLPReceiver

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    running = OTLPReceiver().start()
    yield running
    running.stop()


def make_tracing(endpoint: str, drops: Counter[str], **config: object) -> Tracing:
    settings = TracingConfig(endpoint=endpoint, schedule_delay_ms=50, export_timeout_s=1, **config)  # type: ignore[arg-type]
    made = Tracing.create(settings, {}, on_drop=lambda reason, n: drops.update({reason: n}))
    assert made is not None
    return made


def test_tracing_is_off_without_an_endpoint_and_on_with_the_standard_variables() -> None:
    assert Tracing.create(TracingConfig(), {}) is None
    assert wanted(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert wanted(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert not wanted("http://x", {"OTEL_SDK_DISABLED": "true"})
    assert not wanted("http://x", {"OTEL_TRACES_EXPORTER": "none"})
    assert traces_url("http://h:4318/") == "http://h:4318/v1/traces"
    assert traces_url("http://h:4318/v1/traces") == "http://h:4318/v1/traces"


def test_a_request_trace_continues_the_clients_traceparent_and_nests_tries_and_guardrails(
    receiver: OTLPReceiver,
) -> None:
    drops: Counter[str] = Counter()
    tracer = make_tracing(receiver.endpoint, drops)
    trace = tracer.request(
        api="chat",
        model="m",
        method="POST",
        route="/v1/chat/completions",
        headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
        stream=False,
    )
    first_headers: dict[str, str] = {}
    first = trace.upstream_try("local", "http://up/v1/chat/completions", first_headers)
    first.finish(status=200)
    trace.guardrails(
        [
            Violation(
                Channel.UNKNOWN_TOOL,
                "tool 'get_order' does not exist",
                tool_name="get_order",
                call_index=0,
                call_id="call_1",
            )
        ],
        parent=trace.checkpoint(),
        repaired=True,
        decision="modify",
    )
    trace.attempt_kind("reask")
    reask_headers: dict[str, str] = {}
    trace.upstream_try("local", "http://up/v1/chat/completions", reask_headers).finish(status=200)
    trace.finish(200, {tracing.CONVERSATION: "s1", tracing.REPAIRS: 1, "unset": None})
    assert tracer.force_flush()

    spans = receiver.wait_for(4)
    by_kind = {s.kind: s for s in spans if s.kind != "CLIENT"}
    tries = sorted((s for s in spans if s.kind == "CLIENT"), key=lambda s: s.start_ns)
    server, guardrail = by_kind["SERVER"], by_kind["INTERNAL"]
    assert server.trace_id == CLIENT_TRACE
    assert server.parent_span_id == CLIENT_SPAN
    assert server.attributes[tracing.CONVERSATION] == "s1"
    assert server.attributes[tracing.OPERATION] == "chat"
    assert "unset" not in server.attributes
    assert [t.attributes[tracing.ATTEMPT_KIND] for t in tries] == ["first", "reask"]
    assert all(t.parent_span_id == server.span_id for t in tries)
    assert guardrail.parent_span_id == tries[0].span_id
    assert guardrail.name == "apply_guardrail toolsentry"
    assert guardrail.attributes[tracing.CHANNEL] == "unknown_tool"
    assert guardrail.attributes[tracing.TOOL_NAME] == "get_order"
    assert guardrail.attributes[tracing.DECISION] == "modify"
    assert guardrail.attributes[tracing.REPAIRED] is True
    assert guardrail.attributes[tracing.TARGET_ID] == "call_1"
    # Each try forwards its own span as the upstream's parent.
    assert first_headers["traceparent"] == f"00-{CLIENT_TRACE}-{tries[0].span_id}-01"
    assert reask_headers["traceparent"] == f"00-{CLIENT_TRACE}-{tries[1].span_id}-01"
    assert server.resource["service.name"] == "toolsentry"
    assert not drops
    tracer.shutdown()


def test_a_retry_is_named_apart_from_the_attempt_it_retries(receiver: OTLPReceiver) -> None:
    tracer = make_tracing(receiver.endpoint, Counter())
    trace = tracer.request(
        api="responses", model="m", method="POST", route="/v1/responses", headers={}, stream=True
    )
    trace.upstream_try("local", "u", {}).finish(status=503)
    trace.upstream_try("local", "u", {}).finish(status=200)
    trace.finish(502, {}, error="upstream_error")
    tracer.force_flush()
    spans = receiver.wait_for(3)
    tries = sorted((s for s in spans if s.kind == "CLIENT"), key=lambda s: s.start_ns)
    assert [(t.attributes[tracing.ATTEMPT_KIND], t.status) for t in tries] == [
        ("first", "ERROR"),
        ("retry", "UNSET"),
    ]
    server = next(s for s in spans if s.kind == "SERVER")
    assert server.status == "ERROR"
    assert server.attributes[tracing.ERROR_TYPE] == "upstream_error"
    tracer.shutdown()


def test_an_endpoint_that_is_down_drops_spans_and_counts_them() -> None:
    down = OTLPReceiver().start()
    endpoint = down.endpoint
    down.stop()
    drops: Counter[str] = Counter()
    tracer = make_tracing(endpoint, drops, max_queue_size=4)
    for _ in range(10):
        tracer.request(
            api="chat", model="m", method="POST", route="/", headers={}, stream=False
        ).finish(200, {})
    tracer.force_flush(3000)
    tracer.shutdown()
    # Ten spans ended: each is either dropped at the full queue or lost at export; none vanish.
    assert drops["queue_full"] + drops["export_failed"] == 10
    assert drops["export_failed"] >= 1


def sdk_span(record: SpanRecord, resource: Resource) -> ReadableSpan:
    """The same span as the OpenTelemetry SDK holds it, for its exporter's encoder."""
    context = SpanContext(
        record.trace_id,
        record.span_id,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState.from_header([record.trace_state]) if record.trace_state else None,
    )
    parent = None
    if record.parent_id:
        parent = SpanContext(record.trace_id, record.parent_id, is_remote=record.remote_parent)
    status = Status() if record.error is None else Status(StatusCode.ERROR, record.error or None)
    return ReadableSpan(
        record.name,
        context=context,
        parent=parent,
        resource=resource,
        # A span of the SDK never holds a None value: setting one is refused.
        attributes={k: v for k, v in record.attributes.items() if v is not None},
        kind=record.kind,
        status=status,
        start_time=record.start,
        end_time=record.end,
        instrumentation_scope=InstrumentationScope("toolsentry", None, tracing.SCHEMA_URL),
    )


def test_the_encoding_is_the_sdk_exporters_for_the_same_spans() -> None:
    resource = Resource.create({"service.name": "toolsentry"})
    server = SpanRecord(
        "chat m",
        SpanKind.SERVER,
        int(CLIENT_TRACE, 16),
        int(CLIENT_SPAN, 16),
        {
            tracing.OPERATION: "chat",
            tracing.STREAM: False,
            tracing.HTTP_STATUS: 502,
            tracing.FINISH_REASONS: ["tool_calls", "stop"],
            tracing.ERROR_TYPE: "upstream_error",
            "big": 2**40,
            "negative": -3,
            "ratio": 0.25,
            "long": "x" * 300,  # a length of two varint bytes
            "unset": None,
        },
        trace_state="vendor=a,other=b",
        remote_parent=True,
    )
    server.error = "upstream_error"
    attempt = SpanRecord(
        "chat m", SpanKind.CLIENT, server.trace_id, server.span_id, {tracing.ATTEMPT_TRY: 1}
    )
    attempt.error = ""  # ERROR without a description
    guardrail = SpanRecord(
        "apply_guardrail toolsentry",
        SpanKind.INTERNAL,
        server.trace_id,
        attempt.span_id,
        {tracing.SCHEMA_POINTER: ["/a", "/b/0"], tracing.REPAIRED: True, tracing.CALL_INDEX: 0},
    )
    root = SpanRecord("chat", SpanKind.SERVER, 0xABC, 0, {})
    spans = [server, attempt, guardrail, root]
    for span in spans:
        span.end = span.start + 1_234_567
    ours = Encoder(resource, "toolsentry", tracing.SCHEMA_URL).encode(spans)
    sdk = encode_spans([sdk_span(s, resource) for s in spans])
    assert ExportTraceServiceRequest.FromString(ours) == sdk
    # Encoded twice (the second time from the cache of attribute fields), the same bytes.
    assert Encoder(resource, "toolsentry", tracing.SCHEMA_URL).encode(spans) == ours


def test_traceparent_is_read_as_w3c_trace_context_says() -> None:
    assert parse_traceparent(f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01") == (
        int(CLIENT_TRACE, 16),
        int(CLIENT_SPAN, 16),
        1,
    )
    assert parse_traceparent(f"01-{CLIENT_TRACE}-{CLIENT_SPAN}-00-later") is not None
    for bad in (
        None,
        "",
        f"ff-{CLIENT_TRACE}-{CLIENT_SPAN}-01",  # version ff is invalid
        f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01-more",  # version 00 has four fields
        f"00-{'0' * 32}-{CLIENT_SPAN}-01",
        f"00-{CLIENT_TRACE}-{'0' * 16}-01",
        f"00-{CLIENT_TRACE.upper()}-{CLIENT_SPAN}-01",
        f"00-{CLIENT_TRACE[:-1]}-{CLIENT_SPAN}-01",
    ):
        assert parse_traceparent(bad) is None, bad


def test_an_unsampled_client_trace_is_forwarded_and_nothing_is_recorded(
    receiver: OTLPReceiver,
) -> None:
    tracer = make_tracing(receiver.endpoint, Counter())
    trace = tracer.request(
        api="chat",
        model="m",
        method="POST",
        route="/v1/chat/completions",
        headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00", "tracestate": "k=v"},
        stream=False,
    )
    headers: dict[str, str] = {}
    trace.upstream_try("local", "u", headers).finish(status=200)
    trace.finish(200, {})
    # A sampled request after it: what arrives is its spans alone.
    tracer.request(
        api="chat", model="m", method="POST", route="/", headers={}, stream=False
    ).finish(200, {})
    assert tracer.force_flush()
    assert len(receiver.wait_for(1)) == 1
    assert headers["traceparent"].startswith(f"00-{CLIENT_TRACE}-")
    assert headers["traceparent"].endswith("-00")
    assert headers["tracestate"] == "k=v"
    tracer.shutdown()


def test_the_sampler_of_the_standard_variables_decides(
    receiver: OTLPReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    tracer = make_tracing(receiver.endpoint, Counter())
    trace = tracer.request(
        api="chat", model="m", method="POST", route="/", headers={}, stream=False
    )
    headers: dict[str, str] = {}
    trace.upstream_try("local", "u", headers).finish(status=200)
    trace.finish(200, {})
    tracer.force_flush()
    assert headers["traceparent"].endswith("-00")
    assert receiver.requests == 0
    tracer.shutdown()


@pytest.mark.parametrize("compression", ["gzip", "deflate", "none"])
def test_the_exporter_variables_set_headers_and_compression(
    receiver: OTLPReceiver, compression: str
) -> None:
    environ = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.endpoint}/v1/traces",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=acme,authorization=Bearer%20t0",
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": compression,
    }
    tracer = Tracing.create(TracingConfig(schedule_delay_ms=50), environ)
    assert tracer is not None
    tracer.request(
        api="chat", model="m", method="POST", route="/", headers={}, stream=False
    ).finish(200, {})
    assert tracer.force_flush()
    (span,) = receiver.wait_for(1)
    assert span.attributes[tracing.OPERATION] == "chat"
    sent = receiver.headers[-1]
    assert sent["x-tenant"] == "acme"
    assert sent["authorization"] == "Bearer t0"
    assert sent["content-type"] == "application/x-protobuf"
    assert sent.get("content-encoding") == (None if compression == "none" else compression)
    tracer.shutdown()


def test_a_busy_endpoint_is_retried_and_nothing_is_dropped(receiver: OTLPReceiver) -> None:
    receiver.refuse.extend([503, 429])
    drops: Counter[str] = Counter()
    tracer = make_tracing(receiver.endpoint, drops)
    tracer.request(
        api="chat", model="m", method="POST", route="/", headers={}, stream=False
    ).finish(200, {})
    assert tracer.force_flush()
    assert len(receiver.wait_for(1)) == 1
    assert len(receiver.headers) == 3  # two refusals, then the export taken
    assert not drops
    tracer.shutdown()


def test_an_endpoint_that_refuses_the_payload_is_not_retried(receiver: OTLPReceiver) -> None:
    receiver.refuse.append(400)
    drops: Counter[str] = Counter()
    tracer = make_tracing(receiver.endpoint, drops)
    tracer.request(
        api="chat", model="m", method="POST", route="/", headers={}, stream=False
    ).finish(200, {})
    tracer.force_flush()
    assert len(receiver.headers) == 1
    assert drops == Counter({"export_failed": 1})
    tracer.shutdown()


def test_shutdown_with_an_endpoint_that_fails_waits_for_one_batch_and_counts_the_rest() -> None:
    release = threading.Event()
    calls: list[int] = []
    drops: Counter[str] = Counter()

    def send(payload: bytes) -> bool:
        calls.append(len(payload))
        release.wait(10)  # a slow endpoint, which then fails
        return False

    exporter = Exporter(
        lambda spans: b"x" * len(spans),
        send,
        capacity=100,
        batch=10,
        delay_s=3600,
        on_drop=lambda reason, n: drops.update({reason: n}),
    )

    def span() -> SpanRecord:
        return SpanRecord("chat", SpanKind.SERVER, 1, 0, {})

    for _ in range(10):  # a full batch wakes the worker, which waits on the endpoint
        exporter.add(span())
    while not calls:
        time.sleep(0.01)
    for _ in range(50):
        exporter.add(span())
    stopping = threading.Thread(target=exporter.shutdown)
    stopping.start()
    while not stopping.is_alive() or not exporter.stopping:
        time.sleep(0.01)
    release.set()
    stopping.join(10)
    assert calls == [10]  # the five batches behind the failed one were not sent
    assert drops == Counter({"export_failed": 60})
