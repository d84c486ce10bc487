"""Trace context in and out as OTEL_PROPAGATORS says: the proxy's own W3C trace-context reading
agrees with OpenTelemetry's propagator on every header (a differential property test), other
formats are the library's own (B3 single and multi), a later propagator's context wins as in the
SDK's composite, `none` turns propagation off, and a request through the real proxy continues a
B3 client's trace and hands the upstream each try's span in every listed format."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.propagators.b3 import B3MultiFormat
from opentelemetry.trace import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy.errors import ConfigError
from proxy.propagation import W3C, Parent, Propagation
from proxy.testing import completion, tool_call
from tests.proxy.builders import make_request
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.otlp_receiver import OTLPReceiver

TRACE, SPAN = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
OTHER_TRACE, OTHER_SPAN = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7
LIBRARY = TraceContextTextMapPropagator()

hexes = st.text("0123456789abcdefABCDEF-xz ", max_size=60)
headers = st.one_of(
    hexes,
    st.builds(
        lambda v, t, s, f, rest: f"{v}-{t}-{s}-{f}{rest}",
        st.sampled_from(["00", "01", "ff", "cc", "0g"]),
        st.sampled_from([f"{TRACE:032x}", "0" * 32, f"{TRACE:031x}", f"{TRACE:032X}"]),
        st.sampled_from([f"{SPAN:016x}", "0" * 16, f"{SPAN:015x}"]),
        st.sampled_from(["00", "01", "09", "ff", "0"]),
        st.sampled_from(["", "-later", "-", " "]),
    ),
)


def library_parent(value: str) -> Parent | None:
    context = get_current_span(LIBRARY.extract({"traceparent": value})).get_span_context()
    if not context.is_valid:
        return None
    return Parent(context.trace_id, context.span_id, int(context.trace_flags))


@given(headers)
def test_the_w3c_reading_agrees_with_opentelemetrys_propagator(value: str) -> None:
    ours = W3C.extract({"traceparent": value})
    theirs = library_parent(value)
    if theirs is None:
        assert ours is None
    else:
        assert ours is not None
        assert (ours.trace_id, ours.span_id, ours.flags & 1) == (
            theirs.trace_id,
            theirs.span_id,
            theirs.flags & 1,
        )


def test_what_the_proxy_writes_opentelemetry_reads_back() -> None:
    for sampled in (True, False):
        out: dict[str, str] = {}
        W3C.inject(out, Parent(TRACE, SPAN, 0, "vendor=1"), sampled)
        assert library_parent(out["traceparent"]) == Parent(TRACE, SPAN, int(sampled))
        assert out["tracestate"] == "vendor=1"


def test_b3_is_read_and_written_by_the_b3_library_and_the_last_listed_wins() -> None:
    b3 = Propagation.from_environ({"OTEL_PROPAGATORS": "tracecontext,b3multi"})
    client = {
        "traceparent": f"00-{OTHER_TRACE:032x}-{OTHER_SPAN:016x}-01",
        "x-b3-traceid": f"{TRACE:032x}",
        "x-b3-spanid": f"{SPAN:016x}",
        "x-b3-sampled": "1",
    }
    parent = b3.extract(client)
    assert parent is not None
    assert (parent.trace_id, parent.span_id) == (TRACE, SPAN)
    first = Propagation.from_environ({"OTEL_PROPAGATORS": "b3multi,tracecontext"}).extract(client)
    assert first is not None
    assert (first.trace_id, first.span_id) == (OTHER_TRACE, OTHER_SPAN)
    out: dict[str, str] = {}
    b3.inject(out, Parent(TRACE, 0x1234, 0), sampled=True)
    assert out["traceparent"] == f"00-{TRACE:032x}-{0x1234:016x}-01"
    read = get_current_span(B3MultiFormat().extract(out)).get_span_context()
    assert (read.trace_id, read.span_id, read.trace_flags.sampled) == (TRACE, 0x1234, True)


def test_none_turns_propagation_off_and_unset_means_tracecontext_and_baggage() -> None:
    off = Propagation.from_environ({"OTEL_PROPAGATORS": "none"})
    assert off.extract({"traceparent": f"00-{TRACE:032x}-{SPAN:016x}-01"}) is None
    out: dict[str, str] = {}
    off.inject(out, Parent(TRACE, SPAN, 1), sampled=True)
    assert out == {}
    assert Propagation.from_environ({}).names == ("tracecontext", "baggage")
    assert Propagation.from_environ({"OTEL_PROPAGATORS": " B3 , tracecontext"}).names == (
        "b3",
        "tracecontext",
    )


def test_an_unknown_propagator_is_a_configuration_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="no propagator named 'jaegerish'"):
        Propagation.from_environ({"OTEL_PROPAGATORS": "tracecontext,jaegerish"})


def test_a_b3_client_trace_continues_through_the_proxy_and_upstream(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    receiver = OTLPReceiver().start()
    try:
        environ = {"OTEL_PROPAGATORS": "tracecontext,b3", "OTEL_BSP_SCHEDULE_DELAY": "50"}
        proxy = make_proxy(otlp_endpoint=receiver.endpoint, environ=environ)
        upstream.script.push(
            completion(tool_calls=[tool_call("get_order_details", {"order_id": "W1"})])
        )
        with proxy.http() as http:
            response = http.post(
                "/v1/chat/completions",
                json=make_request(),
                headers={"b3": f"{TRACE:032x}-{SPAN:016x}-1", "baggage": "tenant=agents"},
            )
        assert response.status_code == 200
        assert proxy.app.state.pipeline.tracing.force_flush()
        spans = [s for s in receiver.wait_for(2) if s.trace_id == f"{TRACE:032x}"]
        server = next(s for s in spans if s.kind == "SERVER")
        attempt = next(s for s in spans if s.kind == "CLIENT")
        assert server.parent_span_id == f"{SPAN:016x}"
        sent = upstream.script.request_headers[-1]
        assert sent["b3"] == f"{TRACE:032x}-{attempt.span_id}-1"
        assert sent["traceparent"] == f"00-{TRACE:032x}-{attempt.span_id}-01"
        assert sent["baggage"] == "tenant=agents"
    finally:
        receiver.stop()
