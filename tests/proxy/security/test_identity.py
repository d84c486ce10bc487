"""Sessions belong to the client key that used them (issue 32), against a real `toolsentry serve`
process with two client keys and an admin key in front of a scripted upstream on loopback.

Key A is configured by name (`team-a`), key B as a plain string (named `key-2` by its place).
Each test uses session ids of its own: the process is shared by the module.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.headers import ERRORS_HEADER, SESSION_HEADER
from proxy.testing import LoopbackServer, ScriptedUpstream, completion
from tests.proxy.builders import make_request
from tests.proxy.metrics_text import metric
from tests.proxy.system.support import REPO, ProxyProcess

KEY_A = "client-key-A"
KEY_B = "client-key-B"
ADMIN = "admin-key-Z"
A = {"authorization": f"Bearer {KEY_A}"}
B = {"authorization": f"Bearer {KEY_B}"}
ADMIN_HEADERS = {"authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[ScriptedUpstream, str]]:
    script = ScriptedUpstream()
    script.push(completion("ok"))
    with LoopbackServer(script.app) as server:
        yield script, f"{server.url}/v1"


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "toolsentry.yaml"
    path.write_text(text)
    return path


KEYS = f"""\
api_keys:
  - {{name: team-a, key: {KEY_A}}}
  - {KEY_B}
admin_key: {ADMIN}
repair: "off"
max_errors: 10
"""


@pytest.fixture(scope="module")
def proxy(
    upstream: tuple[ScriptedUpstream, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxyProcess]:
    where = tmp_path_factory.mktemp("identity")
    process = ProxyProcess(upstream[1], where / "proxy.log", "--config", str(config(where, KEYS)))
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def failing_turn(errors: int, *, first: int = 0) -> dict[str, Any]:
    """A chat request whose history reports `errors` failed tool calls (`Error: boom`)."""
    body = make_request()
    calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "cancel_order", "arguments": "{}"},
        }
        for i in range(first, first + errors)
    ]
    body["messages"] += [
        {"role": "assistant", "content": None, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": c["id"], "content": "Error: boom"} for c in calls),
    ]
    return body


def post(proxy: ProxyProcess, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{proxy.url}/v1/chat/completions", json=body, headers=headers, timeout=30)


def test_key_bs_tool_errors_on_victim_do_not_spend_key_as_victim(proxy: ProxyProcess) -> None:
    spent = post(proxy, failing_turn(12), {**B, "x-session-id": "victim"})
    assert spent.status_code == 429
    assert spent.headers[ERRORS_HEADER] == "12"
    mine = post(proxy, make_request(), {**A, "x-session-id": "victim"})
    assert mine.status_code == 200
    assert (mine.headers[SESSION_HEADER], mine.headers[ERRORS_HEADER]) == ("victim", "0")
    # And B's stays spent: its budget is its own too.
    assert post(proxy, make_request(), {**B, "x-session-id": "victim"}).status_code == 429


def test_response_headers_show_only_the_callers_own_counts(proxy: ProxyProcess) -> None:
    assert (
        post(proxy, failing_turn(3), {**B, "x-session-id": "shared"}).headers[ERRORS_HEADER] == "3"
    )
    assert (
        post(proxy, make_request(), {**A, "x-session-id": "shared"}).headers[ERRORS_HEADER] == "0"
    )
    assert (
        post(proxy, make_request(), {**B, "x-session-id": "shared"}).headers[ERRORS_HEADER] == "3"
    )


def test_sessions_found_by_history_are_scoped_to_the_key(proxy: ProxyProcess) -> None:
    opening = "A conversation without a session header."
    assert post(proxy, make_request(opening), B).status_code == 200
    # A's request continues B's opening word for word: it starts a session of A's own, and
    # leaves B's conversation where it was.
    mine = failing_turn(1)
    mine["messages"][1]["content"] = opening
    answered = post(proxy, mine, A)
    assert answered.status_code == 200
    assert answered.headers[ERRORS_HEADER] == "1"
    assert answered.headers[SESSION_HEADER].startswith("conv-")
    theirs = failing_turn(12)
    theirs["messages"][1]["content"] = opening
    spent = post(proxy, theirs, B)
    assert spent.status_code == 429
    assert spent.headers[SESSION_HEADER] != answered.headers[SESSION_HEADER]


def test_a_key_reads_lists_and_resets_only_its_own_sessions(proxy: ProxyProcess) -> None:
    post(proxy, failing_turn(12), {**B, "x-session-id": "api/victim"})
    post(proxy, make_request(), {**A, "x-session-id": "api/victim"})
    with httpx.Client(base_url=proxy.url, timeout=10) as http:
        own = http.get("/v1/sessions/api/victim", headers=A).json()
        assert (own["session"], own["errors"], own["requests"]) == ("api/victim", 0, 1)
        listed = {s["session"] for s in http.get("/v1/sessions", headers=A).json()["data"]}
        assert "api/victim" in listed
        assert not any(s.startswith(("key-2:", "team-a:")) for s in listed)
        # A's reset is A's: B's session stays spent until B resets it.
        assert http.delete("/v1/sessions/api/victim", headers=A).status_code == 200
        assert http.get("/v1/sessions/api/victim", headers=A).status_code == 404
        assert http.get("/v1/sessions/api/victim", headers=B).json()["errors"] == 12
        assert post(proxy, make_request(), {**B, "x-session-id": "api/victim"}).status_code == 429
        assert http.delete("/v1/sessions/api/victim", headers=B).status_code == 200
        assert post(proxy, make_request(), {**B, "x-session-id": "api/victim"}).status_code == 200
        # The admin key sees every key's sessions, by their stored ids.
        every = {
            s["session"] for s in http.get("/v1/sessions", headers=ADMIN_HEADERS).json()["data"]
        }
        assert {"team-a:victim", "key-2:victim"} <= every
        assert http.get("/v1/sessions/key-2:victim", headers=ADMIN_HEADERS).json()["errors"] == 12
        # No key, a wrong key: nothing.
        assert http.get("/v1/sessions", headers={}).status_code == 401
        assert (
            http.delete("/v1/sessions/victim", headers={"x-api-key": "client-key-C"}).status_code
            == 401
        )


def test_the_log_and_the_metrics_name_the_key_never_the_key_itself(proxy: ProxyProcess) -> None:
    post(proxy, make_request(), {**A, "x-session-id": "logged"})
    post(proxy, failing_turn(12), {**B, "x-session-id": "logged"})
    text = proxy.log_path.read_text()
    assert '"key":"team-a"' in text
    assert '"key":"key-2"' in text
    metrics = proxy.metrics()
    assert metric(metrics, "toolsentry_key_requests_total", key="team-a", status="200") >= 1
    assert metric(metrics, "toolsentry_key_requests_total", key="key-2", status="429") >= 1
    for secret in (KEY_A, KEY_B, ADMIN):
        assert secret not in text
        assert secret not in metrics


def test_the_admin_key_never_goes_upstream(
    proxy: ProxyProcess, upstream: tuple[ScriptedUpstream, str]
) -> None:
    script = upstream[0]
    seen = len(script.request_headers)
    assert post(proxy, make_request(), {**A, "x-admin-key": ADMIN}).status_code == 200
    sent = script.request_headers[seen:]
    assert sent
    assert all("x-admin-key" not in headers for headers in sent)


def test_public_endpoints_on_a_loopback_bind_by_default(proxy: ProxyProcess) -> None:
    with httpx.Client(base_url=proxy.url, timeout=10) as http:
        for path in ("/healthz", "/readyz", "/metrics"):
            assert http.get(path).status_code == 200, path
        assert http.get("/openapi.json").status_code == 401
        assert http.get("/openapi.json", headers=A).status_code == 401
        assert (
            http.get("/openapi.json", headers=ADMIN_HEADERS).json()["info"]["title"] == "toolsentry"
        )


def test_public_endpoints_can_close_metrics_and_readiness(
    upstream: tuple[ScriptedUpstream, str], tmp_path: Path
) -> None:
    path = config(tmp_path, KEYS + "public_endpoints: [/healthz]\n")
    process = ProxyProcess(upstream[1], tmp_path / "p.log", "--config", str(path)).wait_ready()
    try:
        with httpx.Client(base_url=process.url, timeout=10) as http:
            for closed in ("/readyz", "/metrics"):
                assert http.get(closed).status_code == 401, closed
                assert http.get(closed, headers=B).status_code == 401, closed
                assert http.get(closed, headers={"x-admin-key": ADMIN}).status_code == 200, closed
    finally:
        process.stop()


def test_readyz_asks_the_upstream_at_most_once_a_second(
    proxy: ProxyProcess, upstream: tuple[ScriptedUpstream, str]
) -> None:
    script = upstream[0]
    before = script.paths.count("/v1/models")
    started = time.monotonic()
    with httpx.Client(base_url=proxy.url, timeout=10) as http:
        for _ in range(30):
            assert http.get("/readyz").status_code == 200
    elapsed = time.monotonic() - started
    probes = script.paths.count("/v1/models") - before
    assert probes <= int(elapsed) + 2  # one per second at most, whatever the pace
    # It does ask: the answer is the upstream's (the probe that warmed the cache may be the one
    # the fixture's own wait for readiness made, when the thirty fit in its second).
    assert script.paths.count("/v1/models") >= 1


def test_binding_beyond_loopback_without_an_admin_key_is_refused(
    upstream: tuple[ScriptedUpstream, str],
) -> None:
    command = [sys.executable, "-m", "proxy.cli", "serve", "--upstream", upstream[1]]
    done = subprocess.run(
        [*command, "--host", "0.0.0.0", "--port", "0"],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "500"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "TOOLSENTRY_ADMIN_KEY" in lines[0]
    assert "--insecure-admin" in lines[0]


def test_insecure_admin_starts_warns_and_keeps_the_session_list_and_reset_closed(
    upstream: tuple[ScriptedUpstream, str], tmp_path: Path
) -> None:
    process = ProxyProcess(
        upstream[1],
        tmp_path / "p.log",
        "--host",
        "0.0.0.0",
        "--insecure-admin",
    ).wait_ready()
    try:
        post(process, make_request(), {"x-session-id": "open"})
        with httpx.Client(base_url=process.url, timeout=10) as http:
            assert http.get("/v1/sessions").status_code == 403
            assert http.delete("/v1/sessions/open").status_code == 403
            assert http.get("/v1/sessions/open").json()["requests"] == 1
            assert http.get("/metrics").status_code == 403
            assert http.get("/healthz").status_code == 200
    finally:
        process.stop()
    assert '"event":"insecure_admin"' in process.log_path.read_text()
