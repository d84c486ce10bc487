"""Security at the edges: keys guard the routes, secrets and message contents stay out of the
logs, and no request can redirect the proxy to another upstream."""

from __future__ import annotations

import io
from typing import Any

import httpx
import pytest

from proxy.app import create_app
from proxy.config import Settings
from proxy.testing import (
    Fault,
    LoopbackServer,
    ScriptedUpstream,
    completion,
    tool_call,
)
from tests.proxy.builders import make_request
from tests.proxy.conftest import RunningUpstream

CLIENT_KEY = "sk-client-7f3a9c1e55"
ADMIN_KEY = "sk-admin-0d6b2e8f41"
UPSTREAM_KEY = "sk-upstream-a4c9e7120b"
SECRET_CONTENT = "my card number is 4111-1111-1111-1111"


def keyed_proxy(upstream: RunningUpstream, **overrides: Any) -> LoopbackServer:
    settings = Settings(
        upstreams=[
            {"name": "scripted", "base_url": upstream.base_url, "api_key_env": "UPSTREAM_KEY"}
        ],
        api_keys=[CLIENT_KEY],
        admin_key=ADMIN_KEY,
        repair="off",
        **overrides,
    )
    app = create_app(settings, environ={"UPSTREAM_KEY": UPSTREAM_KEY})
    return LoopbackServer(app).start()


def exercise(server: LoopbackServer, upstream: RunningUpstream) -> None:
    """Successes, an unrepaired call, an upstream failure, a wrong key and the admin routes."""
    upstream.script.push(
        completion("hello"),
        completion(tool_calls=[tool_call("refund_everything", {"note": SECRET_CONTENT})]),
        Fault(500, b"upstream exploded"),
    )
    client_auth = {"authorization": f"Bearer {CLIENT_KEY}", "x-session-id": "s-sec"}
    request = make_request(SECRET_CONTENT)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        assert http.post("/v1/chat/completions", json=request, headers=client_auth).is_success
        assert http.post("/v1/chat/completions", json=request, headers=client_auth).is_success
        assert (
            http.post("/v1/chat/completions", json=request, headers=client_auth).status_code == 500
        )
        wrong = {"authorization": f"Bearer {CLIENT_KEY}x"}
        assert http.post("/v1/chat/completions", json=request, headers=wrong).status_code == 401
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        # The admin key reads a client's session by its stored id, the key's name first.
        assert http.get("/v1/sessions/key-1:s-sec", headers=admin).is_success
        assert http.get("/v1/stats/unknown-tools", headers=admin).is_success


def test_keys_and_message_contents_never_reach_the_log(
    upstream: RunningUpstream, log: io.StringIO
) -> None:
    server = keyed_proxy(upstream)
    try:
        exercise(server, upstream)
    finally:
        server.stop()
    text = log.getvalue()
    # One line a request, the one refused with 401 included.
    assert text.count('"event":"request"') == 4
    for secret in (CLIENT_KEY, ADMIN_KEY, UPSTREAM_KEY, SECRET_CONTENT, "4111"):
        assert secret not in text
    # The upstream key was in play: the upstream got it, and never the client's.
    sent = upstream.script.request_headers[0]["authorization"]
    assert sent == f"Bearer {UPSTREAM_KEY}"


def test_log_bodies_shows_contents_but_still_no_keys(
    upstream: RunningUpstream, log: io.StringIO
) -> None:
    server = keyed_proxy(upstream, log_bodies=True)
    try:
        exercise(server, upstream)
    finally:
        server.stop()
    text = log.getvalue()
    assert SECRET_CONTENT in text
    for secret in (CLIENT_KEY, ADMIN_KEY, UPSTREAM_KEY):
        assert secret not in text


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/v1/sessions", {}, 401),
        ("/v1/sessions", {"authorization": f"Bearer {CLIENT_KEY}"}, 200),  # its own (issue 32)
        ("/v1/sessions", {"authorization": f"Bearer {ADMIN_KEY}"}, 200),
        ("/v1/sessions", {"authorization": f"Bearer {CLIENT_KEY}", "x-admin-key": ADMIN_KEY}, 200),
        ("/v1/sessions", {"x-admin-key": ADMIN_KEY[:-1]}, 401),
        ("/v1/sessions/anyone", {"authorization": f"Bearer {CLIENT_KEY}"}, 404),  # not its own
        ("/v1/stats/unknown-tools", {"authorization": f"Bearer {CLIENT_KEY}"}, 401),
        ("/v1/stats/unknown-tools", {"x-admin-key": ADMIN_KEY}, 200),
        ("/v1/stats/schema-fallbacks", {"authorization": f"Bearer {CLIENT_KEY}"}, 401),
        ("/v1/stats/schema-fallbacks", {"x-admin-key": ADMIN_KEY}, 200),
        ("/v1/models", {}, 401),
        ("/v1/models", {"authorization": f"Bearer {CLIENT_KEY}"}, 200),
    ],
)
def test_session_and_stats_routes_need_the_admin_key(
    upstream: RunningUpstream, path: str, headers: dict[str, str], status: int
) -> None:
    server = keyed_proxy(upstream)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            response = http.get(path, headers=headers)
    finally:
        server.stop()
    assert response.status_code == status, response.text
    if status == 401:
        assert response.json()["error"]["type"] == "authentication_error"


def test_a_session_route_delete_reaches_only_the_client_keys_own(upstream: RunningUpstream) -> None:
    server = keyed_proxy(upstream)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            client = {"authorization": f"Bearer {CLIENT_KEY}"}
            assert http.delete("/v1/sessions/s1", headers=client).status_code == 404
            assert http.delete("/v1/sessions/s1", headers={}).status_code == 401
    finally:
        server.stop()


def test_no_request_can_redirect_the_proxy_to_another_upstream(upstream: RunningUpstream) -> None:
    decoy = ScriptedUpstream()
    with LoopbackServer(decoy.app) as decoy_server:
        elsewhere = f"{decoy_server.url}/v1"
        host = decoy_server.url.removeprefix("http://")
        settings = Settings(upstreams=[{"name": "configured", "base_url": upstream.base_url}])
        with (
            LoopbackServer(create_app(settings)) as proxy,
            httpx.Client(base_url=proxy.url, timeout=10) as http,
        ):
            body = make_request() | {
                "base_url": elsewhere,
                "api_base": elsewhere,
                "url": elsewhere,
                "metadata": {"base_url": elsewhere},
            }
            tricks = {
                "host": host,
                "x-forwarded-host": host,
                "x-forwarded-for": "127.0.0.1",
                "x-upstream": elsewhere,
                "x-original-url": elsewhere,
            }
            assert http.post("/v1/chat/completions", json=body, headers=tricks).is_success
            for path in (
                f"/v1/{elsewhere}/models",
                f"/v1//{host}/v1/models",
                f"/@{host}/v1/models",
                f"/v1/..%2f..%2f{host}/models",
            ):
                http.get(path, headers=tricks)
            http.post("/v1/embeddings", json={"model": "x", "base_url": elsewhere}, headers=tricks)
    assert decoy.paths == []
    assert len(upstream.script.requests) == 1
    assert upstream.script.request_headers[0]["host"] != host
