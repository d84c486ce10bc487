"""A chat request through the proxy costs its Redis store at most two round trips: one when its
turn begins (session, budget gate, tool errors claimed) and one when it closes (what the turn
found), counted by a real `redis-server`'s MONITOR."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from proxy.testing import completion, tool_call
from tests.conftest import RedisServer
from tests.proxy.builders import make_request
from tests.proxy.conftest import RunningProxy, RunningUpstream

pytestmark = pytest.mark.redis

_END = "end-of-the-counted-request"


@contextmanager
def commands_sent(server: RedisServer) -> Iterator[list[str]]:
    """The commands clients send to `server` inside the block (those its scripts run left out),
    as MONITOR lists them; the list is filled when the block ends."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as monitor:
        monitor.sendall(b"MONITOR\r\n")
        assert monitor.recv(5) == b"+OK\r\n"
        sent: list[str] = []
        yield sent
        server.command("ECHO", _END)
        seen = b""
        while _END.encode() not in seen:
            chunk = monitor.recv(65536)
            assert chunk, "MONITOR closed before the end marker"
            seen += chunk
    for line in seen.decode(errors="replace").splitlines():
        if line.startswith("+") and " lua]" not in line and _END not in line:
            sent.append(line)


def with_failed_tool_result() -> dict[str, Any]:
    """A chat request whose history holds a tool result that reports an error."""
    request = make_request()
    request["messages"] += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [tool_call("find_user_id_by_email", {"email": "a@b.c"}, id="call_1")],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Error: no such user"},
        {"role": "user", "content": "Try again."},
    ]
    return request


@pytest.fixture
def redis_proxy(
    make_proxy: Callable[..., RunningProxy], redis_url: str, upstream: RunningUpstream
) -> RunningProxy:
    proxy = make_proxy(store=redis_url, repair="off")
    # A first request makes the connection and loads the scripts: costs of a connection, once.
    upstream.script.push(completion("hello"))
    proxy.client().chat.completions.create(**make_request("warm-up"))
    return proxy


def test_a_plain_chat_request_costs_at_most_two_redis_round_trips(
    redis_proxy: RunningProxy, upstream: RunningUpstream, redis_server: RedisServer
) -> None:
    upstream.script.push(completion("Your order ships today."))
    with commands_sent(redis_server) as sent:
        redis_proxy.client().chat.completions.create(
            **make_request(), extra_headers={"x-session-id": "plain"}
        )
    assert 1 <= len(sent) <= 2, sent
    assert redis_proxy.session("plain")["requests"] == 1


def test_a_request_with_a_tool_error_and_a_failed_answer_costs_at_most_two_round_trips(
    redis_proxy: RunningProxy, upstream: RunningUpstream, redis_server: RedisServer
) -> None:
    # The history's tool error is claimed and counted as the turn begins; the answer's unknown
    # tool, not repaired (repair off), is counted, and its call id marked, as the turn closes.
    upstream.script.push(completion(tool_calls=[tool_call("no_such_tool", {}, id="call_2")]))
    request = with_failed_tool_result()
    with commands_sent(redis_server) as sent:
        redis_proxy.client().chat.completions.create(
            **request, extra_headers={"x-session-id": "failing"}
        )
    assert 1 <= len(sent) <= 2, sent
    session = redis_proxy.session("failing")
    assert (session["errors"], session["requests"]) == (2, 1)
    assert session["channels"] == {"tool_error": 1, "unknown_tool": 1}
