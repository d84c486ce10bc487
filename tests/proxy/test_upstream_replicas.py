"""Tests for proxy/upstream_replicas.py: the replicas of one deployment behind the real proxy, each
a real server on loopback (or a port that refuses), spoken to with the real SDK."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import openai
import pytest

from proxy.testing import (
    Fault,
    LoopbackServer,
    ScriptedReply,
    ScriptedUpstream,
    completion,
    unused_socket,
)
from tests.proxy.builders import make_request
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.metrics_text import metric

WAIT = 20.0  # the most a test waits for what it expects; it never measures it


def tries(proxy: RunningProxy, url: str) -> float:
    return metric(proxy.metrics(), "toolsentry_replica_tries_total", upstream="pool", replica=url)


def cooldowns(proxy: RunningProxy, url: str) -> float:
    text = proxy.metrics()
    return metric(text, "toolsentry_replica_cooldowns_total", upstream="pool", replica=url)


def outstanding(proxy: RunningProxy, url: str) -> float:
    text = proxy.metrics()
    return metric(text, "toolsentry_replica_outstanding", upstream="pool", replica=url)


def pool(*urls: str, **options: object) -> dict[str, object]:
    """An upstream entry named pool with the replicas at `urls`."""
    return {"name": "pool", "base_urls": list(urls), **options}


@contextmanager
def scripted(*replies: ScriptedReply) -> Iterator[RunningUpstream]:
    script = ScriptedUpstream(list(replies))
    with LoopbackServer(script.app) as server:
        yield RunningUpstream(script, server)


def ask(proxy: RunningProxy, *, stream: bool = False) -> str:
    """One chat request through the real SDK; the answer's text."""
    client = proxy.client()
    request = make_request(tools=[])
    if not stream:
        return client.chat.completions.create(**request).choices[0].message.content or ""
    chunks = client.chat.completions.create(**request, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_refused_replica_cools_down_and_its_request_is_answered_by_another(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, stream: bool
) -> None:
    with unused_socket() as gone:
        down = f"http://127.0.0.1:{gone.getsockname()[1]}/v1"
        proxy = make_proxy(upstreams=[pool(down, upstream.base_url)], retries=1)
        upstream.script.push(completion("from the live one"))
        # The first request's first try goes to the first replica, which refuses it.
        assert ask(proxy, stream=stream) == "from the live one"
        assert (tries(proxy, down), cooldowns(proxy, down)) == (1, 1)
        for _ in range(3):  # cooling (for the default 10 s), it is passed over
            assert ask(proxy, stream=stream) == "from the live one"
        assert tries(proxy, down) == 1
        assert tries(proxy, upstream.base_url) == 4
        assert outstanding(proxy, down) == outstanding(proxy, upstream.base_url) == 0


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_replica_back_on_its_port_answers_again_once_its_cool_down_ends(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, stream: bool
) -> None:
    gone = unused_socket()
    down = f"http://127.0.0.1:{gone.getsockname()[1]}/v1"
    proxy = make_proxy(upstreams=[pool(down, upstream.base_url, cooldown_seconds=0.2)], retries=1)
    upstream.script.push(completion("from the live one"))
    assert ask(proxy, stream=stream) == "from the live one"
    back = ScriptedUpstream([completion("from the one back")])
    with LoopbackServer(back.app, sock=gone):
        deadline = time.monotonic() + WAIT
        while not back.requests and time.monotonic() < deadline:
            assert ask(proxy, stream=stream) in {"from the live one", "from the one back"}
        assert back.requests, "the replica was not used again after its cool-down"
        assert cooldowns(proxy, down) == 1


def test_a_503_moves_the_request_to_another_replica_without_cooling_the_first(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    with scripted(Fault(503)) as refusing:
        proxy = make_proxy(upstreams=[pool(refusing.base_url, upstream.base_url)], retries=1)
        upstream.script.push(completion("answered"))
        assert ask(proxy) == "answered"
        assert len(refusing.script.requests) == 1
        assert cooldowns(proxy, refusing.base_url) == 0


def test_with_every_replica_down_the_client_gets_the_error_after_the_retries(
    make_proxy: Callable[..., RunningProxy],
) -> None:
    gone = [unused_socket(), unused_socket()]
    urls = [f"http://127.0.0.1:{s.getsockname()[1]}/v1" for s in gone]
    proxy = make_proxy(upstreams=[pool(*urls)], retries=2)
    with pytest.raises(openai.APIStatusError) as raised:
        ask(proxy)
    assert raised.value.status_code == 502
    # Three tries: one on each, then (both cooling) the one whose cool-down ends first.
    assert [tries(proxy, url) for url in urls] == [2, 1]
    assert [cooldowns(proxy, url) for url in urls] == [2, 1]
    for sock in gone:
        sock.close()


def test_readyz_is_ready_while_one_replica_answers(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    gone = unused_socket()
    down = f"http://127.0.0.1:{gone.getsockname()[1]}/v1"
    proxy = make_proxy(upstreams=[pool(down, upstream.base_url)], retries=1)
    with proxy.http() as http:
        assert http.get("/readyz").status_code == 200
    alone = make_proxy(upstreams=[pool(down, f"http://127.0.0.1:{unused_port()}/v1")])
    with alone.http() as http:
        assert http.get("/readyz").status_code == 503
    gone.close()


def test_sessions_count_every_request_whichever_replica_answered_it(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    with scripted(completion("b")) as second:
        upstream.script.push(completion("a"))
        proxy = make_proxy(upstreams=[pool(upstream.base_url, second.base_url)])
        client = proxy.client(default_headers={"x-session-id": "moving"})
        for _ in range(6):
            client.chat.completions.create(**make_request(tools=[]))
        assert len(upstream.script.requests) == len(second.script.requests) == 3
        assert proxy.session("moving")["requests"] == 6


def unused_port() -> int:
    with unused_socket() as sock:
        return int(sock.getsockname()[1])


def test_two_entries_listing_one_model_share_its_requests(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    with scripted(completion("b")) as second:
        upstream.script.push(completion("a"))
        entries = [
            {"name": "a", "base_url": upstream.base_url, "models": ["scripted-model"]},
            {"name": "b", "base_url": second.base_url, "models": ["scripted-model"]},
        ]
        proxy = make_proxy(upstreams=entries)
        assert sorted(ask(proxy) for _ in range(4)) == ["a", "a", "b", "b"]
        text = proxy.metrics()
        assert (
            metric(text, "toolsentry_replica_tries_total", upstream="b", replica=second.base_url)
            == 2
        )
        with httpx.Client(base_url=proxy.server.url) as http:
            models = http.get("/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["scripted-model"]


def test_upstream_urls_given_as_a_list_are_replicas_of_every_model(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    # As `--upstream A --upstream B` or TOOLSENTRY_UPSTREAMS=A,B give them.
    with scripted(completion("b")) as second:
        upstream.script.push(completion("a"))
        proxy = make_proxy(upstreams=[upstream.base_url, second.base_url])
        assert sorted(ask(proxy) for _ in range(4)) == ["a", "a", "b", "b"]
