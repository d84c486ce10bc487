"""The Responses API through the turn, end to end: the real openai SDK → proxy (uvicorn) → a
scripted upstream speaking Responses."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.protocols.answer import Usage
from proxy.testing import SSE, answer, call
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.metrics_text import metric

MODEL = "scripted-model"


def function_tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "description": f"{name} tool",
        "parameters": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        },
        "strict": False,
    }


TOOLS = [
    function_tool("get_order_details", {"order_id": {"type": "string"}}, ["order_id"]),
    function_tool(
        "cancel_pending_order",
        {
            "order_id": {"type": "string"},
            "reason": {"type": "string", "enum": ["no longer needed", "ordered by mistake"]},
        },
        ["order_id", "reason"],
    ),
    {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "agents",
        "tools": [function_tool("spawn_agent", {"task": {"type": "string"}}, ["task"])],
    },
    {"type": "web_search", "external_web_access": False},
]

CANCEL = {"order_id": "#W1", "reason": "no longer needed"}


def make_request(text: str = "Cancel order #W1 please.", **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "instructions": "You are a retail agent.",
        "input": [{"type": "message", "role": "user", "content": text}],
        "tools": TOOLS,
        **extra,
    }


def function_calls(output: list[Any]) -> list[tuple[str, str | None, dict[str, Any]]]:
    return [
        (item.name, getattr(item, "namespace", None), json.loads(item.arguments))
        for item in output
        if item.type == "function_call"
    ]


def test_a_hallucinated_function_is_reasked_and_the_client_gets_the_valid_call(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        answer(None, call("cancel_order", {"order_id": "#W1"}, id="call_bad")),
        answer(None, call("cancel_pending_order", CANCEL, id="call_good")),
    )
    client = proxy.client()
    raw = client.responses.with_raw_response.create(**make_request())
    reply = raw.parse()
    assert function_calls(reply.output) == [("cancel_pending_order", None, CANCEL)]
    assert raw.headers["x-toolsentry-repairs"] == "1"
    assert raw.headers["x-toolsentry-violations"] == "unknown_tool"
    assert raw.headers["x-toolsentry-errors"] == "0"
    reask = upstream.script.requests[1]
    assert "stream" not in reask
    items = reask["input"]
    assert items[0] == make_request()["input"][0]
    assert [i["type"] for i in items[1:]] == ["function_call", "function_call_output"]
    assert items[1]["call_id"] == items[2]["call_id"] == "call_bad"
    assert items[2]["output"].startswith("Error: tool 'cancel_order' does not exist.")
    assert "cancel_pending_order" in items[2]["output"]
    assert "multi_agent_v1.spawn_agent" in items[2]["output"]


def test_usage_sums_every_attempt(proxy: RunningProxy, upstream: RunningUpstream) -> None:
    first = Usage(input_tokens=100, output_tokens=7, cached_tokens=40, reasoning_tokens=2)
    second = Usage(input_tokens=130, output_tokens=9, cached_tokens=60, reasoning_tokens=3)
    upstream.script.push(
        answer(None, call("cancel_order", {}), usage=first),
        answer(None, call("cancel_pending_order", CANCEL), usage=second),
    )
    usage = proxy.client().responses.create(**make_request()).usage
    assert usage is not None
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (230, 16, 246)
    assert usage.input_tokens_details.cached_tokens == 100
    assert usage.output_tokens_details.reasoning_tokens == 5


@pytest.mark.parametrize(
    ("reply", "channel"),
    [
        (answer(None, call("get_order_details", "{not json")), "malformed_arguments"),
        (answer(None, call("get_order_details", {"order_id": 7})), "schema_violation"),
        (answer(None, call("get_order_details", "[1]")), "malformed_arguments"),
        (answer("No call needed."), "tool_choice_violation"),
        (
            answer('<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}'),
            "leaked_tool_call",
        ),
        (
            answer(None, call("get_order_details", '{"order_id": "#W'), finish="length"),
            "truncated",
        ),
        (answer(""), "empty_response"),
        (answer(None, call("spawn_agent", {"task": "x"})), "unknown_tool"),
        (answer(None, call("spawn", {"task": "x"}, namespace="multi_agent_v1")), "unknown_tool"),
    ],
)
def test_every_channel_is_found_on_responses_output(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, reply: Any, channel: str
) -> None:
    proxy = make_proxy(repair="off")
    upstream.script.push(reply)
    choice = "required" if channel == "tool_choice_violation" else "auto"
    with proxy.http() as http:
        response = http.post("/v1/responses", json=make_request(tool_choice=choice))
    assert response.status_code == 200
    assert response.headers["x-toolsentry-violations"] == channel
    assert response.headers["x-toolsentry-errors"] == "1"


def test_namespaced_and_built_in_calls_are_valid_as_declared(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        answer(None, call("spawn_agent", {"task": "look"}, namespace="multi_agent_v1"))
    )
    with proxy.http() as http:
        response = http.post("/v1/responses", json=make_request())
    assert response.headers["x-toolsentry-violations"] == ""
    (item,) = [i for i in response.json()["output"] if i["type"] == "function_call"]
    assert (item["name"], item["namespace"]) == ("spawn_agent", "multi_agent_v1")


def test_a_built_in_tool_call_is_passed_through_and_never_flagged(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    body = {
        "id": "resp_builtin",
        "object": "response",
        "created_at": 0,
        "model": MODEL,
        "status": "completed",
        "output": [
            {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {}},
        ],
        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
    }
    upstream.script.push(body)
    with proxy.http() as http:
        response = http.post("/v1/responses", json=make_request(tool_choice="required"))
    assert response.headers["x-toolsentry-violations"] == ""
    assert response.json() == body


def test_tool_choice_named_and_none_are_enforced(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(repair="off")
    upstream.script.push(
        answer(None, call("get_order_details", {"order_id": "#W1"})),
        answer(None, call("get_order_details", {"order_id": "#W1"})),
    )
    named = {"type": "function", "name": "cancel_pending_order"}
    with proxy.http() as http:
        first = http.post("/v1/responses", json=make_request(tool_choice=named))
        second = http.post("/v1/responses", json=make_request(tool_choice="none"))
    assert first.headers["x-toolsentry-violations"] == "tool_choice_violation"
    assert second.headers["x-toolsentry-violations"] == "tool_choice_violation"


def test_a_tool_error_in_a_function_call_output_is_counted_once_per_call_id(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(answer("Sorry."), answer("Sorry again."))
    history = [
        {"type": "message", "role": "user", "content": "Cancel #W1"},
        {"type": "function_call", "call_id": "c1", "name": "get_order_details", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "Error: order not found"},
    ]
    headers = {"x-session-id": "tool-errors"}
    with proxy.http() as http:
        for _ in range(2):
            response = http.post(
                "/v1/responses", json=make_request() | {"input": history}, headers=headers
            )
            assert response.headers["x-toolsentry-errors"] == "1"
    session = proxy.session("tool-errors")
    assert session["channels"] == {"tool_error": 1}


def test_a_chain_by_previous_response_id_stays_in_one_session(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        answer(None, call("get_order_details", {"order_id": "#W1"})), answer("Done.")
    )
    client = proxy.client()
    first = client.responses.with_raw_response.create(**make_request(store=True))
    session = first.headers["x-toolsentry-session"]
    assert session.startswith("conv-")  # found by its history: it names none
    (item,) = [i for i in first.parse().output if i.type == "function_call"]
    follow = {
        "model": MODEL,
        "previous_response_id": first.parse().id,
        "input": [{"type": "function_call_output", "call_id": item.call_id, "output": "ok"}],
        "tools": TOOLS,
    }
    second = client.responses.with_raw_response.create(**follow)
    assert second.headers["x-toolsentry-session"] == session
    assert upstream.script.requests[1]["previous_response_id"] == first.parse().id
    assert proxy.session(session)["requests"] == 2


def test_codex_and_claude_code_session_headers_name_the_session(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(answer("a"), answer("b"))
    with proxy.http() as http:
        codex = http.post("/v1/responses", json=make_request(), headers={"session-id": "c-1"})
        claude = http.post(
            "/v1/responses", json=make_request(), headers={"x-claude-code-session-id": "cc-1"}
        )
    assert codex.headers["x-toolsentry-session"] == "c-1"
    assert claude.headers["x-toolsentry-session"] == "cc-1"


@pytest.mark.parametrize(
    ("settings", "error"),
    [({}, openai.BadRequestError), ({"exhaustion_status": 429}, openai.RateLimitError)],
    ids=["default-400", "429"],
)
def test_the_budgets_refusal_is_raised_by_the_sdk_without_a_retry(
    make_proxy: Callable[..., RunningProxy],
    upstream: RunningUpstream,
    settings: dict[str, Any],
    error: type[openai.APIStatusError],
) -> None:
    proxy = make_proxy(max_errors=1, repair="off", **settings)
    upstream.script.push(answer(None, call("cancel_order", {})))
    client = proxy.client(max_retries=3, default_headers={"x-session-id": "spent"})
    client.responses.create(**make_request())
    with pytest.raises(error) as caught:
        client.responses.create(**make_request())
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert caught.value.body["type"] == "error_budget_exhausted"  # type: ignore[index]
    assert "has used its error budget" in caught.value.message
    assert len(upstream.script.requests) == 1
    status = str(caught.value.status_code)
    text = proxy.metrics()
    assert metric(text, "toolsentry_requests_total", api="responses", model=MODEL, status=status)


def test_unknown_request_fields_reach_the_upstream_and_the_reply_comes_back_as_sent(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(answer("Hello."))
    extra = {"store": False, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k"}
    with proxy.http() as http:
        response = http.post("/v1/responses", json=make_request(**extra))
    assert {k: upstream.script.requests[0][k] for k in extra} == extra
    assert response.json()["output"][0]["content"][0]["text"] == "Hello."


def test_input_as_a_string_and_a_request_without_input(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(answer("Hi."))
    with proxy.http() as http:
        ok = http.post("/v1/responses", json={"model": MODEL, "input": "hello"})
        bad = http.post("/v1/responses", json={"model": MODEL})
    assert ok.status_code == 200
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "input"


# -- streaming ----------------------------------------------------------------------------------


def stream_bytes(proxy: RunningProxy, body: dict[str, Any]) -> tuple[httpx.Headers, bytes]:
    with (
        proxy.http() as http,
        http.stream("POST", "/v1/responses", json=body | {"stream": True}) as response,
    ):
        return response.headers, response.read()


def events_of(raw: bytes) -> tuple[list[dict[str, Any]], list[str]]:
    events, comments = [], []
    for block in raw.decode().split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
            elif line.startswith(": "):
                comments.append(line[2:])
    return events, comments


def test_a_stream_holds_the_bad_call_repairs_it_and_numbers_every_event(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        SSE.of(answer("Let me cancel it.", call("cancel_order", {"order_id": "#W1"}))),
        answer(None, call("cancel_pending_order", CANCEL)),
    )
    headers, raw = stream_bytes(proxy, make_request())
    events, comments = events_of(raw)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "response.completed"
    assert raw.rindex(b": x-toolsentry ") < raw.rindex(b"response.completed")
    summary = json.loads(comments[-1].removeprefix("x-toolsentry "))
    assert summary["repairs"] == 1
    assert summary["violations"] == ["unknown_tool"]
    names = [
        e["item"]["name"]
        for e in events
        if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"
    ]
    assert names == ["cancel_pending_order"]
    assert "cancel_order" not in raw.decode().replace("cancel_pending_order", "")
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["message", "function_call"]
    assert final["output"][1]["name"] == "cancel_pending_order"
    for event in events:
        if "output_index" in event:
            assert event["output_index"] < len(final["output"])
    assert headers["x-toolsentry-session"].startswith("conv-")


def test_the_sdks_stream_accumulates_the_repaired_call(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        SSE.of(answer(None, call("cancel_order", {"order_id": "#W1"}))),
        answer(None, call("cancel_pending_order", CANCEL)),
    )
    client = proxy.client()
    with client.responses.stream(**make_request()) as stream:
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert function_calls(final.output) == [("cancel_pending_order", None, CANCEL)]


def test_an_upstream_failure_after_the_first_byte_is_a_responses_error_event(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(SSE.of(answer("Some text before it breaks."), fail_after=4))
    client = proxy.client()
    with client.responses.stream(**make_request()) as stream:
        seen = list(stream)
    # The SDK hands a Responses error event to the application as an event like any other;
    # `response.failed` ends the stream after it.
    assert [event.type for event in seen[-2:]] == ["error", "response.failed"]
    assert "scripted failure" in seen[-2].message  # type: ignore[union-attr]
    assert seen[-1].response.status == "failed"  # type: ignore[union-attr]
    upstream.script.push(SSE.of(answer("Some text before it breaks."), fail_after=4))
    _, raw = stream_bytes(proxy, make_request())
    events, comments = events_of(raw)
    assert [event["type"] for event in events[-2:]] == ["error", "response.failed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert json.loads(comments[-1].removeprefix("x-toolsentry "))["violations"] == [
        "upstream_error"
    ]
    text = proxy.metrics()
    labels = {"api": "responses", "model": MODEL}
    assert metric(text, "toolsentry_violations_total", channel="upstream_error", **labels) == 2
    assert metric(text, "toolsentry_requests_total", status="502", **labels) == 2


_OUTPUTS = st.sampled_from(
    [
        answer("Just text, no call at all."),
        answer("Looking it up.", call("get_order_details", {"order_id": "#W1"})),
        answer(
            None,
            call("get_order_details", {"order_id": "#W1"}),
            call("cancel_pending_order", CANCEL),
        ),
        answer(None, call("spawn_agent", {"task": "t"}, namespace="multi_agent_v1")),
    ]
)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(reply=_OUTPUTS, fragment=st.integers(min_value=1, max_value=9))
def test_streamed_and_plain_answers_accumulate_to_the_same_output_items(
    proxy: RunningProxy, upstream: RunningUpstream, reply: Any, fragment: int
) -> None:
    upstream.script.push(reply, SSE.of(reply, fragment=fragment))
    client = proxy.client()
    plain = client.responses.create(**make_request())
    with client.responses.stream(**make_request()) as stream:
        for _ in stream:
            pass
        streamed = stream.get_final_response()

    def items(output: list[Any]) -> list[dict[str, Any]]:
        # What the SDK's stream adds of its own (parsed text and arguments) is left out.
        dumped = [i.model_dump(exclude={"id", "status", "parsed_arguments"}) for i in output]
        for item in dumped:
            for part in item.get("content") or []:
                part.pop("parsed", None)
        return dumped

    assert items(streamed.output) == items(plain.output)


def test_a_streams_log_line_and_metrics_carry_the_api(
    proxy: RunningProxy, upstream: RunningUpstream, log: io.StringIO
) -> None:
    upstream.script.push(SSE.of(answer("Hi.")))
    stream_bytes(proxy, make_request())
    (line,) = [json.loads(t) for t in log.getvalue().splitlines() if '"event":"request"' in t]
    assert (line["api"], line["status"], line["stream"]) == ("responses", 200, True)
    assert (
        metric(
            proxy.metrics(), "toolsentry_requests_total", api="responses", model=MODEL, status="200"
        )
        == 1
    )
