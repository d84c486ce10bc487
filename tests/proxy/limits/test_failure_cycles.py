"""An answer that fails leaves nothing in a reference cycle: not the proxy's objects, not the
bytes it had read. A failure's exception keeps its traceback, whose frames keep their locals (the
body read so far); stored where it points back at itself, it waits for the cycle collector, and
answers of 100 MB that broke off stayed in memory that way. The collector is off for the test, so
whatever only it would free is found."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from proxy.app import create_app
from proxy.config import Settings
from proxy.testing import LoopbackServer
from tests.proxy.cycles import collector_off, left_in_cycles
from tests.proxy.limits.hostile import MB, Hostile
from tests.proxy.limits.test_upstream_caps import BODIES, PATHS

BIG = 256 * 1024  # a piece of a body read before the failure: found if it is kept


@pytest.fixture
def hostile_proxy() -> Iterator[tuple[Hostile, str]]:
    script = Hostile()
    with LoopbackServer(script.app) as upstream:
        limits = {"max_response_bytes": MB, "max_stream_bytes": MB}
        upstreams = [{"name": "hostile", "base_url": f"{upstream.url}/v1", **limits}]
        app = create_app(Settings(upstreams=upstreams, retries=0), environ={})
        with LoopbackServer(app) as server:
            yield script, server.url


@pytest.mark.parametrize(
    ("mode", "stream"),
    [("breaks", False), ("big", False), ("breaks_stream", True), ("endless", True)],
    ids=["plain broken off", "plain over the cap", "stream broken off", "stream over the cap"],
)
@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_failed_answer_leaves_no_cycle(
    hostile_proxy: tuple[Hostile, str], api: str, mode: str, stream: bool
) -> None:
    script, url = hostile_proxy
    script.mode, script.size = mode, MB // 2 if mode.startswith("breaks") else 2 * MB
    body = {**BODIES[api], "stream": stream}
    headers = {"x-session-id": f"cycles-{api}", "anthropic-version": "2023-06-01"}
    with collector_off():
        with httpx.Client(base_url=url, timeout=30) as http:
            for _ in range(3):
                response = http.post(PATHS[api], json=body, headers=headers)
                assert response.status_code == (200 if stream else 502), response.text[:300]
        found = left_in_cycles(buffers_from=BIG)
    assert found == [], "\n".join(found)
