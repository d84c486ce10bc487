"""The chat-completions pipeline end to end: the real openai SDK → proxy (uvicorn) → scripted upstream."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from proxy.testing import Fault, completion, tool_call
from tests.proxy.builders import make_request
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.metrics_text import metric

VALID_CANCEL = tool_call("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"})


def chat(
    proxy: RunningProxy, session: str, request: dict[str, Any] | None = None, **headers: str
) -> Any:
    client = proxy.client()
    body = request or make_request()
    return client.chat.completions.with_raw_response.create(
        **body, extra_headers={"x-session-id": session, **headers}
    )


def test_hallucinated_tool_is_reasked_and_client_receives_the_valid_call(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        completion(tool_calls=[tool_call("cancel_order", {"order_id": "#W1"}, id="call_bad")]),
        completion(tool_calls=[VALID_CANCEL]),
    )
    raw = chat(proxy, "s-halluc")
    message = raw.parse().choices[0].message
    assert message.tool_calls[0].function.name == "cancel_pending_order"
    assert raw.headers["x-toolsentry-repairs"] == "1"
    assert raw.headers["x-toolsentry-violations"] == "unknown_tool"
    assert raw.headers["x-toolsentry-errors"] == "0"
    # The re-ask carried the bad call back with a corrective tool message naming the real tools.
    reask = upstream.script.requests[1]["messages"]
    assert reask[-2]["role"] == "assistant"
    assert reask[-1]["role"] == "tool"
    assert reask[-1]["tool_call_id"] == "call_bad"
    assert "cancel_order" in reask[-1]["content"]
    assert "cancel_pending_order" in reask[-1]["content"]
    session = proxy.session("s-halluc")
    assert session["channels"] == {"unknown_tool": 1}
    assert session["repairs"] == 1
    assert session["errors"] == 0


def test_the_clients_headers_reach_the_upstream_on_every_attempt_but_its_key_and_controls(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(
        upstreams=[{"name": "s", "base_url": upstream.base_url, "api_key_env": "UPSTREAM_KEY"}],
        environ={"UPSTREAM_KEY": "upstream-secret"},
    )
    upstream.script.push(
        completion(tool_calls=[tool_call("cancel_order", {"order_id": "#W1"})]),
        completion(tool_calls=[VALID_CANCEL]),
    )
    raw = chat(proxy, "s-headers", **{"x-request-id": "req-42", "x-tenant": "acme"})
    assert raw.headers["x-toolsentry-repairs"] == "1"
    first, reask = upstream.script.request_headers
    for sent in (first, reask):
        assert (sent["x-request-id"], sent["x-tenant"]) == ("req-42", "acme")
        assert sent["authorization"] == "Bearer upstream-secret"  # never the client's key
        assert sent["content-type"] == "application/json"
        assert not [name for name in sent if name.startswith("x-toolsentry-")]
    assert first["content-length"] != reask["content-length"]  # each body's own length


def test_request_controls_for_the_proxy_are_not_sent_upstream(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(completion("Hi."))
    chat(proxy, "s-controls", **{"x-toolsentry-repair": "off", "x-toolsentry-max-errors": "3"})
    [sent] = upstream.script.request_headers
    assert "authorization" not in sent  # no key configured: the client's is not passed on
    assert not [name for name in sent if name.startswith("x-toolsentry-")]
    assert sent["x-session-id"] == "s-controls"


@pytest.mark.parametrize(
    ("bad_call", "channel"),
    [
        (
            tool_call("cancel_pending_order", '{"order_id": "#W1", "reason": '),
            "malformed_arguments",
        ),
        (tool_call("cancel_pending_order", {"order_id": "#W1"}), "schema_violation"),
        (
            tool_call("cancel_pending_order", {"order_id": "#W1", "reason": "bored"}),
            "schema_violation",
        ),
    ],
)
def test_malformed_and_schema_violating_arguments_are_repaired(
    proxy: RunningProxy, upstream: RunningUpstream, bad_call: dict[str, Any], channel: str
) -> None:
    upstream.script.push(completion(tool_calls=[bad_call]), completion(tool_calls=[VALID_CANCEL]))
    raw = chat(proxy, f"s-{channel}")
    call = raw.parse().choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments) == {"order_id": "#W1", "reason": "no longer needed"}
    assert raw.headers["x-toolsentry-violations"] == channel
    assert raw.headers["x-toolsentry-repairs"] == "1"


def test_tool_choice_required_without_a_call_is_reasked_with_a_user_message(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(completion("I will cancel it."), completion(tool_calls=[VALID_CANCEL]))
    raw = chat(proxy, "s-choice", make_request(tool_choice="required"))
    assert raw.parse().choices[0].message.tool_calls[0].function.name == "cancel_pending_order"
    assert raw.headers["x-toolsentry-violations"] == "tool_choice_violation"
    assert upstream.script.requests[1]["messages"][-1]["role"] == "user"


def test_an_unrepairable_call_passes_through_and_costs_one_error(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(on_unrepaired="passthrough")
    upstream.script.push(completion(tool_calls=[tool_call("refund_everything", {})]))
    raw = chat(proxy, "s-unrepaired")
    message = raw.parse().choices[0].message
    assert message.tool_calls[0].function.name == "refund_everything"
    assert raw.headers["x-toolsentry-errors"] == "1"
    assert raw.headers["x-toolsentry-repairs"] == "0"
    assert raw.headers["x-toolsentry-violations"] == "unknown_tool"
    assert len(upstream.script.requests) == 3  # the original and max_reasks=2 re-asks
    session = proxy.session("s-unrepaired")
    assert session["errors"] == 1
    assert session["channels"] == {"unknown_tool": 1}


def test_repair_off_passes_the_failure_through_without_reasking(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(repair="off")
    upstream.script.push(completion(tool_calls=[tool_call("cancel_order", {})]))
    raw = chat(proxy, "s-off")
    assert raw.headers["x-toolsentry-errors"] == "1"
    assert len(upstream.script.requests) == 1


def test_request_header_switches_repair_off_when_overrides_are_allowed(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(completion(tool_calls=[tool_call("cancel_order", {})]))
    raw = chat(proxy, "s-hdr-off", **{"x-toolsentry-repair": "off"})
    assert raw.headers["x-toolsentry-errors"] == "1"
    assert len(upstream.script.requests) == 1


def test_the_max_errors_th_error_makes_the_next_request_fail_with_429_without_sdk_retries(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(repair="off", max_errors=2)
    upstream.script.push(completion(tool_calls=[tool_call("cancel_order", {})]))
    assert chat(proxy, "s-budget").headers["x-toolsentry-errors"] == "1"
    assert chat(proxy, "s-budget").headers["x-toolsentry-errors"] == "2"
    asked_upstream = len(upstream.script.requests)
    attempts: list[httpx.Request] = []
    client = proxy.client(
        max_retries=3, http_client=httpx.Client(event_hooks={"request": [attempts.append]})
    )
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(**make_request(), extra_headers={"x-session-id": "s-budget"})
    assert caught.value.status_code == 429
    assert caught.value.body["type"] == "error_budget_exhausted"  # type: ignore[index]
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert len(attempts) == 1  # the SDK did not retry
    assert len(upstream.script.requests) == asked_upstream  # nor did the proxy forward it
    assert proxy.session("s-budget")["exhausted"] is True


def test_a_request_may_lower_its_budget_with_a_header(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(completion(tool_calls=[tool_call("cancel_order", {})]))
    headers = {"x-toolsentry-max-errors": "1", "x-toolsentry-repair": "off"}
    raw = chat(proxy, "s-lower", **headers)
    assert raw.headers["x-toolsentry-max-errors"] == "1"
    with pytest.raises(openai.RateLimitError):
        chat(proxy, "s-lower", **headers)
    raised = chat(proxy, "s-raise", **{"x-toolsentry-max-errors": "50"})
    assert raised.headers["x-toolsentry-max-errors"] == "10"  # lower only


def test_finish_policy_ends_the_session_with_a_normal_completion(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(repair="off", max_errors=1, exhaustion_policy="finish")
    upstream.script.push(completion(tool_calls=[tool_call("cancel_order", {})]))
    chat(proxy, "s-finish")
    raw = chat(proxy, "s-finish")
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "stop"
    assert not choice.message.tool_calls
    assert "error budget" in (choice.message.content or "")


def test_observe_policy_counts_past_the_budget_and_never_refuses(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(repair="off", max_errors=1, exhaustion_policy="observe")
    upstream.script.push(completion(tool_calls=[tool_call("cancel_order", {})]))
    for expected in ("1", "2", "3"):
        assert chat(proxy, "s-observe").headers["x-toolsentry-errors"] == expected
    assert proxy.session("s-observe")["exhausted"] is True


def _with_tool_result(
    call_id: str, content: str, *, name: str = "get_order_details"
) -> dict[str, Any]:
    request = make_request()
    request["messages"] += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [tool_call(name, {"order_id": "#W9"}, id=call_id)],
        },
        {"role": "tool", "tool_call_id": call_id, "content": content},
    ]
    return request


def test_a_tool_error_in_a_later_request_is_counted_once_across_turns(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(completion("Sorry, that order does not exist."))
    request = _with_tool_result("call_e1", "Error: Order not found")
    for _ in range(3):  # the agent resends its history every turn
        raw = chat(proxy, "s-toolerr", request)
    assert raw.headers["x-toolsentry-errors"] == "1"
    session = proxy.session("s-toolerr")
    assert session["channels"] == {"tool_error": 1}
    assert session["requests"] == 3


def test_a_tool_error_for_a_call_already_counted_as_unrepaired_is_not_counted_twice(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(repair="off")
    upstream.script.push(
        completion(tool_calls=[tool_call("cancel_order", {}, id="call_x")]), completion("ok")
    )
    assert chat(proxy, "s-dup").headers["x-toolsentry-errors"] == "1"
    follow_up = _with_tool_result(
        "call_x", "Error: Tool 'cancel_order' not found.", name="cancel_order"
    )
    assert chat(proxy, "s-dup", follow_up).headers["x-toolsentry-errors"] == "1"


def test_sqlite_store_keeps_a_sessions_counts_across_a_proxy_restart(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, tmp_path: Any
) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    upstream.script.push(completion(tool_calls=[tool_call("cancel_order", {})]))
    first = make_proxy(repair="off", store=store)
    chat(first, "s-restart")
    chat(first, "s-restart")
    first.server.stop()
    second = make_proxy(repair="off", store=store)
    assert second.session("s-restart")["errors"] == 2
    assert chat(second, "s-restart").headers["x-toolsentry-errors"] == "3"


def test_usage_sums_every_attempt(proxy: RunningProxy, upstream: RunningUpstream) -> None:
    upstream.script.push(
        completion(
            tool_calls=[tool_call("cancel_order", {})],
            usage={"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
        ),
        completion(
            tool_calls=[VALID_CANCEL],
            usage={"prompt_tokens": 150, "completion_tokens": 12, "total_tokens": 162},
        ),
    )
    usage = chat(proxy, "s-usage").parse().usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (250, 22, 272)


def test_unknown_request_and_response_fields_pass_through_unchanged(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(completion("hi", kv_transfer_params={"k": 1}))
    client = proxy.client()
    raw = client.chat.completions.with_raw_response.create(
        **make_request(), extra_body={"top_k": 7, "guided_json": {"type": "object"}}
    )
    assert upstream.script.requests[-1]["top_k"] == 7
    assert upstream.script.requests[-1]["guided_json"] == {"type": "object"}
    assert json.loads(raw.text)["kv_transfer_params"] == {"k": 1}


def test_the_upstream_gets_the_clients_body_as_sent_and_a_reask_its_own(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        completion(tool_calls=[tool_call("cancel_order", {})]),
        completion(tool_calls=[VALID_CANCEL]),
    )
    sent = json.dumps(make_request(), indent=2).encode()  # not how the proxy would write it
    with proxy.http() as http:
        response = http.post(
            "/v1/chat/completions", content=sent, headers={"content-type": "application/json"}
        )
    assert response.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == (
        "cancel_pending_order"
    )
    first, reask = upstream.script.raw_requests[-2:]
    assert first == sent
    assert len(json.loads(reask)["messages"]) > len(json.loads(sent)["messages"])


def test_metrics_count_what_happened(proxy: RunningProxy, upstream: RunningUpstream) -> None:
    upstream.script.push(
        completion(tool_calls=[tool_call("cancel_order", {})]),  # repaired on re-ask
        completion(tool_calls=[VALID_CANCEL]),
        completion(tool_calls=[VALID_CANCEL]),  # valid at once
    )
    chat(proxy, "s-m1")
    chat(proxy, "s-m2")
    text = proxy.metrics()
    model = "scripted-model"
    assert metric(text, "toolsentry_requests_total", api="chat", model=model, status="200") == 2
    assert (
        metric(text, "toolsentry_violations_total", api="chat", model=model, channel="unknown_tool")
        == 1
    )
    assert (
        metric(
            text,
            "toolsentry_repairs_total",
            api="chat",
            model=model,
            channel="unknown_tool",
            result="success",
        )
        == 1
    )
    assert (
        metric(text, "toolsentry_tool_calls_total", api="chat", model=model, outcome="repaired")
        == 1
    )
    assert (
        metric(text, "toolsentry_tool_calls_total", api="chat", model=model, outcome="valid") == 1
    )
    assert metric(text, "toolsentry_upstream_seconds_count", api="chat", model=model) == 2


def test_hallucinated_names_are_ranked_per_model(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(completion(tool_calls=[tool_call("cancel_order", {})]))
    chat(proxy, "s-rank", **{"x-toolsentry-repair": "off"})
    chat(proxy, "s-rank2", **{"x-toolsentry-repair": "off"})
    with proxy.http() as http:
        stats = http.get("/v1/stats/unknown-tools").json()
    assert stats["models"]["scripted-model"] == [{"name": "cancel_order", "count": 2}]


def test_upstream_503_is_retried_before_the_client_sees_anything(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(Fault(503, {"error": {"message": "warming up"}}), completion("ready"))
    raw = chat(proxy, "s-retry")
    assert raw.parse().choices[0].message.content == "ready"
    assert len(upstream.script.requests) == 2


def test_upstream_bad_request_reaches_the_client_with_the_upstreams_message(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        Fault(
            400,
            {
                "error": {
                    "message": "max_tokens is too large",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            },
        )
    )
    with pytest.raises(openai.BadRequestError, match="max_tokens is too large"):
        chat(proxy, "s-400")


def test_a_200_that_is_not_a_chat_completion_is_a_clear_502(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push({"unexpected": True})
    with pytest.raises(openai.APIStatusError) as caught:
        chat(proxy, "s-proto")
    assert caught.value.status_code == 502
    assert "not a chat completion" in caught.value.message
    assert proxy.session("s-proto")["channels"] == {"upstream_error": 1}


@pytest.mark.parametrize(
    ("failure", "channels"),
    [
        (Fault(400, {"error": {"message": "prompt too long"}}), {"unknown_tool": 1}),
        (
            Fault(500, {"error": {"message": "engine died"}}),
            {"unknown_tool": 1, "upstream_error": 1},
        ),
        (b"not json", {"unknown_tool": 1, "upstream_error": 1}),
    ],
    ids=["400", "500", "not-json"],
)
def test_a_failed_reask_passes_the_original_failure_through_as_one_request(
    make_proxy: Callable[..., RunningProxy],
    upstream: RunningUpstream,
    failure: Fault | bytes,
    channels: dict[str, int],
) -> None:
    proxy = make_proxy(on_unrepaired="passthrough")
    bad = tool_call("cancel_order", {"order_id": "#W1"})
    reply = failure if isinstance(failure, Fault) else Fault(200, failure)
    upstream.script.push(completion(tool_calls=[bad]), reply)
    raw = chat(proxy, "s-reask-failed")
    assert raw.parse().choices[0].message.tool_calls[0].function.name == "cancel_order"
    assert len(upstream.script.requests) == 2  # a failed re-ask is not retried by another
    record = proxy.session("s-reask-failed")
    assert (record["errors"], record["channels"]) == (1, channels)
    text = proxy.metrics()
    requests = {
        status: metric(
            text,
            "toolsentry_requests_total",
            api="chat",
            may_be_absent=True,
            model="scripted-model",
            status=status,
        )
        for status in ("200", "400", "500", "502")
    }
    assert requests == {"200": 1, "400": 0, "500": 0, "502": 0}


LEAKED_AND_CUT = (
    '<tool_call>\n{"name": "cancel_order", "arguments": {"order_id": "#W1"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_order_'
)


def test_a_reask_that_fails_otherwise_is_reported_and_counted_as_what_the_client_gets(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        completion(tool_calls=[tool_call("cancel_order", {"order_id": "#W1"})]),
        completion(LEAKED_AND_CUT, finish_reason="length"),
    )
    raw = chat(proxy, "s-otherwise")
    assert raw.parse().choices[0].message.content == LEAKED_AND_CUT
    assert raw.headers["x-toolsentry-violations"] == "unknown_tool,leaked_tool_call,truncated"
    assert raw.headers["x-toolsentry-errors"] == "2"
    record = proxy.session("s-otherwise")
    assert (record["errors"], record["channels"]) == (
        2,
        {"unknown_tool": 1, "leaked_tool_call": 1, "truncated": 1},
    )
    text = proxy.metrics()
    for channel in ("unknown_tool", "leaked_tool_call", "truncated"):
        counted = metric(
            text, "toolsentry_violations_total", api="chat", model="scripted-model", channel=channel
        )
        assert counted == 1, channel


def test_a_failure_repeated_on_every_reask_is_counted_once(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(completion(tool_calls=[tool_call("cancel_order", {"order_id": "#W1"})]))
    raw = chat(proxy, "s-repeated")
    assert len(upstream.script.requests) == 3
    assert raw.headers["x-toolsentry-violations"] == "unknown_tool"
    record = proxy.session("s-repeated")
    assert (record["errors"], record["channels"]) == (1, {"unknown_tool": 1})


@pytest.mark.parametrize("how", ["setting", "header"])
def test_repair_off_observes_only_an_undeclared_tool_reaches_the_client_unchanged(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, how: str
) -> None:
    # The default on_unrepaired strips an undeclared tool's call only where a repair was tried:
    # with repair off (set, or asked for by x-toolsentry-repair) the proxy validates and counts.
    proxy = make_proxy(repair="off") if how == "setting" else make_proxy()
    upstream.script.push(completion(tool_calls=[tool_call("refund_everything", {}), VALID_CANCEL]))
    session = f"s-observe-{how}"
    with proxy.http() as http:
        response = http.post(
            "/v1/chat/completions",
            json=make_request(),
            headers={"x-session-id": session}
            | ({"x-toolsentry-repair": "off"} if how == "header" else {}),
        )
    calls = response.json()["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["refund_everything", "cancel_pending_order"]
    assert len(upstream.script.requests) == 1  # nothing re-asked
    record = proxy.session(session)
    assert (record["errors"], record["channels"]) == (1, {"unknown_tool": 1})


def test_on_unrepaired_strip_removes_the_invalid_call_which_still_costs_its_error(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(repair="off", on_unrepaired="strip")
    upstream.script.push(completion(tool_calls=[tool_call("refund_everything", {}), VALID_CANCEL]))
    raw = chat(proxy, "s-strip-call")
    choice = raw.parse().choices[0]
    assert [c.function.name for c in choice.message.tool_calls] == ["cancel_pending_order"]
    assert raw.headers["x-toolsentry-errors"] == "1"  # the agent lost the call it was to make
    assert raw.headers["x-toolsentry-violations"] == "unknown_tool"
    session = proxy.session("s-strip-call")
    assert (session["errors"], session["channels"]) == (1, {"unknown_tool": 1})
    text = proxy.metrics()
    assert (
        metric(
            text,
            "toolsentry_tool_calls_total",
            api="chat",
            model="scripted-model",
            outcome="stripped",
        )
        == 1
    )


def test_on_unrepaired_strip_counts_a_call_leaked_into_content_which_it_cannot_strip(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(repair="off", on_unrepaired="strip")
    leaked = '<tool_call>\n{"name": "cancel_pending_order", "arguments": {"order_id": "#W1"}}\n</tool_call>'
    upstream.script.push(completion(leaked))
    raw = chat(proxy, "s-strip-leak")
    assert raw.parse().choices[0].message.content == leaked  # the client gets what it got
    assert raw.headers["x-toolsentry-errors"] == "1"
    assert raw.headers["x-toolsentry-violations"] == "leaked_tool_call"
    session = proxy.session("s-strip-leak")
    assert (session["errors"], session["channels"]) == (1, {"leaked_tool_call": 1})
