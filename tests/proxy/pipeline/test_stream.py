"""Streamed chat completions end to end: the real openai SDK → proxy (uvicorn) → scripted upstream.

Every stream is read by the SDK itself (`chat.completions.create(stream=True)`, accumulated with
the SDK's `ChatCompletionStreamState`); a recording transport under the SDK keeps the raw bytes,
so the summary comment before `[DONE]` can be read too.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState

from proxy.guard.toolcheck import validate
from proxy.protocols.chat.answer import completion_chunks
from proxy.testing import SSE, Fault, completion, tool_call
from tests.proxy.builders import RETAIL_TOOLS, make_request
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.metrics_text import metric

try:  # the HTTP library this openai release is built on
    import httpx2 as sdk_httpx
except ImportError:  # pragma: no cover - openai releases built on httpx
    import httpx as sdk_httpx  # type: ignore[no-redef]

VALID_CANCEL = tool_call("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"})
HALLUCINATED = tool_call("cancel_order", {"order_id": "#W1"}, id="call_bad")
SUMMARY_PREFIX = b": x-toolsentry "


# ---------------------------------------------------------------- the client side


class _Tee(sdk_httpx.SyncByteStream):
    def __init__(self, inner: Any, sink: bytearray) -> None:
        self._inner, self._sink = inner, sink

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            self._sink += chunk
            yield chunk

    def close(self) -> None:
        self._inner.close()


class RecordingTransport(sdk_httpx.BaseTransport):
    """A real HTTP transport that keeps a copy of every response body as the client reads it."""

    def __init__(self) -> None:
        self._inner = sdk_httpx.HTTPTransport()
        self.bodies: list[bytearray] = []

    def handle_request(self, request: Any) -> Any:
        response = self._inner.handle_request(request)
        body = bytearray()
        self.bodies.append(body)
        return sdk_httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Tee(response.stream, body),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._inner.close()


@dataclass
class Streamed:
    headers: Any
    completion: Any  # what the SDK accumulated
    chunks: list[Any]
    raw: bytes

    @property
    def summary(self) -> dict[str, Any]:
        """The x-toolsentry summary comment sent before [DONE]."""
        lines = [line for line in self.raw.splitlines() if line.startswith(SUMMARY_PREFIX)]
        assert len(lines) == 1, self.raw
        data: dict[str, Any] = json.loads(lines[0][len(SUMMARY_PREFIX) :])
        return data


def recording_client(proxy: RunningProxy) -> tuple[openai.OpenAI, RecordingTransport]:
    transport = RecordingTransport()
    return proxy.client(http_client=sdk_httpx.Client(transport=transport)), transport


def stream_chat(
    proxy: RunningProxy, session: str, request: dict[str, Any] | None = None, **headers: str
) -> Streamed:
    client, transport = recording_client(proxy)
    raw = client.chat.completions.with_raw_response.create(
        **(request or make_request()),
        stream=True,
        extra_headers={"x-session-id": session, **headers},
    )
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    chunks = []
    for chunk in raw.parse():
        chunks.append(chunk)
        state.handle_chunk(chunk)
    return Streamed(
        raw.headers, state.current_completion_snapshot, chunks, bytes(transport.bodies[-1])
    )


def plain_chat(
    proxy: RunningProxy, session: str, request: dict[str, Any] | None = None, **headers: str
) -> Any:
    return proxy.client().chat.completions.with_raw_response.create(
        **(request or make_request()), extra_headers={"x-session-id": session, **headers}
    )


def view(completion: Any) -> list[dict[str, Any]]:
    """A comparable view of a completion's choices, streamed-and-accumulated or not."""
    return [
        {
            "index": choice.index,
            "role": choice.message.role,
            "content": choice.message.content,
            "tool_calls": [
                (t.id, t.type, t.function.name, t.function.arguments)
                for t in choice.message.tool_calls or []
            ],
            "finish_reason": choice.finish_reason,
        }
        for choice in sorted(completion.choices, key=lambda c: c.index)
    ]


def toolsentry_headers(headers: Any) -> dict[str, Any]:
    """x-toolsentry-* headers in the summary comment's shape."""
    return {
        "session": headers["x-toolsentry-session"],
        "errors": int(headers["x-toolsentry-errors"]),
        "max_errors": int(headers["x-toolsentry-max-errors"]),
        "repairs": int(headers["x-toolsentry-repairs"]),
        "violations": [v for v in headers["x-toolsentry-violations"].split(",") if v],
    }


def wait_until(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Poll `condition` until it holds or `seconds` pass; return whether it held."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def settled_task_count(proxy: RunningProxy, seconds: float = 5.0) -> int:
    """The proxy's task count once it has held still for a few polls (or after `seconds`)."""
    deadline = time.monotonic() + seconds
    counts = [proxy.server.task_count()]
    while time.monotonic() < deadline and not (len(counts) >= 3 and len(set(counts[-3:])) == 1):
        time.sleep(0.02)
        counts.append(proxy.server.task_count())
    return min(counts[-3:])


def ends_in_error_then_done(raw: bytes) -> bool:
    """Whether a chat stream ends as vLLM ends a failed one: its error chunk, then `[DONE]`."""
    events = [e for e in raw.split(b"\n\n") if e.strip() and not e.startswith(b":")]
    return (
        events[-2:-1] != []
        and events[-2].startswith(b'data: {"error"')
        and (events[-1] == b"data: [DONE]")
    )


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-s",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "scripted-model",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


# ---------------------------------------------------------------- behaviour


def test_content_reaches_the_client_before_the_upstream_sends_the_rest(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    resume = threading.Event()
    events: list[bytes | dict[str, Any]] = [
        chunk({"role": "assistant", "content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({}, "stop"),
    ]
    upstream.script.push(SSE(events, pause_after=1, pause=30, resume=resume))
    client = proxy.client()
    stream = client.chat.completions.create(**make_request(), stream=True)
    chunks = iter(stream)
    first = next(chunks)
    # The upstream holds the rest until we resume it: the first delta cannot have waited for it.
    assert first.choices[0].delta.content == "Hel"
    assert upstream.script.pieces_sent == 1
    resume.set()
    rest = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert rest == "lo"


def test_a_hallucinated_call_is_repaired_by_a_plain_reask_and_emitted_in_the_same_stream(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        completion("Cancelling.", tool_calls=[HALLUCINATED]),
        completion("Cancelling.", tool_calls=[VALID_CANCEL]),
    )
    streamed = stream_chat(proxy, "s-repair")
    message = streamed.completion.choices[0].message
    assert message.content == "Cancelling."
    assert [(t.function.name, t.id) for t in message.tool_calls] == [
        ("cancel_pending_order", VALID_CANCEL["id"])
    ]
    # No held call leaked: the only tool-call delta the client saw is the repaired one.
    deltas = [t for c in streamed.chunks for ch in c.choices for t in ch.delta.tool_calls or []]
    assert [t.function.name for t in deltas] == ["cancel_pending_order"]
    assert upstream.script.requests[0]["stream"] is True
    assert "stream" not in upstream.script.requests[1]  # the re-ask is not streamed
    assert upstream.script.requests[1]["messages"][-1]["tool_call_id"] == "call_bad"
    # Headers went out before the repair; the summary after the body tells what happened.
    assert streamed.headers["x-toolsentry-repairs"] == "0"
    assert streamed.headers["x-toolsentry-violations"] == ""
    assert streamed.summary == {
        "session": "s-repair",
        "errors": 0,
        "max_errors": 10,
        "repairs": 1,
        "violations": ["unknown_tool"],
    }
    session = proxy.session("s-repair")
    assert (session["channels"], session["repairs"], session["errors"]) == (
        {"unknown_tool": 1},
        1,
        0,
    )


def test_the_clients_headers_reach_the_upstream_with_the_stream_and_the_reask(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        completion(tool_calls=[HALLUCINATED]), completion(tool_calls=[VALID_CANCEL])
    )
    streamed = stream_chat(
        proxy, "s-fwd", **{"x-request-id": "req-9", "x-toolsentry-repair": "reask"}
    )
    assert streamed.summary["repairs"] == 1
    opened, reask = upstream.script.request_headers
    for sent in (opened, reask):
        assert sent["x-request-id"] == "req-9"
        assert sent["content-type"] == "application/json"
        assert "x-toolsentry-repair" not in sent
        assert "authorization" not in sent


def test_stream_headers_reflect_the_session_as_the_stream_starts(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(repair="off", on_unrepaired="passthrough")
    upstream.script.push(completion(tool_calls=[tool_call("refund_everything", {})]))
    first = stream_chat(proxy, "s-headers")
    second = stream_chat(proxy, "s-headers")
    assert (first.headers["x-toolsentry-errors"], first.summary["errors"]) == ("0", 1)
    assert (second.headers["x-toolsentry-errors"], second.summary["errors"]) == ("1", 2)
    assert second.summary["violations"] == ["unknown_tool"]
    assert second.completion.choices[0].message.tool_calls[0].function.name == "refund_everything"


def test_keepalive_comments_from_the_upstream_reach_the_client(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    events = [
        b": keep-alive\n\n",
        chunk({"role": "assistant", "content": "Hi"}),
        b": keep-alive\n\n",
        chunk({}, "stop"),
    ]
    upstream.script.push(SSE(events))
    streamed = stream_chat(proxy, "s-ping")
    assert streamed.raw.count(b": keep-alive\n\n") == 2
    assert streamed.completion.choices[0].message.content == "Hi"
    assert streamed.raw.endswith(b"data: [DONE]\n\n")


def test_streams_reuse_one_pooled_upstream_connection_even_if_the_body_ends_after_done(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    # The upstream sends [DONE] and ends its body a moment later: the proxy reads it to its end
    # (after the client has its whole stream) so that the connection goes back to the pool.
    events = [*completion_chunks(completion("Hi"), include_usage=True), b"data: [DONE]\n\n"]
    upstream.script.push(SSE(events, done=False, pause_after=len(events), pause=0.05))
    tasks = proxy.server.task_count()
    for _ in range(4):
        assert stream_chat(proxy, "s-pool").completion.choices[0].message.content == "Hi"
        # The client has its stream; the proxy's request is over once the upstream's body ended.
        assert wait_until(lambda: proxy.server.task_count() == tasks)
    assert len(upstream.script.requests) == 4
    assert len(set(upstream.script.client_ports)) == 1


def test_several_choices_and_usage_sum_every_attempt_in_the_stream(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    first = completion("A", tool_calls=[HALLUCINATED])
    second_choice = completion("B")["choices"][0] | {"index": 1}
    first["choices"].append(second_choice)
    upstream.script.push(
        first,
        completion(
            "A",
            tool_calls=[VALID_CANCEL],
            usage={"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101},
        ),
    )
    request = make_request(n=2, stream_options={"include_usage": True})
    streamed = stream_chat(proxy, "s-n2", request)
    assert [c["content"] for c in view(streamed.completion)] == ["A", "B"]
    assert view(streamed.completion)[0]["tool_calls"][0][2] == "cancel_pending_order"
    usage = streamed.completion.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (110, 6, 116)
    assert streamed.chunks[-1].choices == []  # usage comes last, alone, as the SDK expects


def test_an_unrepairable_call_passes_through_the_stream_and_costs_one_error(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(on_unrepaired="passthrough")
    upstream.script.push(completion(tool_calls=[tool_call("refund_everything", {})]))
    streamed = stream_chat(proxy, "s-unrep")
    assert streamed.completion.choices[0].message.tool_calls[0].function.name == "refund_everything"
    assert len(upstream.script.requests) == 3  # the stream and max_reasks=2 plain re-asks
    assert streamed.summary["errors"] == 1
    assert proxy.session("s-unrep")["errors"] == 1


def test_a_failed_reask_leaves_the_call_to_pass_through_the_stream_as_one_request(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(on_unrepaired="passthrough")
    upstream.script.push(completion(tool_calls=[HALLUCINATED]), Fault(500, b"engine died"))
    streamed = stream_chat(proxy, "s-reask-500")
    assert streamed.completion.choices[0].message.tool_calls[0].function.name == "cancel_order"
    assert streamed.summary["violations"] == ["unknown_tool"]
    record = proxy.session("s-reask-500")
    assert (record["errors"], record["channels"]) == (1, {"unknown_tool": 1, "upstream_error": 1})
    text = proxy.metrics()
    assert (
        metric(text, "toolsentry_requests_total", api="chat", model="scripted-model", status="200")
        == 1
    )
    assert (
        metric(
            text,
            "toolsentry_requests_total",
            api="chat",
            may_be_absent=True,
            model="scripted-model",
            status="502",
        )
        == 0
    )


def test_on_unrepaired_strip_removes_the_invalid_call_from_the_stream(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(repair="off", on_unrepaired="strip")
    upstream.script.push(completion("Done.", tool_calls=[HALLUCINATED, VALID_CANCEL]))
    streamed = stream_chat(proxy, "s-strip")
    choice = view(streamed.completion)[0]
    assert [c[2] for c in choice["tool_calls"]] == ["cancel_pending_order"]
    assert choice["finish_reason"] == "tool_calls"


def test_on_unrepaired_strip_counts_a_streamed_call_leaked_into_content(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(repair="off", on_unrepaired="strip")
    leaked = '<tool_call>\n{"name": "cancel_pending_order", "arguments": {}}\n</tool_call>'
    upstream.script.push(completion(leaked))
    streamed = stream_chat(proxy, "s-strip-leak")
    assert view(streamed.completion)[0]["content"] == leaked
    assert (streamed.summary["errors"], streamed.summary["violations"]) == (1, ["leaked_tool_call"])
    assert proxy.session("s-strip-leak")["channels"] == {"leaked_tool_call": 1}


def test_on_unrepaired_reject_ends_the_stream_with_an_error_event(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(repair="off", on_unrepaired="reject")
    upstream.script.push(completion("Let me.", tool_calls=[HALLUCINATED]))
    client, transport = recording_client(proxy)
    stream = client.chat.completions.create(
        **make_request(), stream=True, extra_headers={"x-session-id": "s-reject"}
    )
    with pytest.raises(openai.APIError, match="could not be repaired"):
        list(stream)
    raw = bytes(transport.bodies[-1])
    assert b'"type":"invalid_tool_call"' in raw
    assert ends_in_error_then_done(raw)
    assert proxy.session("s-reject")["errors"] == 1


# ---------------------------------------------------------------- the budget


def test_an_exhausted_budget_refuses_a_stream_with_429_before_any_byte(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(repair="off", max_errors=1)
    upstream.script.push(completion(tool_calls=[tool_call("cancel_order", {})]))
    stream_chat(proxy, "s-429")
    asked = len(upstream.script.requests)
    with pytest.raises(openai.RateLimitError) as caught:
        stream_chat(proxy, "s-429")
    assert caught.value.body["type"] == "error_budget_exhausted"  # type: ignore[index]
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert len(upstream.script.requests) == asked


def test_finish_policy_sends_the_finishing_completion_as_a_valid_stream(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(repair="off", max_errors=1, exhaustion_policy="finish")
    upstream.script.push(completion(tool_calls=[tool_call("cancel_order", {})]))
    plain_chat(proxy, "s-fin")
    expected = plain_chat(proxy, "s-fin").parse()
    request = make_request(stream_options={"include_usage": True})
    streamed = stream_chat(proxy, "s-fin", request)
    assert view(streamed.completion) == view(expected)
    assert "error budget" in streamed.completion.choices[0].message.content
    assert streamed.completion.usage.total_tokens == 0
    assert streamed.summary == toolsentry_headers(streamed.headers)
    assert streamed.raw.endswith(b"data: [DONE]\n\n")


# ---------------------------------------------------------------- upstream failures


VLLM_400 = {
    "error": {
        "message": "max_tokens is too large",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}


@pytest.mark.parametrize(
    ("fault", "status", "channels"),
    [
        (Fault(503, {"error": {"message": "overloaded"}}), 503, {"upstream_error": 1}),
        (Fault(400, VLLM_400), 400, {}),
        (
            Fault(
                400,
                {"object": "error", "message": "n too big", "type": "BadRequestError", "code": 400},
            ),
            400,
            {},
        ),
    ],
)
def test_an_upstream_refusal_before_the_first_byte_is_the_same_http_error_as_without_stream(
    proxy: RunningProxy,
    upstream: RunningUpstream,
    fault: Fault,
    status: int,
    channels: dict[str, int],
) -> None:
    upstream.script.push(fault)
    with pytest.raises(openai.APIStatusError) as plain:
        plain_chat(proxy, "s-refused-plain")
    with pytest.raises(openai.APIStatusError) as streamed:
        stream_chat(proxy, "s-refused-stream")
    assert plain.value.status_code == streamed.value.status_code == status
    assert plain.value.body == streamed.value.body
    assert "x-toolsentry" not in streamed.value.response.headers.get("content-type", "")
    assert proxy.session("s-refused-stream")["channels"] == channels
    assert proxy.session("s-refused-plain")["channels"] == channels


def test_an_unreachable_upstream_is_a_502_before_the_first_byte(
    make_proxy: Callable[..., RunningProxy], refused_port: int
) -> None:
    down = {"name": "down", "base_url": f"http://127.0.0.1:{refused_port}/v1"}
    proxy = make_proxy(upstreams=[down], retries=1)
    with pytest.raises(openai.APIStatusError) as caught:
        stream_chat(proxy, "s-down")
    assert caught.value.status_code == 502
    assert "'down' is unreachable" in caught.value.message
    assert proxy.session("s-down")["channels"] == {"upstream_error": 1}


def test_an_upstream_dropping_mid_stream_gives_an_error_event_counted_once(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    events: list[bytes | dict[str, Any]] = [
        chunk({"role": "assistant", "content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({}, "stop"),
    ]
    upstream.script.push(SSE(events, drop_after=2))
    client, transport = recording_client(proxy)
    stream = client.chat.completions.create(
        **make_request(), stream=True, extra_headers={"x-session-id": "s-drop"}
    )
    received: list[Any] = []
    with pytest.raises(openai.APIError, match="broke off its response"):
        received.extend(stream)  # keeps what came before the error
    assert "".join(c.choices[0].delta.content or "" for c in received) == "Hello"
    raw = bytes(transport.bodies[-1])
    assert raw.count(b'data: {"error"') == 1
    assert ends_in_error_then_done(raw)
    assert proxy.session("s-drop")["channels"] == {"upstream_error": 1}
    assert proxy.session("s-drop")["errors"] == 0
    text = proxy.metrics()
    model = "scripted-model"
    assert (
        metric(
            text, "toolsentry_violations_total", api="chat", model=model, channel="upstream_error"
        )
        == 1
    )


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (b"data: {not json\n\n", "invalid JSON in an SSE data payload"),
        (b"data: [1, 2]\n\n", "a JSON list in an SSE data payload"),
        (b'data: {"choices": "none"}\n\n', "not a chat-completion chunk"),
    ],
)
def test_malformed_sse_from_the_upstream_gives_a_clear_error_event(
    proxy: RunningProxy, upstream: RunningUpstream, bad: bytes, message: str
) -> None:
    upstream.script.push(SSE([chunk({"role": "assistant", "content": "Hi"}), bad]))
    client = proxy.client()
    stream = client.chat.completions.create(
        **make_request(), stream=True, extra_headers={"x-session-id": "s-bad"}
    )
    with pytest.raises(openai.APIError, match=message):
        list(stream)
    assert proxy.session("s-bad")["channels"] == {"upstream_error": 1}


def test_an_error_event_from_the_upstream_reaches_the_client_after_the_content_before_it(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    error = {"error": {"message": "KV cache exhausted", "type": "InternalServerError", "code": 500}}
    # One piece: the content and the error arrive in the same read.
    events = [chunk({"role": "assistant", "content": "Hi"}), error]
    upstream.script.push(SSE(events, chunk_sizes=[1 << 20]))
    stream = proxy.client().chat.completions.create(**make_request(), stream=True)
    received: list[Any] = []
    with pytest.raises(openai.APIError, match="KV cache exhausted"):
        received.extend(stream)
    assert [c.choices[0].delta.content for c in received] == ["Hi"]


def test_an_upstream_that_ends_without_done_after_every_choice_finished_is_completed(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    events = [chunk({"role": "assistant", "content": "Hi"}), chunk({}, "stop")]
    upstream.script.push(SSE(events, done=False))
    streamed = stream_chat(proxy, "s-nodone")
    assert streamed.completion.choices[0].message.content == "Hi"
    assert streamed.raw.endswith(b"data: [DONE]\n\n")


def test_an_upstream_that_ends_inside_a_choice_gives_an_error_event(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(SSE([chunk({"role": "assistant", "content": "Hi"})], done=False))
    stream = proxy.client().chat.completions.create(**make_request(), stream=True)
    with pytest.raises(openai.APIError, match="ended before choice 0 finished"):
        list(stream)


def test_a_client_that_goes_away_cancels_the_upstream_request_and_leaves_no_task(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(completion("warm-up"))
    stream_chat(proxy, "s-warm")  # the pools and the server's tasks as they stay between requests
    # The warm-up's own task may outlive the client's last read by a moment: count once it is gone.
    tasks_before = settled_task_count(proxy)
    resume = threading.Event()  # never set: the upstream waits until its connection goes
    events = [chunk({"role": "assistant", "content": "Hel"}), chunk({"content": "lo"})]
    upstream.script.push(SSE(events, pause_after=1, pause=30, resume=resume))
    client = proxy.client()
    with client.chat.completions.create(
        **make_request(), stream=True, extra_headers={"x-session-id": "s-gone"}
    ) as stream:
        assert next(iter(stream)).choices[0].delta.content == "Hel"
    # Leaving the block closed the client's connection before the stream ended.
    assert upstream.script.stream_cut.wait(10), "the proxy kept the upstream request open"
    assert wait_until(lambda: proxy.server.task_count() <= tasks_before), (
        f"{proxy.server.task_count()} tasks in the proxy, {tasks_before} before the stream"
    )
    assert wait_until(lambda: proxy.session("s-gone")["requests"] == 1)
    assert wait_until(
        lambda: (
            metric(
                proxy.metrics(),
                "toolsentry_requests_total",
                api="chat",
                may_be_absent=True,  # until the proxy has seen the client go
                model="scripted-model",
                status="499",
            )
            == 1
        )
    )


# ---------------------------------------------------------------- equivalence with the plain response

VALID_CALLS = [
    ("get_order_details", {"order_id": "#W1"}),
    ("cancel_pending_order", {"order_id": "#W1", "reason": "ordered by mistake"}),
    ("find_user_id_by_email", {"email": "a@example.com"}),
]
INVALID_CALLS = [
    ("cancel_order", {"order_id": "#W1"}),  # unknown tool
    ("cancel_pending_order", '{"order_id": "#W1", '),  # malformed
    ("cancel_pending_order", {"order_id": "#W1"}),  # missing a required property
    ("get_order_details", {"order_id": 7}),  # wrong type
]
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=30)


LEAKED_CALL = (
    '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1"}}</tool_call>'
)


@dataclass
class Scenario:
    first: dict[str, Any]  # the upstream's completion for the request
    reasks: list[dict[str, Any]]  # its answers to the re-asks, in order
    include_usage: bool
    fragment: int
    chunk_sizes: list[int]
    pings: list[int]  # before which chunks a keep-alive comment goes


def is_valid(reply: dict[str, Any]) -> bool:
    """Whether the guard passes the reply's only choice, so the proxy would not re-ask it."""
    [choice] = reply["choices"]
    return not validate(
        choice["message"], RETAIL_TOOLS, None, finish_reason=choice["finish_reason"]
    )


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """A completion with one or two choices of content and valid or invalid tool calls, and
    the upstream's answers to the re-asks: each invalid choice is fixed on the first re-ask
    (same content, valid calls), repeated on every re-ask, or fails otherwise on every re-ask
    (a call leaked after the same content: a stream can still send content that extends).

    The guard itself says which choices are invalid: the text may hold a leaked call (hypothesis
    draws the leak markers the guard looks for), which no hand-written rule here would foresee.
    """
    first = completion("unused")
    first["choices"] = []
    reasks: list[dict[str, Any]] = []
    for index in range(draw(st.sampled_from([1, 1, 2]))):
        content = draw(st.none() | TEXT)
        picks = draw(st.lists(st.tuples(st.booleans(), st.integers(0, 3)), max_size=3))
        calls = [
            tool_call(*(VALID_CALLS[i % 3] if valid else INVALID_CALLS[i])) for valid, i in picks
        ]
        one = completion(content, tool_calls=calls or None)
        first["choices"].append(one["choices"][0] | {"index": index})
        if is_valid(one):
            continue
        fixed = [tool_call(*VALID_CALLS[i % 3]) for _, i in picks]
        repaired = completion(content or "Done.", tool_calls=fixed or None)
        otherwise = completion((content or "") + LEAKED_CALL, tool_calls=calls or None)
        answer = draw(st.sampled_from(["fixed", "repeated", "otherwise"]))
        if answer == "fixed" and is_valid(repaired):
            reasks.append(repaired)
        elif answer == "otherwise" and not is_valid(otherwise):
            reasks += [otherwise] * 2  # max_reasks
        else:
            reasks += [completion(content, tool_calls=calls or None)] * 2
    return Scenario(
        first,
        reasks,
        include_usage=draw(st.booleans()),
        fragment=draw(st.integers(1, 12)),
        chunk_sizes=draw(st.lists(st.integers(1, 80), min_size=1, max_size=6)),
        pings=draw(st.lists(st.integers(0, 40), max_size=3)),
    )


def as_sse(scenario: Scenario) -> SSE:
    chunks = completion_chunks(scenario.first, fragment=scenario.fragment, include_usage=True)
    events: list[bytes | dict[str, Any]] = []
    for position, c in enumerate(chunks):
        events += [b": ping\n\n"] * scenario.pings.count(position)
        events.append(c)
    return SSE(events, chunk_sizes=scenario.chunk_sizes, completion=scenario.first)


LEAKED_TAG_ONLY = completion("<|python_tag|>")  # the tag that starts a Llama 3 call, and no call


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(scenario=scenarios())
@example(
    scenario=Scenario(
        LEAKED_TAG_ONLY,
        [LEAKED_TAG_ONLY] * 2,
        include_usage=True,
        fragment=4,
        chunk_sizes=[80],
        pings=[],
    )
)
def test_a_stream_accumulates_to_the_plain_response_with_the_same_accounting(
    proxy: RunningProxy, upstream: RunningUpstream, scenario: Scenario
) -> None:
    plain_session, stream_session = f"p-{uuid.uuid4().hex}", f"s-{uuid.uuid4().hex}"
    n = len(scenario.first["choices"])
    options = {"stream_options": {"include_usage": True}} if scenario.include_usage else {}

    asked = len(upstream.script.requests)
    upstream.script.push(scenario.first, *scenario.reasks)
    plain = plain_chat(proxy, plain_session, make_request(n=n))
    plain_requests = upstream.script.requests[asked:]

    asked = len(upstream.script.requests)
    upstream.script.push(as_sse(scenario), *scenario.reasks)
    streamed = stream_chat(proxy, stream_session, make_request(n=n, **options))
    stream_requests = upstream.script.requests[asked:]

    expected = plain.parse()
    assert view(streamed.completion) == view(expected)
    if scenario.include_usage:
        assert streamed.completion.usage.to_dict() == expected.usage.to_dict()
    # The re-asks carried the same assembled messages, and the script was used up exactly.
    assert len(plain_requests) == len(stream_requests) == 1 + len(scenario.reasks)
    for plain_reask, stream_reask in zip(plain_requests[1:], stream_requests[1:], strict=True):
        assert plain_reask["messages"] == stream_reask["messages"]
    # What the plain response's headers say, the stream's summary says after its body.
    assert streamed.summary == toolsentry_headers(plain.headers) | {"session": stream_session}
    assert toolsentry_headers(streamed.headers) == {
        "session": stream_session,
        "errors": 0,
        "max_errors": 10,
        "repairs": 0,
        "violations": [],
    }
    plain_record, stream_record = proxy.session(plain_session), proxy.session(stream_session)
    for key in ("errors", "repairs", "channels", "requests", "exhausted"):
        assert plain_record[key] == stream_record[key], key
