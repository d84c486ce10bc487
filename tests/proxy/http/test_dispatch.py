"""The turn routes' one dispatch path: every request counted and logged once, with its status
and its request id, however it ended."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from proxy.testing import SSE, Fault, completion, tool_call
from tests.proxy.builders import make_request
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.metrics_text import metric

CHAT = "/v1/chat/completions"


def requests_counted(proxy: RunningProxy, status: int, model: str = "scripted-model") -> float:
    return metric(
        proxy.metrics(),
        "toolsentry_requests_total",
        may_be_absent=True,  # asked for statuses that must read 0 too
        api="chat",
        model=model,
        status=str(status),
    )


def request_lines(log: io.StringIO) -> list[dict[str, Any]]:
    events = [json.loads(line) for line in log.getvalue().splitlines()]
    return [e for e in events if e["event"] == "request"]


def hallucination() -> dict[str, Any]:
    return completion(tool_calls=[tool_call("cancel_order", {"order_id": "W1"})])


def test_an_unrepaired_call_rejected_with_422_is_counted_as_422(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, log: io.StringIO
) -> None:
    proxy = make_proxy(on_unrepaired="reject", repair="off")
    upstream.script.push(hallucination())
    with proxy.http() as http:
        assert http.post(CHAT, json=make_request()).status_code == 422
    assert requests_counted(proxy, 422) == 1
    assert requests_counted(proxy, 200) == 0
    (line,) = request_lines(log)
    assert (line["status"], line["channels"], line["api"]) == (422, "unknown_tool", "chat")


@pytest.mark.parametrize(
    ("case", "status"),
    [("bad_json", 400), ("no_key", 401), ("unknown_model", 404), ("too_large", 413)],
)
def test_a_request_refused_before_its_turn_is_counted_and_logged_with_its_status(
    make_proxy: Callable[..., RunningProxy],
    upstream: RunningUpstream,
    log: io.StringIO,
    case: str,
    status: int,
) -> None:
    proxy = make_proxy(
        api_keys=["k1"],
        max_body_bytes=4096,
        upstreams=[
            {"name": "scripted", "base_url": upstream.base_url, "models": ["scripted-model"]},
            {"name": "second", "base_url": upstream.base_url, "models": ["other-model"]},
        ],
    )
    headers = {"authorization": "Bearer k1", "content-type": "application/json"}
    body = json.dumps(make_request()).encode()
    if case == "bad_json":
        body = b'{"model": "scripted-model", "messages": ['
    elif case == "no_key":
        headers.pop("authorization")
    elif case == "unknown_model":
        body = json.dumps(make_request(model="nobody")).encode()
    else:
        body = json.dumps(make_request("x" * 5000)).encode()
    with proxy.http() as http:
        assert http.post(CHAT, content=body, headers=headers).status_code == status
    # A model no upstream lists is labelled `other` (issue 32: bounded model labels).
    model = "other" if case == "unknown_model" else "scripted-model"
    counted = requests_counted(proxy, status, model) + requests_counted(proxy, status, "")
    assert counted == 1
    (line,) = request_lines(log)
    assert (line["status"], line["api"]) == (status, "chat")
    assert upstream.script.requests == []


def test_a_streams_log_line_says_how_it_ended(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, log: io.StringIO
) -> None:
    proxy = make_proxy(on_unrepaired="reject", repair="off")
    upstream.script.push(SSE.of(completion("fine")), SSE.of(hallucination()))
    with proxy.http() as http:
        for _ in range(2):
            with http.stream("POST", CHAT, json=make_request(stream=True)) as response:
                assert response.status_code == 200
                response.read()
    first, second = request_lines(log)
    assert (first["status"], first["stream"], first["channels"]) == (200, True, None)
    assert (second["status"], second["stream"], second["channels"]) == (422, True, "unknown_tool")
    assert requests_counted(proxy, 422) == 1


def test_every_event_of_a_request_carries_its_request_id(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, log: io.StringIO
) -> None:
    proxy = make_proxy(max_reasks=1)
    upstream.script.push(hallucination(), Fault(500, {"error": {"message": "engine died"}}))
    with proxy.http() as http:
        response = http.post(CHAT, json=make_request(), headers={"x-request-id": "req-42"})
    assert response.status_code == 200
    events = [json.loads(line) for line in log.getvalue().splitlines()]
    failed = [e for e in events if e["event"] == "reask_failed"]
    assert [e["request_id"] for e in failed] == ["req-42"]
    assert [e["request_id"] for e in request_lines(log)] == ["req-42"]


def test_a_request_id_is_not_left_behind_for_the_next_request(
    proxy: RunningProxy, upstream: RunningUpstream, log: io.StringIO
) -> None:
    upstream.script.push(completion("one"), completion("two"))
    with proxy.http() as http:
        http.post(CHAT, json=make_request(), headers={"x-request-id": "first"})
        http.post(CHAT, json=make_request())
    ids = [e["request_id"] for e in request_lines(log)]
    assert ids[0] == "first"
    assert ids[1] != "first"
    assert len(ids[1]) == 32


def test_a_route_behind_middleware_answers_through_the_same_dispatch(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, log: io.StringIO
) -> None:
    proxy = make_proxy(api_keys=["k1"])
    proxy.app.root_path = "/base"  # the shortcut steps aside; FastAPI's route answers
    with httpx.Client(base_url=proxy.server.url, timeout=10) as http:
        refused = http.post(f"/base{CHAT}", json=make_request())
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"
    assert [line["status"] for line in request_lines(log)] == [401]
