"""What an upstream's request may hold, and for how long: a try ends at `total_timeout` however
lively the upstream (drips, keep-alive pings), a request waits at most `pool_timeout` for a
pooled connection (then 503 with `retry-after`, and /readyz says the pool is exhausted), and a
client that goes away cancels its upstream request and frees its connection.

The real proxy app on a loopback port, a hostile upstream on another (`hostile.Hostile`); every
deadline is a second or so, and nothing is asserted about how long anything took.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from proxy.app import create_app
from proxy.config import Settings
from proxy.testing import LoopbackServer
from tests.proxy.limits.hostile import Hostile
from tests.proxy.limits.test_upstream_caps import (
    BODIES,
    PATHS,
    last_event,
    post,
    streamed,
    upstream_errors,
)

SECONDS = 1.0
WAIT = 20.0  # the most any test waits for what it expects; it never measures it


@pytest.fixture
def hostile() -> Iterator[tuple[Hostile, str]]:
    script = Hostile()
    with LoopbackServer(script.app) as server:
        yield script, f"{server.url}/v1"
        script.release.set()  # let a held request go, so the server stops at once


def serve(base_url: str, **limits: Any) -> LoopbackServer:
    upstream = {"name": "hostile", "base_url": base_url, **limits}
    return LoopbackServer(create_app(Settings(upstreams=[upstream], retries=0), environ={}))


def eventually(check: Callable[[], bool]) -> bool:
    """Whether `check()` comes true within WAIT seconds (polled)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


# -- total_timeout ----------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_plain_answer_that_drips_ends_at_total_timeout_in_the_protocols_shape(
    hostile: tuple[Hostile, str], api: str
) -> None:
    # A byte every 50 ms never lets the silence timeout fire: only the try's deadline ends it.
    script, base_url = hostile
    script.mode = "drip"
    with serve(base_url, total_timeout=SECONDS, timeout=60) as proxy:
        response = post(proxy.url, api)
        assert response.status_code == 504, response.text[:300]
        assert "total_timeout" in response.json()["error"]["message"]
        assert upstream_errors(proxy.url, api) == 1
    assert eventually(lambda: len(script.gone) == 1)  # its upstream connection was closed


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_stream_of_pings_ends_at_total_timeout_with_the_protocols_error_event(
    hostile: tuple[Hostile, str], api: str
) -> None:
    script, base_url = hostile
    script.mode = "pings"
    limits = {"total_timeout": SECONDS, "timeout": 60, "max_stream_seconds": 600}
    with serve(base_url, **limits) as proxy:
        last = last_event(streamed(proxy.url, api))
        assert "total_timeout" in last
        assert ('"error"' if api == "chat" else "event: error") in last
        assert upstream_errors(proxy.url, api) == 1


# -- pool_timeout, and /readyz ----------------------------------------------------------------


def hold(url: str, api: str = "chat", **extra: Any) -> threading.Thread:
    """A request sent from a thread of its own, left waiting on the held upstream."""
    thread = threading.Thread(target=post, args=(url, api), kwargs=extra, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("api", ["chat", "messages"])
def test_a_request_that_finds_every_connection_busy_is_a_503_with_retry_after(
    hostile: tuple[Hostile, str], api: str
) -> None:
    script, base_url = hostile
    script.mode = "held"
    with serve(base_url, max_connections=1, pool_timeout=SECONDS) as proxy:
        holder = hold(proxy.url)
        assert eventually(lambda: script.requests == 1)
        response = post(proxy.url, api)
        assert response.status_code == 503, response.text[:300]
        assert response.headers["retry-after"] == "1"
        body = response.json()
        if api == "messages":
            assert body["type"] == "error"
        assert "busy" in body["error"]["message"]
        assert script.requests == 1  # it never reached the upstream
        assert upstream_errors(proxy.url, api) == 0  # the proxy's own back-pressure
        script.release.set()
        holder.join(WAIT)
        script.mode = "fine"
        assert post(proxy.url, "chat").status_code == 200


def test_readyz_reports_an_exhausted_pool_and_recovers_when_a_connection_frees(
    hostile: tuple[Hostile, str],
) -> None:
    script, base_url = hostile
    script.mode = "held"
    with serve(base_url, max_connections=1, pool_timeout=SECONDS) as proxy:
        holder = hold(proxy.url)
        assert eventually(lambda: script.requests == 1)
        ready = httpx.get(f"{proxy.url}/readyz", timeout=WAIT)
        assert ready.status_code == 503
        assert "busy" in ready.json()["error"]["message"]
        assert httpx.get(f"{proxy.url}/healthz").status_code == 200
        script.release.set()
        holder.join(WAIT)
        assert eventually(lambda: httpx.get(f"{proxy.url}/readyz").status_code == 200)


# -- a client that goes away ------------------------------------------------------------------


def send_and_leave(url: str, api: str, script: Hostile, *, stream: bool) -> None:
    """Send one request on a raw socket and close it, without reading the answer, once the
    request reached the upstream."""
    body = orjson.dumps({**BODIES[api], "stream": stream})
    host, port = url.removeprefix("http://").split(":")
    head = (
        f"POST {PATHS[api]} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"anthropic-version: 2023-06-01\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((host, int(port))) as client:
        client.sendall(head.encode() + body)
        assert eventually(lambda: script.requests == 1)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_client_that_leaves_cancels_its_upstream_request_and_frees_the_connection(
    hostile: tuple[Hostile, str], api: str, stream: bool
) -> None:
    # The upstream holds its answer (a stream's head too): only the client's leaving can end it.
    script, base_url = hostile
    script.mode = "held"
    with serve(base_url, max_connections=1, pool_timeout=WAIT) as proxy:
        send_and_leave(proxy.url, api, script, stream=stream)
        assert eventually(lambda: len(script.gone) == 1), "the upstream request went on"
        script.mode = "fine"
        assert post(proxy.url, "chat").status_code == 200  # the one connection is free


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_client_that_leaves_a_stream_midway_cancels_its_upstream_stream(
    hostile: tuple[Hostile, str], api: str
) -> None:
    script, base_url = hostile
    script.mode = "pings"
    with serve(base_url, max_connections=1, pool_timeout=WAIT) as proxy:
        body = {**BODIES[api], "stream": True}
        headers = {"anthropic-version": "2023-06-01"}
        with httpx.stream("POST", proxy.url + PATHS[api], json=body, headers=headers) as reply:
            assert reply.status_code == 200
            next(reply.iter_bytes())  # the stream is under way; then the client leaves
        assert eventually(lambda: len(script.gone) == 1), "the upstream stream went on"
        script.mode = "fine"
        assert post(proxy.url, "chat").status_code == 200
