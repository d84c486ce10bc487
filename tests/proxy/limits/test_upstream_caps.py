"""Upstream answers are capped: a plain body, an error body and a compression bomb at
`max_response_bytes` (decoded bytes, counted as they are decoded), a stream at `max_stream_bytes`
and `max_stream_seconds`. Each ends in the protocol's error — the error JSON with 502 for a plain
answer, the protocol's error event for a stream — and exactly one `upstream_error`.

The real proxy app on a loopback port, a hostile upstream on another (`hostile.Hostile`); every
attack is a few MB and every stream's deadline a second or two, so the suite stays fast.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from proxy.app import create_app
from proxy.config import Settings
from proxy.testing import LoopbackServer
from tests.proxy.limits.hostile import MB, Hostile
from tests.proxy.metrics_text import metric

MODEL = "hostile"
CAP = 1 * MB
SECONDS = 1.5


@pytest.fixture
def hostile() -> Iterator[tuple[Hostile, str]]:
    script = Hostile()
    with LoopbackServer(script.app) as server:
        yield script, f"{server.url}/v1"


@pytest.fixture
def proxy(hostile: tuple[Hostile, str]) -> Iterator[str]:
    upstream = {
        "name": "hostile",
        "base_url": hostile[1],
        "max_response_bytes": CAP,
        "max_stream_bytes": CAP,
        "max_stream_seconds": SECONDS,
    }
    app = create_app(Settings(upstreams=[upstream], retries=0), environ={})
    with LoopbackServer(app) as server:
        yield server.url


def upstream_errors(proxy: str, api: str) -> float:
    text = httpx.get(f"{proxy}/metrics").text
    labels = {"api": api, "model": MODEL, "channel": "upstream_error"}
    return metric(text, "toolsentry_violations_total", may_be_absent=True, **labels)


BODIES = {
    "chat": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": MODEL, "input": "hi"},
    "messages": {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def post(proxy: str, api: str, **extra: Any) -> httpx.Response:
    body = {**BODIES[api], **extra}
    headers = {"x-session-id": f"limits-{api}", "anthropic-version": "2023-06-01"}
    return httpx.post(f"{proxy}{PATHS[api]}", json=body, headers=headers, timeout=30)


@pytest.mark.parametrize(
    ("mode", "size"),
    [("big", 4 * MB), ("big_error", 4 * MB), ("bomb", 64 * MB)],
    ids=["a body over the cap", "an error body over the cap", "a gzip bomb"],
)
@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_plain_answer_over_the_cap_is_a_502_in_the_protocols_shape(
    hostile: tuple[Hostile, str], proxy: str, api: str, mode: str, size: int
) -> None:
    script, _ = hostile
    script.mode, script.size = mode, size
    response = post(proxy, api)
    assert response.status_code == 502, response.text[:300]
    body = response.json()
    assert len(response.content) < 4096  # the error, not the upstream's body
    if api == "messages":
        assert body["type"] == "error"
        message = body["error"]["message"]
    else:
        message = body["error"]["message"]
    assert f"over the limit of {CAP} bytes" in message
    assert script.requests == 1  # not retried
    assert upstream_errors(proxy, api) == 1


def test_a_compressed_answer_under_the_cap_is_decoded_and_answered(
    hostile: tuple[Hostile, str], proxy: str
) -> None:
    hostile[0].mode = "small_gzip"
    response = post(proxy, "chat")
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "fine"
    assert upstream_errors(proxy, "chat") == 0


def streamed(proxy: str, api: str) -> str:
    """The whole client stream of one streamed request (its events as text)."""
    body = {**BODIES[api], "stream": True}
    headers = {"x-session-id": f"limits-{api}", "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", f"{proxy}{PATHS[api]}", json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200
        return "".join(r.iter_text())


def last_event(text: str) -> str:
    """The stream's last event but for what ends a stream after its error event (chat's
    `[DONE]`, Responses' `response.failed`, which must then follow it)."""
    events = [e for e in text.split("\n\n") if e.strip() and not e.startswith(":")]
    if events[-1] == "data: [DONE]" or events[-1].startswith("event: response.failed"):
        events.pop()
        assert '"error"' in events[-1] or events[-1].startswith("event: error"), events[-1]
    return events[-1]


@pytest.mark.parametrize(
    ("mode", "says"),
    [("endless", f"over the limit of {CAP} bytes"), ("pings", "past its limit in seconds")],
    ids=["bytes", "seconds"],
)
@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_stream_past_its_cap_ends_in_the_protocols_error_event(
    hostile: tuple[Hostile, str], proxy: str, api: str, mode: str, says: str
) -> None:
    hostile[0].mode = mode
    text = streamed(proxy, api)
    last = last_event(text)
    assert says in last
    if api == "chat":
        assert '"error"' in last
    elif api == "responses":
        assert "event: error" in last or "response.failed" in last
    else:
        assert "event: error" in last
    assert len(text) < 2 * CAP  # relayed no further than the cap
    assert upstream_errors(proxy, api) == 1
