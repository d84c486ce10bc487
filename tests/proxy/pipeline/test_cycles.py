"""A turn leaves nothing of the proxy's own in a reference cycle: everything a request made is freed
by reference counting as the request ends. What only the cycle collector frees piles up between its
runs, and the proxy runs it rarely (gc threshold 50,000): each run then scans all of it at once, a
pause of tens of milliseconds on one request — the p99 of a busy proxy."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from proxy.testing import SSE, answer, call
from tests.proxy.builders import RETAIL_TOOLS, make_request
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.cycles import collector_off, left_in_cycles

_ORDER = call("get_order_details", {"order_id": "#W1"})
_CHAT_TOOLS = RETAIL_TOOLS
_FLAT_TOOLS = [
    {"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
    for t in RETAIL_TOOLS
]
_ANTHROPIC_TOOLS = [
    {"name": t["function"]["name"], "input_schema": t["function"]["parameters"]}
    for t in RETAIL_TOOLS
]
BODIES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", make_request()),
    "responses": (
        "/v1/responses",
        {"model": "scripted-model", "input": "Where is order #W1?", "tools": _FLAT_TOOLS},
    ),
    "messages": (
        "/v1/messages",
        {
            "model": "scripted-model",
            "max_tokens": 256,
            "messages": [{"role": "user", "content": "Where is order #W1?"}],
            "tools": _ANTHROPIC_TOOLS,
        },
    ),
}


@pytest.mark.parametrize("api", sorted(BODIES))
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_turn_leaves_no_cycle_of_the_proxys_objects(
    api: str, stream: bool, proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    path, body = BODIES[api]
    # The first answer names a tool that does not exist: the turn re-asks, then validates again.
    wrong, right = answer(None, call("cancel_order", {"order_id": "#W1"})), answer(None, _ORDER)
    with collector_off():
        with httpx.Client(base_url=proxy.server.url, timeout=10) as http:
            for turn in range(1, 4):
                upstream.script.push(
                    *((SSE.of(wrong), SSE.of(right)) if stream else (wrong, right))
                )
                sent = {**body, "stream": True} if stream else body
                response = http.post(path, json=sent, headers={"x-session-id": f"cycles-{api}"})
                assert response.status_code == 200, response.text
                assert len(upstream.script.requests) == 2 * turn  # asked, and asked again
        assert left_in_cycles() == []
