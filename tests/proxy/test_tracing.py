"""The tracer against a real OTLP/HTTP receiver on loopback, through the real OTLP exporter."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from proxy import tracing
from proxy.guard.channels import Channel, Violation
from proxy.tracing import Tracing, TracingConfig, traces_url, wanted
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
