"""A `stream` flag (and `stream_options.include_usage`) that is not a JSON boolean is read as the
upstream reads it: vLLM's request models of all three protocols declare them `bool | None` in
pydantic's lax mode, so "false" is false and "true" true, and a string that is no boolean is a
400.

Before, the proxy tested the flag's truthiness: `"stream": "false"` made it expect a stream the
upstream never sent, and `"stream": "maybe"` went upstream at all.
"""

from __future__ import annotations

import pytest

from proxy.http.dispatch import read_flags
from tests.proxy.security.support import TURN_ROUTES, Proxy, RecordingUpstream, send, turn_body


@pytest.mark.parametrize("route", list(TURN_ROUTES))
@pytest.mark.parametrize("flag", ["false", "False", "0", "no", 0])
def test_a_false_string_answers_plainly_as_the_upstream_does(
    edge: Proxy, upstream: RecordingUpstream, route: str, flag: object
) -> None:
    reply = send(edge.port, "POST", route, turn_body(route, stream=flag))
    assert reply.status == 200, reply.body
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.checked
    assert reply.json()  # a whole body, not events
    assert len(upstream.received) == 1


@pytest.mark.parametrize("route", list(TURN_ROUTES))
@pytest.mark.parametrize("flag", ["true", "1", "yes"])
def test_a_true_string_streams_as_the_upstream_does(
    edge: Proxy, upstream: RecordingUpstream, route: str, flag: str
) -> None:
    reply = send(edge.port, "POST", route, turn_body(route, stream=flag))
    assert reply.status == 200, reply.body
    assert reply.headers["content-type"].startswith("text/event-stream")
    assert b"hello" in reply.body or b"hel" in reply.body


@pytest.mark.parametrize("route", list(TURN_ROUTES))
@pytest.mark.parametrize("flag", ["maybe", 2, [True], {"on": True}])
def test_a_flag_that_is_no_boolean_is_refused_in_the_protocols_shape(
    edge: Proxy, upstream: RecordingUpstream, route: str, flag: object
) -> None:
    reply = send(edge.port, "POST", route, turn_body(route, stream=flag))
    assert reply.status == 400, reply.body
    body = reply.json()
    if route == "/v1/messages":
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["param"] == "stream"
    assert upstream.received == []


@pytest.mark.parametrize("flag", ["false", "0", "off"])
def test_a_false_string_for_include_usage_is_read_as_false(flag: str) -> None:
    body = {"stream": "true", "stream_options": {"include_usage": flag}}
    read_flags(body)
    assert body == {"stream": True, "stream_options": {"include_usage": False}}


def test_an_include_usage_that_is_no_boolean_is_refused_before_the_upstream(
    edge: Proxy, upstream: RecordingUpstream
) -> None:
    body = turn_body("/v1/chat/completions", stream=True)
    body["stream_options"] = {"include_usage": "maybe"}
    reply = send(edge.port, "POST", "/v1/chat/completions", body)
    assert reply.status == 400, reply.body
    assert reply.json()["error"]["param"] == "stream_options.include_usage"
    assert upstream.received == []
