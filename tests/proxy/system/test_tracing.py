"""Traces end to end: the real proxy, the real OTLP exporter, a real OTLP/HTTP receiver."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from proxy import tracing
from proxy.testing import SSE, Fault, answer, call, completion, tool_call
from tests.proxy.builders import make_request
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.metrics_text import metric
from tests.proxy.otlp_receiver import OTLPReceiver, ReceivedSpan

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
ORDER_PARAMS = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}},
    "required": ["order_id"],
}

HALLUCINATED = completion(
    tool_calls=[tool_call("get_order", {"order_id": "W1"}, id="call_x")],
    usage={"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
)
VALID = completion(
    tool_calls=[tool_call("get_order_details", {"order_id": "W1"}, id="call_y")],
    usage={"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
)


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    running = OTLPReceiver().start()
    yield running
    running.stop()


@pytest.fixture
def traced(make_proxy: Callable[..., RunningProxy], receiver: OTLPReceiver) -> RunningProxy:
    return make_proxy(otlp_endpoint=receiver.endpoint)


def spans_of(receiver: OTLPReceiver, count: int) -> list[ReceivedSpan]:
    spans = receiver.wait_for(count)
    return [s for s in spans if s.trace_id == CLIENT_TRACE]


def post(proxy: RunningProxy, body: dict[str, object], **headers: str) -> httpx.Response:
    with proxy.http() as http:
        return http.post(
            "/v1/chat/completions",
            json=body,
            headers={"traceparent": TRACEPARENT, "x-session-id": "traced-1", **headers},
        )


def test_a_repaired_request_has_a_server_span_two_attempts_and_one_guardrail(
    traced: RunningProxy, upstream: RunningUpstream, receiver: OTLPReceiver
) -> None:
    upstream.script.push(HALLUCINATED, VALID)
    response = post(traced, make_request())
    assert response.status_code == 200
    assert response.headers["x-toolsentry-repairs"] == "1"

    spans = spans_of(receiver, 4)
    server = next(s for s in spans if s.kind == "SERVER")
    attempts = sorted((s for s in spans if s.kind == "CLIENT"), key=lambda s: s.start_ns)
    guardrails = [s for s in spans if s.kind == "INTERNAL"]
    assert server.parent_span_id == CLIENT_SPAN
    assert server.name == "chat scripted-model"
    assert server.attributes[tracing.OPERATION] == "chat"
    assert server.attributes[tracing.REQUEST_MODEL] == "scripted-model"
    assert server.attributes[tracing.RESPONSE_MODEL] == "scripted-model"
    assert server.attributes[tracing.CONVERSATION] == "traced-1"
    assert server.attributes[tracing.API] == "chat"
    assert server.attributes[tracing.REPAIRS] == 1
    assert server.attributes[tracing.SESSION_ERRORS] == 0
    assert server.attributes[tracing.SESSION_EXHAUSTED] is False
    assert server.attributes[tracing.FINISH_REASONS] == ["tool_calls"]
    # Usage sums every attempt, as the client's does.
    assert (server.attributes[tracing.INPUT_TOKENS], server.attributes[tracing.OUTPUT_TOKENS]) == (
        21,
        8,
    )
    assert server.attributes[tracing.HTTP_STATUS] == 200
    assert [a.attributes[tracing.ATTEMPT_KIND] for a in attempts] == ["first", "reask"]
    assert all(a.parent_span_id == server.span_id for a in attempts)
    assert attempts[0].attributes[tracing.PROVIDER] == "scripted"
    assert {a.name for a in attempts} == {"chat scripted-model"}
    assert attempts[0].attributes[tracing.REQUEST_MODEL] == "scripted-model"
    (guardrail,) = guardrails
    assert guardrail.parent_span_id == attempts[0].span_id
    assert guardrail.attributes[tracing.CHANNEL] == "unknown_tool"
    assert guardrail.attributes[tracing.TOOL_NAME] == "get_order"
    assert guardrail.attributes[tracing.REPAIRED] is True
    assert guardrail.attributes[tracing.DECISION] == "modify"
    assert guardrail.attributes[tracing.TARGET_ID] == "call_x"
    # Message bodies are not on any span.
    assert not any("W1" in repr(s.attributes) for s in spans)
    # Each upstream request carried its own attempt span as parent: the proxy sits between.
    forwarded = [h["traceparent"] for h in upstream.script.request_headers]
    assert forwarded == [f"00-{CLIENT_TRACE}-{a.span_id}-01" for a in attempts]


def test_each_answer_with_violations_gets_its_guardrails_under_its_own_try(
    traced: RunningProxy, upstream: RunningUpstream, receiver: OTLPReceiver
) -> None:
    # The first answer calls an unknown tool, the first re-ask's breaks the schema, the second
    # re-ask's is valid: a guardrail record for each broken answer, under the try that got it.
    upstream.script.push(
        HALLUCINATED,
        completion(tool_calls=[tool_call("get_order_details", {"order_id": 7}, id="call_z")]),
        VALID,
    )
    response = post(traced, make_request())
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["tool_calls"][0]["id"] == "call_y"

    spans = spans_of(receiver, 6)
    attempts = sorted((s for s in spans if s.kind == "CLIENT"), key=lambda s: s.start_ns)
    guardrails = sorted((s for s in spans if s.kind == "INTERNAL"), key=lambda s: s.start_ns)
    assert [a.attributes[tracing.ATTEMPT_KIND] for a in attempts] == ["first", "reask", "reask"]
    assert [(g.parent_span_id, g.attributes[tracing.CHANNEL]) for g in guardrails] == [
        (attempts[0].span_id, "unknown_tool"),
        (attempts[1].span_id, "schema_violation"),
    ]
    assert guardrails[1].attributes[tracing.SCHEMA_POINTER] == ["/order_id"]
    assert guardrails[1].attributes[tracing.TARGET_ID] == "call_z"
    # The repair as a whole succeeded: each record says so.
    assert all(g.attributes[tracing.REPAIRED] is True for g in guardrails)
    assert all(g.attributes[tracing.DECISION] == "modify" for g in guardrails)


def test_a_repair_that_fails_records_every_answers_violations_as_unrepaired(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, receiver: OTLPReceiver
) -> None:
    proxy = make_proxy(otlp_endpoint=receiver.endpoint, max_reasks=1, on_unrepaired="passthrough")
    upstream.script.push(HALLUCINATED, HALLUCINATED)
    assert post(proxy, make_request()).status_code == 200
    spans = spans_of(receiver, 5)
    attempts = sorted((s for s in spans if s.kind == "CLIENT"), key=lambda s: s.start_ns)
    guardrails = sorted((s for s in spans if s.kind == "INTERNAL"), key=lambda s: s.start_ns)
    assert [g.parent_span_id for g in guardrails] == [a.span_id for a in attempts]
    assert [g.attributes[tracing.REPAIRED] for g in guardrails] == [False, False]
    assert [g.attributes[tracing.DECISION] for g in guardrails] == ["warn", "warn"]


def test_a_constrained_reask_the_upstream_refuses_and_its_plain_fallback_are_named_apart(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, receiver: OTLPReceiver
) -> None:
    proxy = make_proxy(otlp_endpoint=receiver.endpoint, repair="constrain")

    def without_structured_outputs(request: dict[str, object]) -> object:
        if request.get("tool_choice") not in (None, "auto"):  # what a constrained re-ask asks
            return Fault(400, {"error": {"message": "Unrecognized request argument: strict"}})
        return HALLUCINATED if len(request["messages"]) == 2 else VALID  # type: ignore[arg-type]

    upstream.script.handler = without_structured_outputs
    response = post(proxy, make_request())
    assert response.status_code == 200
    assert response.headers["x-toolsentry-repairs"] == "1"
    spans = spans_of(receiver, 5)
    attempts = sorted((s for s in spans if s.kind == "CLIENT"), key=lambda s: s.start_ns)
    assert [
        (a.attributes[tracing.ATTEMPT_KIND], a.attributes[tracing.HTTP_STATUS], a.status)
        for a in attempts
    ] == [("first", 200, "UNSET"), ("reask", 400, "ERROR"), ("fallback", 200, "UNSET")]
    (guardrail,) = (s for s in spans if s.kind == "INTERNAL")
    assert guardrail.parent_span_id == attempts[0].span_id


def test_a_shadow_call_is_a_try_of_its_own_under_the_requests_span(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, receiver: OTLPReceiver
) -> None:
    proxy = make_proxy(
        otlp_endpoint=receiver.endpoint,
        upstreams=[
            {"name": "scripted", "base_url": upstream.base_url, "models": ["scripted-model"]},
            {"name": "reference", "base_url": upstream.base_url, "models": ["reference-model"]},
        ],
        shadow={"reference": "reference", "sample": 1.0},
    )
    upstream.script.handler = lambda request: VALID
    # The second request's shadow call goes out on the connection the first one left idle (its
    # try's span ends once the connection is back in the pool), its answer read by the
    # connection's callback: a try of the same kind, under its own request's span.
    assert post(proxy, make_request()).status_code == 200
    spans_of(receiver, 3)
    assert post(proxy, make_request()).status_code == 200
    spans = spans_of(receiver, 6)
    forwarded = {h["traceparent"] for h in upstream.script.request_headers}
    servers = [s for s in spans if s.kind == "SERVER"]
    assert len(servers) == 2
    for server in servers:
        attempts = {
            a.attributes[tracing.ATTEMPT_KIND]: a
            for a in spans
            if a.kind == "CLIENT" and a.parent_span_id == server.span_id
        }
        assert set(attempts) == {"first", "shadow"}
        assert attempts["first"].attributes[tracing.PROVIDER] == "scripted"
        assert attempts["shadow"].attributes[tracing.PROVIDER] == "reference"
        assert attempts["shadow"].attributes[tracing.ATTEMPT_TRY] == 1
        # The reference was asked with the shadow try's own span as its parent.
        assert {f"00-{CLIENT_TRACE}-{a.span_id}-01" for a in attempts.values()} <= forwarded
    assert len(forwarded) == 4


def test_a_schema_violation_names_its_json_pointer_and_an_unrepaired_one_is_a_warning(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, receiver: OTLPReceiver
) -> None:
    proxy = make_proxy(otlp_endpoint=receiver.endpoint, repair="off")
    upstream.script.push(completion(tool_calls=[tool_call("get_order_details", {"order_id": 7})]))
    assert post(proxy, make_request()).status_code == 200
    guardrail = next(s for s in spans_of(receiver, 3) if s.kind == "INTERNAL")
    assert guardrail.attributes[tracing.CHANNEL] == "schema_violation"
    assert guardrail.attributes[tracing.SCHEMA_POINTER] == ["/order_id"]
    assert guardrail.attributes[tracing.DECISION] == "warn"
    assert guardrail.attributes[tracing.REPAIRED] is False


def test_a_stream_ends_its_span_when_the_stream_ends_with_the_streams_status(
    traced: RunningProxy, upstream: RunningUpstream, receiver: OTLPReceiver
) -> None:
    upstream.script.push(SSE.of(VALID, drop_after=2))  # the upstream dies mid-stream
    with (
        traced.http() as http,
        http.stream(
            "POST",
            "/v1/chat/completions",
            json=make_request(stream=True),
            headers={"traceparent": TRACEPARENT},
        ) as response,
    ):
        assert response.status_code == 200
        text = "".join(response.iter_text())
    assert "error" in text
    server = next(s for s in spans_of(receiver, 2) if s.kind == "SERVER")
    assert server.attributes[tracing.STREAM] is True
    assert server.status == "ERROR"
    # The status the proxy counted for this request (its error's, not the 200 it began with).
    status = server.attributes[tracing.HTTP_STATUS]
    assert status >= 500
    counted = metric(
        traced.metrics(),
        "toolsentry_requests_total",
        model="scripted-model",
        status=str(status),
        api="chat",
    )
    assert counted == 1
    attempt = next(s for s in spans_of(receiver, 2) if s.kind == "CLIENT")
    assert attempt.status == "ERROR"
    assert attempt.end_ns <= server.end_ns


def test_retries_get_a_span_each(
    traced: RunningProxy, upstream: RunningUpstream, receiver: OTLPReceiver
) -> None:
    upstream.script.push(Fault(503), VALID)
    assert post(traced, make_request()).status_code == 200
    attempts = sorted(
        (s for s in spans_of(receiver, 3) if s.kind == "CLIENT"), key=lambda s: s.start_ns
    )
    assert [
        (a.attributes[tracing.ATTEMPT_KIND], a.attributes[tracing.HTTP_STATUS]) for a in attempts
    ] == [
        ("first", 503),
        ("retry", 200),
    ]


def test_a_receiver_stopped_mid_run_changes_no_response_and_drops_are_counted(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    receiver = OTLPReceiver().start()
    traced = make_proxy(otlp_endpoint=receiver.endpoint)
    untraced = make_proxy()
    upstream.script.push(VALID)
    before = post(traced, make_request())
    assert receiver.wait_for(2)
    receiver.stop()
    for _ in range(5):
        during = post(traced, make_request())
        assert during.status_code == 200
        assert during.json()["choices"] == before.json()["choices"]
        assert during.json()["choices"] == post(untraced, make_request()).json()["choices"]
    app = traced.app
    tracer = app.state.pipeline.tracing
    assert tracer is not None
    tracer.force_flush(5000)
    # Five requests of two spans each could not be delivered; each one is counted once.
    assert (
        metric(traced.metrics(), "toolsentry_trace_spans_dropped_total", reason="export_failed")
        >= 2
    )


def test_without_an_endpoint_nothing_is_traced_and_the_clients_traceparent_passes_through(
    proxy: RunningProxy, upstream: RunningUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    def traced(*args: object, **kwargs: object) -> None:
        raise AssertionError("tracing work with tracing off")

    # Off, no span is built and no request trace begun: either would fail the request.
    monkeypatch.setattr(tracing.SpanRecord, "__init__", traced)
    monkeypatch.setattr(tracing.RequestTrace, "__init__", traced)
    upstream.script.push(HALLUCINATED, VALID)
    response = post(proxy, make_request())
    assert response.status_code == 200
    assert response.headers["x-toolsentry-repairs"] == "1"
    assert proxy.app.state.pipeline.tracing is None
    assert upstream.script.request_headers[-1]["traceparent"] == TRACEPARENT


def test_a_responses_stream_is_traced_like_chat_with_its_own_api(
    traced: RunningProxy, upstream: RunningUpstream, receiver: OTLPReceiver
) -> None:
    upstream.script.push(
        answer(None, call("get_order", {"order_id": "W1"}, id="call_r")),
        answer(None, call("get_order_details", {"order_id": "W1"}, id="call_s")),
    )
    tools = [{"type": "function", "name": "get_order_details", "parameters": ORDER_PARAMS}]
    with (
        traced.http() as http,
        http.stream(
            "POST",
            "/v1/responses",
            json={
                "model": "scripted-model",
                "input": "Where is W1?",
                "tools": tools,
                "stream": True,
            },
            headers={"traceparent": TRACEPARENT},
        ) as response,
    ):
        assert response.status_code == 200
        "".join(response.iter_text())
    spans = spans_of(receiver, 4)
    server = next(s for s in spans if s.kind == "SERVER")
    assert server.attributes[tracing.API] == "responses"
    assert server.attributes[tracing.HTTP_ROUTE] == "/v1/responses"
    assert server.attributes[tracing.REPAIRS] == 1
    attempts = sorted((s for s in spans if s.kind == "CLIENT"), key=lambda s: s.start_ns)
    assert [a.attributes[tracing.ATTEMPT_KIND] for a in attempts] == ["first", "reask"]
    guardrail = next(s for s in spans if s.kind == "INTERNAL")
    assert guardrail.attributes[tracing.TOOL_NAME] == "get_order"
    assert guardrail.parent_span_id == attempts[0].span_id
