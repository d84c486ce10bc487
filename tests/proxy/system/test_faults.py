"""An upstream that misbehaves on cue: every fault gives the client a retried success or a clear
OpenAI-shaped error, counts stay exact, and nothing leaks (descriptors, tasks) or survives a
crash uncounted. All traffic stays on loopback; every loop is bounded.

Faults in the middle of a stream are left to the streaming tests.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from proxy.app import create_app
from proxy.config import Settings
from proxy.testing import (
    Fault,
    LoopbackServer,
    Reset,
    ScriptedReply,
    ScriptedUpstream,
    completion,
    tool_call,
    unused_socket,
)
from tests.proxy.builders import make_request
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.metrics_text import metric
from tests.proxy.system.support import ProxyProcess, fire

MODEL = "scripted-model"
# Seconds an upstream hangs, and the proxy's shorter timeout: generous enough that a loaded
# machine never makes a prompt answer look like a hang.
HANG = 3.0
TIMEOUT = 1.5


def assert_openai_error(response: httpx.Response, status: int, error_type: str) -> None:
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == error_type
    assert error["message"]


def post(proxy: RunningProxy, session: str) -> httpx.Response:
    with proxy.http() as http:
        return http.post(
            "/v1/chat/completions", json=make_request(), headers={"x-session-id": session}
        )


@pytest.fixture
def fragile_proxy(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> RunningProxy:
    return make_proxy(
        upstreams=[{"name": "scripted", "base_url": upstream.base_url, "timeout": TIMEOUT}],
        retries=2,
    )


OK = completion("fine")


def upstream_error(message: str, error_type: str, code: int) -> dict[str, Any]:
    """An error body as vLLM sends it; the proxy passes such bodies through unchanged."""
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


REPLIES: dict[str, tuple[list[ScriptedReply], int, int, str | None]] = {
    # name: (script, upstream calls, client status, error type or None for a success)
    "500 is not retried": ([Fault(500, upstream_error("boom", "x", 500))], 1, 500, "x"),
    "500 without an error body": ([Fault(500, b"<html>oops</html>")], 1, 500, "upstream_error"),
    "502 then success": ([Fault(502), OK], 2, 200, None),
    "503 until retries run out": ([Fault(503)], 3, 503, "upstream_error"),
    "hang then success": ([Fault(200, OK, delay=HANG), OK], 2, 200, None),
    "hang past every retry": ([Fault(200, OK, delay=HANG)], 3, 504, "upstream_timeout"),
    "reset then success": ([Reset(), OK], 2, 200, None),
    "reset every time": ([Reset()], 3, 502, "upstream_connect_error"),
    "invalid JSON": ([Fault(200, b'{"choices": [')], 1, 502, "upstream_protocol_error"),
    "not a chat completion": ([Fault(200, {"data": []})], 1, 502, "upstream_protocol_error"),
}


@pytest.mark.parametrize("case", list(REPLIES))
def test_each_fault_gives_a_retried_success_or_a_clear_error_and_exact_counts(
    case: str, fragile_proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    script, calls, status, error_type = REPLIES[case]
    upstream.script.push(*script)
    response = post(fragile_proxy, "s-fault")
    if error_type is None:
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == "fine"
    else:
        assert_openai_error(response, status, error_type)
    assert len(upstream.script.requests) == calls

    session = fragile_proxy.session("s-fault")
    assert session["requests"] == 1
    assert session["channels"] == ({} if error_type is None else {"upstream_error": 1})
    assert session["errors"] == 0  # an upstream failure is not the agent's tool error
    text = fragile_proxy.metrics()
    assert (
        metric(text, "toolsentry_requests_total", api="chat", model=MODEL, status=str(status)) == 1
    )
    failures = metric(
        text,
        "toolsentry_violations_total",
        api="chat",
        may_be_absent=error_type is None,
        model=MODEL,
        channel="upstream_error",
    )
    assert failures == (0 if error_type is None else 1)


def test_an_upstream_down_at_start_gives_502_until_it_comes_back(
    make_proxy: Callable[..., RunningProxy],
) -> None:
    # Bound but not listening: refused until the upstream listens on this very socket.
    reserved = unused_socket()
    port = reserved.getsockname()[1]
    proxy = make_proxy(
        upstreams=[{"name": "late", "base_url": f"http://127.0.0.1:{port}/v1"}], retries=1
    )
    response = post(proxy, "s-late")
    assert_openai_error(response, 502, "upstream_connect_error")
    assert "late" in response.json()["error"]["message"]

    script = ScriptedUpstream(replies=[completion("back")])
    with LoopbackServer(script.app, sock=reserved):
        response = post(proxy, "s-late")
        assert response.status_code == 200
        assert response.json()["choices"][0]["message"]["content"] == "back"
    session = proxy.session("s-late")
    assert (session["requests"], session["channels"]) == (2, {"upstream_error": 1})


# -- nothing leaks over many faults --------------------------------------------------------------

KINDS: dict[str, tuple[ScriptedReply, int, str | None]] = {
    # kind: (reply, client status, error type) with retries off, so one call per request
    "ok": (completion(tool_calls=[tool_call("get_order_details", {"order_id": "#W1"})]), 200, None),
    "500": (Fault(500), 500, "upstream_error"),
    "502": (Fault(502), 502, "upstream_error"),
    "503": (Fault(503, upstream_error("busy", "overloaded", 503)), 503, "overloaded"),
    # The answer comes 3 s after the proxy's timeout: a proxy whose loop a loaded machine
    # stalls past its timer would otherwise read a late answer before the timer runs.
    "hang": (Fault(200, completion("late"), delay=HANG + 3), 504, "upstream_timeout"),
    "reset": (Reset(), 502, "upstream_connect_error"),
    "invalid-json": (Fault(200, b"{nope"), 502, "upstream_protocol_error"),
    "not-a-completion": (Fault(200, {"object": "list"}), 502, "upstream_protocol_error"),
}


# A thousand requests cycling through the prompt kinds, with a hang every 40th (a hang holds a
# connection for the whole timeout, so fewer of them keep the test quick).
_PROMPT = [kind for kind in KINDS if kind != "hang"]
FAULTY_LOAD = ["hang" if i % 40 == 39 else _PROMPT[i % len(_PROMPT)] for i in range(1000)]


def by_kind(body: dict[str, Any]) -> ScriptedReply:
    return KINDS[body["messages"][-1]["content"]][0]


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """The proxy under uvicorn in this test's own event loop, so its tasks can be counted."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="error", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done(), "proxy did not start"
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


async def settle(measure: Callable[[], int], target: int | None = None) -> int:
    """Wait (bounded) for closing connections to finish closing: until `measure` is at most
    `target`, or without a target until it holds still; return the last value."""
    last, still = measure(), 0
    for _ in range(200):
        await asyncio.sleep(0.05)
        value = measure()
        if target is not None and value <= target:
            return value
        still = still + 1 if value == last else 0
        if target is None and still >= 5:
            return value
        last = value
    return measure()


@pytest.mark.slow
async def test_descriptors_and_tasks_return_to_their_level_after_a_thousand_faults() -> None:
    script = ScriptedUpstream(handler=by_kind)
    with LoopbackServer(script.app) as upstream:
        settings = Settings(
            upstreams=[{"name": "scripted", "base_url": f"{upstream.url}/v1", "timeout": HANG}],
            retries=0,
        )
        app = create_app(settings)
        router = app.state.pipeline.router
        async with serving(app) as url:

            async def load(schedule: list[str]) -> None:
                gate = asyncio.Semaphore(20)
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:

                    async def one(kind: str) -> None:
                        async with gate:
                            response = await client.post(
                                "/v1/chat/completions",
                                json=make_request(kind),
                                headers={"x-session-id": kind},
                            )
                        _, status, error_type = KINDS[kind]
                        if error_type is None:
                            assert response.status_code == 200, response.text
                        else:
                            assert_openai_error(response, status, error_type)

                    await asyncio.gather(*(one(kind) for kind in schedule))
                await router.close()  # the pool reopens on the next request

            warm_up = list(KINDS)
            await load(warm_up)  # imports, caches, first connections
            fds = await settle(open_descriptors)
            tasks = await settle(lambda: len(asyncio.all_tasks()))
            await load(FAULTY_LOAD)
            assert await settle(open_descriptors, fds) <= fds
            assert await settle(lambda: len(asyncio.all_tasks()), tasks) <= tasks

            sent = Counter(warm_up + FAULTY_LOAD)
            async with httpx.AsyncClient(base_url=url) as client:
                text = (await client.get("/metrics")).text
                for kind, count in sent.items():
                    session = (await client.get(f"/v1/sessions/{kind}")).json()
                    assert session["requests"] == count
                    expected = {} if kind == "ok" else {"upstream_error": count}
                    assert session["channels"] == expected
        by_status: Counter[int] = Counter()
        for kind, count in sent.items():
            by_status[KINDS[kind][1]] += count
        for status, count in by_status.items():
            assert (
                metric(
                    text, "toolsentry_requests_total", api="chat", model=MODEL, status=str(status)
                )
                == count
            )
        failures = sum(count for kind, count in sent.items() if kind != "ok")
        assert metric(
            text, "toolsentry_violations_total", api="chat", model=MODEL, channel="upstream_error"
        ) == (failures)


# -- a crash loses no answered request -----------------------------------------------------------


@pytest.mark.slow
async def test_a_proxy_killed_mid_load_and_restarted_on_sqlite_lost_no_answered_increment(
    upstream: RunningUpstream, tmp_path: Path
) -> None:
    upstream.script.push(completion(tool_calls=[tool_call("refund_everything", {})]))
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    args = ["--repair", "off", "--max-errors", "100000", "--store", store]
    proxy = ProxyProcess(upstream.base_url, tmp_path / "first.log", *args).wait_ready()
    concurrency = 10

    async def kill_after_answers(load: asyncio.Task[Any], answers: int) -> None:
        for _ in range(3000):  # bounded: at most about 30 s
            if len(upstream.script.requests) >= answers or load.done():
                break
            await asyncio.sleep(0.01)
        proxy.kill()

    load = asyncio.ensure_future(
        fire([proxy.url], 2000, concurrency=concurrency, session="crash", request_timeout=10)
    )
    await kill_after_answers(load, 150)
    outcomes = await load
    answered = sum(1 for o in outcomes if o.status == 200)
    assert 0 < answered < 2000, "the kill should land mid-load"
    assert {o.status for o in outcomes} <= {200, 0}

    restarted = ProxyProcess(
        upstream.base_url, tmp_path / "second.log", *args, port=proxy.port
    ).wait_ready()
    try:
        session = await asyncio.to_thread(restarted.session, "crash")
    finally:
        restarted.stop()
    # Every answered request was counted; at most the requests in flight at the kill more.
    assert answered <= session["errors"] <= answered + concurrency
    assert session["channels"] == {"unknown_tool": session["errors"]}
