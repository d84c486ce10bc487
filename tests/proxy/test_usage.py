"""The usage a client sees is the sum over every upstream attempt of its turn (the first answer and
each re-ask), on every protocol, plain and streamed (`proxy/usage.py` adds them up)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

import proxy.protocols.messages.answer as messages_wire
from proxy.protocols.answer import Answer, Usage
from proxy.testing import SSE, answer, call
from proxy.usage import sum_usage
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.pipeline.test_cycles import BODIES

RIGHT = call("get_order_details", {"order_id": "#W1"})
WRONG = call("cancel_order", {"order_id": "#W1"})  # not among the request's tools: re-asked
# The input and output token fields of each protocol's usage.
FIELDS = {
    "chat": ("prompt_tokens", "completion_tokens"),
    "responses": ("input_tokens", "output_tokens"),
    "messages": ("input_tokens", "output_tokens"),
}


def events(text: str) -> list[dict[str, Any]]:
    """The JSON data of a server-sent event stream, in order (`[DONE]` left out)."""
    lines = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    return [json.loads(data) for data in lines if data != "[DONE]"]


def seen_usage(api: str, response: httpx.Response, stream: bool) -> dict[str, Any]:
    """The usage as the protocol's client reads it from a plain body or a stream."""
    usage: dict[str, Any]
    if not stream:
        usage = response.json()["usage"]
        return usage
    found = events(response.text)
    if api == "chat":  # the last chunk that carries one
        usage = [e["usage"] for e in found if e.get("usage")][-1]
        return usage
    if api == "responses":
        usage = next(e["response"]["usage"] for e in found if e["type"] == "response.completed")
        return usage
    # Messages: message_start's usage, each field of message_delta's replacing it (as the SDK does)
    usage = dict(next(e["message"]["usage"] for e in found if e["type"] == "message_start"))
    for event in found:
        if event["type"] == "message_delta":
            usage.update({k: v for k, v in event["usage"].items() if v is not None})
    return usage


@pytest.mark.parametrize("attempts", [1, 2, 3])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("api", sorted(BODIES))
def test_the_usage_the_client_sees_is_the_sum_over_every_attempt(
    api: str, stream: bool, attempts: int, proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    usages = [Usage(input_tokens=10 * 3**n, output_tokens=2 * 5**n) for n in range(attempts)]
    answers = [
        answer(None, WRONG if n < attempts - 1 else RIGHT, usage=u) for n, u in enumerate(usages)
    ]
    upstream.script.push(*(SSE.of(a) for a in answers) if stream else answers)
    path, body = BODIES[api]
    sent = {**body, "stream": True} if stream else body
    with httpx.Client(base_url=proxy.server.url, timeout=10) as http:
        response = http.post(path, json=sent, headers={"x-session-id": f"usage-{api}-{stream}"})
    assert response.status_code == 200, response.text
    assert len(upstream.script.requests) == attempts
    usage = seen_usage(api, response, stream)
    inputs, outputs = FIELDS[api]
    total = sum_usage([{"i": u.input_tokens, "o": u.output_tokens} for u in usages])
    assert (usage[inputs], usage[outputs]) == (total["i"], total["o"])


def output_only(reply: Answer) -> SSE:
    """A Messages stream whose `message_delta` counts output tokens only, as Anthropic's API
    writes it (the input was counted in `message_start`); a re-ask gets the plain body."""
    events = messages_wire.events(reply)
    for event in events:
        if event["type"] == "message_delta":
            event["usage"] = {"output_tokens": event["usage"]["output_tokens"]}
    return SSE(list[bytes | dict[str, Any]](events), completion=messages_wire.body(reply))


@pytest.mark.parametrize("attempts", [1, 2, 3])
def test_a_messages_stream_counts_the_first_attempts_input_when_its_delta_leaves_it_out(
    attempts: int, proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    usages = [Usage(input_tokens=10 * 3**n, output_tokens=2 * 5**n) for n in range(attempts)]
    calls = [WRONG if n < attempts - 1 else RIGHT for n in range(attempts)]
    replies = [answer(None, c, usage=u) for c, u in zip(calls, usages, strict=True)]
    upstream.script.push(output_only(replies[0]), *replies[1:])
    path, body = BODIES["messages"]
    with httpx.Client(base_url=proxy.server.url, timeout=10) as http:
        response = http.post(path, json={**body, "stream": True})
    assert response.status_code == 200, response.text
    usage = seen_usage("messages", response, stream=True)
    assert usage["input_tokens"] == sum(u.input_tokens for u in usages)
    assert usage["output_tokens"] == sum(u.output_tokens for u in usages)
