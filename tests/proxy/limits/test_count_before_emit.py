"""A held tool call is counted in the session store before its bytes go to the client (#33).

A real `toolsentry serve` streams answers whose tool call is invalid (an unknown tool, repair
off) from a scripted upstream that holds each stream open: one after the call went out, one
before the call came. Then the store goes down hard — a real `redis-server` (persisting every
write) killed with SIGKILL, or the proxy itself killed over its SQLite file — and comes back.
Whatever happened in between, every invalid call a client received is counted in its session,
and every stream the client saw end ended with the protocol's terminal or error event.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from proxy.protocols.answer import Answer
from proxy.protocols.base import API
from proxy.testing import SSE, LoopbackServer, ScriptedUpstream, answer, call, stream_events
from tests.conftest import RedisServer
from tests.proxy.metrics_text import metric
from tests.proxy.system.support import ProxyProcess

WAIT = 30.0  # the most anything is waited for; nothing is timed
INVALID = "launch_rockets"  # a tool no request declares
TEXT = "Let me check."
ANSWER = answer(TEXT, call(INVALID, {}), finish="tool_calls")
PATHS = {
    API.CHAT: "/v1/chat/completions",
    API.RESPONSES: "/v1/responses",
    API.MESSAGES: "/v1/messages",
}
SCHEMA = {"type": "object", "properties": {"order_id": {"type": "string"}}}


def request(api: API, stage: str, *, stream: bool = True) -> dict[str, Any]:
    """A request of `api` declaring one tool; `stage` tells the upstream where to hold."""
    if api is API.RESPONSES:
        tool = {"type": "function", "name": "get_order", "parameters": SCHEMA}
        return {"model": "scripted-model", "input": stage, "tools": [tool], "stream": stream}
    if api is API.MESSAGES:
        tool = {"name": "get_order", "input_schema": SCHEMA}
        messages = [{"role": "user", "content": stage}]
        body = {"model": "scripted-model", "max_tokens": 64, "messages": messages}
        return {**body, "tools": [tool], "stream": stream}
    tool = {"type": "function", "function": {"name": "get_order", "parameters": SCHEMA}}
    messages = [{"role": "user", "content": stage}]
    return {"model": "scripted-model", "messages": messages, "tools": [tool], "stream": stream}


def held_upstream(release: threading.Event) -> ScriptedUpstream:
    """An upstream that streams ANSWER and holds the stream (until `release`) where the request
    says: `after_call` once the call and its finish went out (before the stream's last event),
    `before_call` once the text went out and before the call's first event. A plain answer is
    held before anything is sent."""
    upstream = ScriptedUpstream()

    def handler(body: dict[str, Any]) -> SSE | Answer:
        api = upstream.apis[-1]
        if not body.get("stream"):  # a plain answer, held whole (this upstream serves one)
            release.wait(WAIT)
            return ANSWER
        events = stream_events(ANSWER, api, body, fragment=None)
        if "before_call" in orjson.dumps(body).decode():
            held = next(i for i, e in enumerate(events) if INVALID in orjson.dumps(e).decode())
        else:  # after the call: chat before [DONE], Messages before message_stop
            held = len(events) - (api is API.MESSAGES)
        return SSE(
            list[bytes | dict[str, Any]](events), pause_after=held, pause=WAIT, resume=release
        )

    upstream.handler = handler
    return upstream


@contextmanager
def serving(tmp_path: Path, upstream: str, store: str) -> Iterator[ProxyProcess]:
    """A real `toolsentry serve` over `store`, repair off, every unrepaired call passed on to
    its client (stopped at the end unless killed)."""
    log = tmp_path / "serve.log"
    options = ["--repair", "off", "--on-unrepaired", "passthrough", "--store", store]
    proxy = ProxyProcess(f"{upstream}/v1", log, *options)
    try:
        yield proxy.wait_ready()
    finally:
        proxy.stop()


class ClientStream:
    """One streamed request as its client reads it: `until(marker)` reads on until the bytes
    received hold `marker`; `rest()` reads to the end (a connection cut short ends it too)."""

    def __init__(self, http: httpx.Client, api: API, stage: str) -> None:
        headers = {"x-session-id": f"{api.value}-{stage}", "anthropic-version": "2023-06-01"}
        self.session = headers["x-session-id"]
        self.api = api
        self._context = http.stream("POST", PATHS[api], json=request(api, stage), headers=headers)
        response = self._context.__enter__()
        assert response.status_code == 200, response.read()
        self._chunks = response.iter_raw()
        self.received = b""

    def until(self, marker: str) -> None:
        while marker.encode() not in self.received:
            self.received += next(self._chunks)

    def rest(self) -> str:
        try:
            for chunk in self._chunks:
                self.received += chunk
        except httpx.TransportError:
            pass  # the proxy went away: the stream did not end, it broke
        finally:
            self._context.__exit__(None, None, None)
        return self.received.decode()

    @property
    def calls_received(self) -> int:
        """The invalid calls the client got, each named once in its protocol's events."""
        return sum(
            named_call(self.api, event) == INVALID for event in events(self.received.decode())
        )


def named_call(api: API, event: dict[str, Any]) -> str | None:
    """The tool name of the call `event` opens, if it opens one."""
    if api is API.RESPONSES and event.get("type") == "response.output_item.added":
        return event["item"].get("name")  # type: ignore[no-any-return]
    if api is API.MESSAGES and event.get("type") == "content_block_start":
        return event["content_block"].get("name")  # type: ignore[no-any-return]
    for choice in event.get("choices") or () if api is API.CHAT else ():
        for delta in choice.get("delta", {}).get("tool_calls") or ():
            return delta.get("function", {}).get("name")  # type: ignore[no-any-return]
    return None


def events(text: str) -> list[dict[str, Any]]:
    """The JSON events of an SSE text (`[DONE]` as {"done": true}), comments left out."""
    found = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                found.append({"done": True} if data == "[DONE]" else orjson.loads(data))
    return found


def ending(api: API, text: str) -> str | None:
    """How a stream ended: "terminal" (its protocol's terminal event), "error" (the protocol's
    error event: chat's error chunk then [DONE], Responses' error then response.failed,
    Messages' error), or None (cut short)."""
    seen = events(text)
    if not text.endswith("\n\n") or not seen:
        return None
    last, before = seen[-1], seen[-2] if len(seen) > 1 else {}
    if api is API.CHAT:
        if not last.get("done"):
            return None
        return "error" if "error" in before else "terminal"
    if api is API.RESPONSES:
        if last.get("type") == "response.failed" and before.get("type") == "error":
            return "error"
        return (
            "terminal"
            if last.get("type") in ("response.completed", "response.incomplete")
            else None
        )
    if last.get("type") == "error":
        return "error"
    return "terminal" if last.get("type") == "message_stop" else None


def counted_errors(http: httpx.Client, session: str) -> int:
    """The session's error count as the proxy reports it, once its store answers again."""
    for _ in range(50):
        response = http.get(f"/v1/sessions/{session}")
        if response.status_code != 503:  # the store reconnects at its next use
            break
    if response.status_code == 404:
        return 0
    assert response.status_code == 200, response.text
    return int(response.json()["errors"])


@pytest.mark.parametrize("api", list(API), ids=[a.value for a in API])
def test_a_redis_killed_mid_stream_loses_no_count_and_cuts_no_stream(
    tmp_path: Path, durable_redis: Callable[[int | None], RedisServer], api: API
) -> None:
    redis = durable_redis(None)
    release = threading.Event()
    upstream = held_upstream(release)
    with (
        LoopbackServer(upstream.app) as server,
        serving(tmp_path, server.url, redis.url) as proxy,
        httpx.Client(base_url=proxy.url, timeout=WAIT) as http,
    ):
        streams = [ClientStream(http, api, "after_call"), ClientStream(http, api, "before_call")]
        streams[0].until(INVALID if api is not API.RESPONSES else "response.completed")
        streams[1].until(TEXT)
        os.kill(redis.process.pid, signal.SIGKILL)
        redis.process.wait(WAIT)
        release.set()
        texts = [stream.rest() for stream in streams]
        durable_redis(redis.port)
        for stream, text in zip(streams, texts, strict=True):
            assert ending(api, text) is not None, text
            assert counted_errors(http, stream.session) == stream.calls_received, text
        # The call that came after the store went down never reached the client.
        assert ending(api, texts[1]) == "error", texts[1]
        assert streams[1].calls_received == 0
        failures = metric(
            http.get("/metrics").text,
            "toolsentry_session_store_errors_total",
            phase="count",
            api=api.value,
        )
        assert failures == 1
    release.set()
    assert_structured(tmp_path / "serve.log", "session_store_failed")


def assert_structured(log: Path, event: str) -> None:
    """Every line the proxy logged after its banner is a JSON object, and one is `event`."""
    lines = log.read_text().splitlines()[1:]
    logged = [orjson.loads(line)["event"] for line in lines]  # a traceback fails here
    assert event in logged


@pytest.mark.parametrize("api", [API.CHAT, API.MESSAGES], ids=["chat", "messages"])
def test_a_proxy_killed_mid_stream_over_sqlite_has_counted_the_call_its_client_got(
    tmp_path: Path, api: API
) -> None:
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    release = threading.Event()
    upstream = held_upstream(release)
    with LoopbackServer(upstream.app) as server:
        with (
            serving(tmp_path, server.url, store) as proxy,
            httpx.Client(base_url=proxy.url, timeout=WAIT) as http,
        ):
            stream = ClientStream(http, api, "after_call")
            stream.until(INVALID)
            proxy.kill()
            stream.rest()
        release.set()
        assert stream.calls_received == 1
        with (
            serving(tmp_path, server.url, store) as proxy,
            httpx.Client(base_url=proxy.url, timeout=WAIT) as http,
        ):
            assert counted_errors(http, stream.session) == 1


@pytest.mark.parametrize("api", list(API), ids=[a.value for a in API])
def test_a_plain_answer_whose_count_the_store_cannot_take_is_a_503_in_the_protocols_shape(
    tmp_path: Path, durable_redis: Callable[[int | None], RedisServer], api: API
) -> None:
    redis = durable_redis(None)
    release = threading.Event()
    upstream = held_upstream(release)
    headers = {"x-session-id": f"{api.value}-plain", "anthropic-version": "2023-06-01"}
    with (
        LoopbackServer(upstream.app) as server,
        serving(tmp_path, server.url, redis.url) as proxy,
        httpx.Client(base_url=proxy.url, timeout=WAIT) as http,
        ThreadPoolExecutor(1) as pool,
    ):
        body = request(api, "plain", stream=False)
        answered = pool.submit(http.post, PATHS[api], json=body, headers=headers)
        for _ in range(int(WAIT / 0.01)):  # the session's gate has passed: the upstream is asked
            if upstream.requests or answered.done():
                break
            threading.Event().wait(0.01)
        os.kill(redis.process.pid, signal.SIGKILL)
        redis.process.wait(WAIT)
        release.set()
        response = answered.result(WAIT)
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["type"] == "session_store_unavailable"
        assert INVALID not in response.text  # the answer it could not count is not sent
        if api is API.MESSAGES:
            assert response.json()["type"] == "error"
        # With the store still down, the next request stops at its gate, before any upstream.
        refused = http.post(PATHS[api], json=body, headers=headers)
        assert refused.status_code == 503, refused.text
        assert len(upstream.requests) == 1
        page = http.get("/metrics").text
        for phase in ("count", "begin"):
            name = "toolsentry_session_store_errors_total"
            assert metric(page, name, phase=phase, api=api.value) == 1
    release.set()
    assert_structured(tmp_path / "serve.log", "session_store_failed")
