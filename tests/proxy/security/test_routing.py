"""Routing that cannot be side-stepped: no spelling of a turn route reaches the upstream but
through the turn, and the raw pass-through forwards only vLLM's public client endpoints.

Each of these failed before the edge existed: `/v1/./chat/completions` (and every dot-segment,
doubled-slash and `%2E` spelling) fell to the pass-through, whose URL library normalised it back
to `/v1/chat/completions` upstream, answered unchecked; `POST /collective_rpc` reached the
upstream with the upstream's own key.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.proxy.security.support import (
    TURN_ROUTES,
    UPSTREAM_KEY,
    Proxy,
    RecordingUpstream,
    send,
    turn_body,
)

SPELLINGS = [
    "/v1/./{rest}",
    "/v1/{rest}/.",
    "/v1/x/../{rest}",
    "/v1//{rest}",
    "//v1/{rest}",
    "/v1/%2E/{rest}",
    "/v1/%2e%2e/v1/{rest}",
    "/v1/.%2E/v1/{rest}",
    "/./v1/{rest}",
    "/v1/{rest}/x/..",
]


def spell(route: str, spelling: str) -> str:
    return spelling.format(rest=route.removeprefix("/v1/"))


@pytest.mark.parametrize("route", list(TURN_ROUTES))
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_turn_route_spelled_otherwise_is_refused_and_never_reaches_the_upstream(
    edge: Proxy, upstream: RecordingUpstream, route: str, spelling: str
) -> None:
    reply = send(edge.port, "POST", spell(route, spelling), turn_body(route))
    assert reply.status == 400
    error = reply.json()["error"]
    assert "normal form" in error["message"]
    if route == "/v1/messages":  # in the protocol's own error shape
        assert reply.json()["type"] == "error"
    assert upstream.received == []


@pytest.mark.parametrize("route", list(TURN_ROUTES))
def test_the_turn_route_itself_and_its_percent_encoded_spelling_are_checked(
    edge: Proxy, upstream: RecordingUpstream, route: str
) -> None:
    encoded = route.replace("/v1/", "/v1/%" + format(ord(route[4]), "02X"), 1)
    encoded = encoded[:7] + encoded[8:]  # the first letter after /v1/ as %XX
    for path in (route, encoded):
        reply = send(edge.port, "POST", path, turn_body(route))
        assert reply.status == 200, reply.body
        assert reply.checked
    assert [r.path for r in upstream.received] == [route, route]
    assert all(r.raw_path == route for r in upstream.received)


# Spellings of a turn route: segments percent-encoded letter by letter, `.` and `x/..`
# segments and empty segments put in between, a trailing `/.` or `/`.
_SEGMENT_NOISE = st.sampled_from(["", "", "", "./", "%2E/", "x/../", "/", "%2e%2E/v1/../"])


@st.composite
def spellings(draw: st.DrawFn) -> tuple[str, str]:
    route = draw(st.sampled_from(list(TURN_ROUTES)))
    out = "/"
    for segment in route.strip("/").split("/"):
        out += draw(_SEGMENT_NOISE)
        encoded = "".join(
            f"%{ord(c):02X}" if draw(st.booleans()) and draw(st.booleans()) else c for c in segment
        )
        out += encoded + draw(st.sampled_from(["/", "/", "/", "%2F", "%2f"]))
    out = out[: -3 if out.endswith(("%2F", "%2f")) else -1] + draw(
        st.sampled_from(["", "", "/", "/.", "/./", "%2F"])
    )
    return route, out


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(spelled=spellings())
def test_no_spelling_of_a_turn_route_reaches_the_upstream_unchecked(
    edge: Proxy, upstream: RecordingUpstream, spelled: tuple[str, str]
) -> None:
    route, path = spelled
    upstream.clear()
    reply = send(edge.port, "POST", path, turn_body(route))
    if reply.status == 200:
        # Answered: through the turn, checked, and the upstream got the route as spelled.
        assert reply.checked, (path, reply.body)
        assert [r.raw_path for r in upstream.received] == [route]
    else:
        # Refused at the edge (not in normal form) or by the pass-through (no such endpoint).
        assert reply.status in (400, 404), (path, reply.status, reply.body)
        assert upstream.received == [], path


@pytest.mark.parametrize(
    "path",
    [
        "/v1/./completions",
        "/./tokenize",
        "//tokenize",
        "/v1/completions/../chat/completions",
        "/v1/embeddings/%2E%2E/chat/completions",
        "/v1/messages/count_tokens/../../messages",
        "/x/../collective_rpc",
    ],
)
def test_a_pass_through_path_spelled_otherwise_is_refused(
    edge: Proxy, upstream: RecordingUpstream, path: str
) -> None:
    reply = send(edge.port, "POST", path, turn_body("/v1/chat/completions"))
    assert reply.status == 400
    assert upstream.received == []


CONTROL = [
    ("POST", "/collective_rpc"),
    ("POST", "/reset_prefix_cache"),
    ("POST", "/reset_mm_cache"),
    ("POST", "/sleep"),
    ("POST", "/wake_up"),
    ("GET", "/is_sleeping"),
    ("POST", "/start_profile"),
    ("POST", "/stop_profile"),
    ("POST", "/scale_elastic_ep"),
    ("POST", "/is_scaling_elastic_ep"),
    ("POST", "/v1/load_lora_adapter"),
    ("POST", "/v1/unload_lora_adapter"),
    ("POST", "/pause"),
    ("POST", "/resume"),
    ("GET", "/server_info"),
    ("POST", "/invocations"),
    ("POST", "/update_weights"),
    ("GET", "/docs"),
    ("GET", "/openapi.json/../x"),
    ("DELETE", "/v1/completions"),
    ("GET", "/v1/chat/completions"),
    ("PUT", "/v1/messages"),
]


@pytest.mark.parametrize(("method", "path"), CONTROL)
def test_vllms_control_endpoints_and_other_methods_never_reach_the_upstream(
    edge: Proxy, upstream: RecordingUpstream, method: str, path: str
) -> None:
    reply = send(edge.port, method, path, {"method": "x"} if method != "GET" else None)
    assert reply.status in (400, 404, 405), reply.body
    if reply.status == 404:
        assert reply.json()["error"]["type"] in ("not_found_error", "not_found")
    assert upstream.received == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/completions"),
        ("POST", "/v1/embeddings"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("POST", "/v1/score"),
        ("POST", "/v1/rerank"),
        ("POST", "/pooling"),
        ("POST", "/v1/messages/count_tokens"),
        ("GET", "/health"),
    ],
)
def test_vllms_public_client_endpoints_pass_through_on_the_path_matched(
    edge: Proxy, upstream: RecordingUpstream, method: str, path: str
) -> None:
    reply = send(edge.port, method, path, {"model": "m"} if method == "POST" else None)
    assert reply.status == 200, reply.body
    [got] = upstream.received
    assert (got.method, got.raw_path) == (method, path)
    assert got.header("authorization") == f"Bearer {UPSTREAM_KEY}"


def test_a_denied_path_answers_in_the_messages_error_shape_under_v1_messages(
    edge: Proxy, upstream: RecordingUpstream
) -> None:
    reply = send(edge.port, "POST", "/v1/messages/batches", {"model": "m"})
    assert reply.status == 404
    assert reply.json()["type"] == "error"
    assert reply.json()["error"]["type"] == "not_found_error"
    assert upstream.received == []
