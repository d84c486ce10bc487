"""toolsentry in front of a real vLLM: what the client receives is valid, or reported and counted.

Gemma 3 270M (a base model) served by vLLM's CPU backend with the hermes tool parser makes real
failures: calls left in `content`, calls cut off by `max_tokens`, undeclared tools, arguments that
break the schema. Whatever reaches the client must be valid against the request's tools or be
named in `x-toolsentry-violations` (for a stream, in the summary comment before `[DONE]`: its
headers leave before the tool calls are checked), and then be counted in the session and in
`/metrics`.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import httpx
import openai
import pytest

from scripts.live_requests import (
    MODEL,
    MODES,
    PROMPTS,
    Prompt,
    Received,
    counter_values,
    failures,
    labels,
    send,
    tool_choice_for,
    unreported,
)
from tests.live.scenarios import (
    described,
    send_all,
)

pytestmark = pytest.mark.vllm


@pytest.fixture
def client(proxy_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0, timeout=600
    ) as sdk_client:
        yield sdk_client


def new_session() -> str:
    return f"live-{uuid.uuid4().hex[:12]}"


def assert_reported_and_counted(
    proxy_url: str, session: str, received: Received, *, stream: bool
) -> None:
    """The proxy's report of the turn (headers; for a stream, the summary before `[DONE]`)
    matches the session's record, and each reported channel is counted in it and in /metrics."""
    assert received.headers["x-toolsentry-session"] == session
    record = httpx.get(f"{proxy_url}/v1/sessions/{session}", timeout=30).json()
    if stream:
        assert received.summary is not None, "the stream carried no x-toolsentry summary"
        # The headers left as the stream started, before the turn was accounted.
        assert int(received.headers["x-toolsentry-errors"]) <= record["errors"]
    report = received.report
    assert report["session"] == session
    assert (report["errors"], report["max_errors"], report["repairs"]) == (
        record["errors"],
        record["max_errors"],
        record["repairs"],
    ), f"reported {report}, recorded {record}"
    metrics = counter_values(
        httpx.get(f"{proxy_url}/metrics", timeout=30).text, "toolsentry_violations_total"
    )
    for channel in received.violations:
        assert record["channels"].get(channel, 0) >= 1, f"{channel} not counted in {record}"
        assert metrics[labels(api="chat", model=MODEL, channel=channel)] >= 1, (
            f"{channel} not in /metrics"
        )


def test_vllm_alone_lets_tool_call_failures_reach_the_client(
    vllm_url: str, summary: list[str]
) -> None:
    """The problem the proxy exists for: the same requests straight to vLLM, nothing checked."""
    found: Counter[str] = Counter()
    with openai.OpenAI(base_url=vllm_url, api_key="unused", max_retries=0, timeout=600) as direct:
        turns = send_all(
            lambda prompt, choice, stream: send(
                direct, prompt, choice, stream, new_session(), max_tokens=64
            )
        )
    for prompt, choice, _, received in turns:
        found.update(
            f.channel for f in failures(received, prompt.tools, tool_choice_for(prompt, choice))
        )

    total = len(PROMPTS) * len(MODES)
    summary.append(
        f"vLLM alone, {total} requests: failures by channel {dict(sorted(found.items()))}"
    )
    assert sum(found.values()) > 0


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert MODEL in [model.id for model in client.models.list()]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_request_vllm_rejects_reaches_the_client_with_vllms_message(
    client: openai.OpenAI, vllm_url: str, stream: bool
) -> None:
    bad = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100_000}
    direct = httpx.post(f"{vllm_url}/chat/completions", json=bad, timeout=60)
    assert direct.status_code == 400
    vllm_message = direct.json()["error"]["message"]

    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**bad, stream=stream)

    assert caught.value.status_code == 400
    assert vllm_message in caught.value.message


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("choice", ["auto", "required", "named"])
@pytest.mark.parametrize(
    "prompt", [p for p in PROMPTS if p.name in ("cancel", "undeclared_tool")], ids=lambda p: p.name
)
def test_every_tool_call_the_client_receives_is_valid_or_reported(
    client: openai.OpenAI, proxy_url: str, prompt: Prompt, choice: str, stream: bool
) -> None:
    session = new_session()
    received = send(client, prompt, choice, stream, session)

    assert unreported(received, prompt.tools, tool_choice_for(prompt, choice)) == []
    assert_reported_and_counted(proxy_url, session, received, stream=stream)


def test_a_fixed_set_of_requests_is_valid_or_reported_and_counted_per_channel(
    client: openai.OpenAI, proxy_url: str, summary: list[str]
) -> None:
    before = httpx.get(f"{proxy_url}/metrics", timeout=30).text
    seen: Counter[str] = Counter()
    repaired_responses = 0
    problems: list[str] = []

    def one(prompt: Prompt, choice: str, stream: bool) -> tuple[str, Received]:
        session = new_session()
        return session, send(client, prompt, choice, stream, session, max_tokens=64)

    for prompt, choice, stream, (session, received) in send_all(one):
        seen.update(received.violations)
        repaired_responses += received.repairs > 0
        problems += [
            described(prompt, choice, stream, problem)
            for problem in unreported(received, prompt.tools, tool_choice_for(prompt, choice))
        ]
        assert_reported_and_counted(proxy_url, session, received, stream=stream)

    after = httpx.get(f"{proxy_url}/metrics", timeout=30).text
    violations = delta(before, after, "toolsentry_violations_total")
    repairs = delta(before, after, "toolsentry_repairs_total")
    total = len(PROMPTS) * len(MODES)
    summary.append(
        f"{total} requests through the proxy; {repaired_responses} responses carried repairs"
    )
    summary.append(
        f"{'channel':24} {'responses':>9} {'counted':>8} {'repaired':>9} {'unrepaired':>10}"
    )
    for channel in sorted(set(seen) | {dict(k)["channel"] for k in violations}):
        summary.append(
            f"{channel:24} {seen[channel]:9d} {violations.get(labels(api='chat', model=MODEL, channel=channel), 0):8.0f} "
            f"{repairs.get(labels(api='chat', model=MODEL, channel=channel, result='success'), 0):9.0f} "
            f"{repairs.get(labels(api='chat', model=MODEL, channel=channel, result='failure'), 0):10.0f}"
        )
    assert problems == []
    for channel, responses in seen.items():
        assert violations.get(labels(api="chat", model=MODEL, channel=channel), 0) >= responses


def delta(before: str, after: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """How much each labelled counter grew between two /metrics scrapes."""
    old, new = counter_values(before, name), counter_values(after, name)
    return {
        key: value - old.get(key, 0.0) for key, value in new.items() if value > old.get(key, 0.0)
    }
