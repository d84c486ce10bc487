"""A turn leaves nothing of the proxy's own in a reference cycle: everything a request made is freed
by reference counting as the request ends. What only the cycle collector frees piles up between its
runs, and the proxy runs it rarely (gc threshold 50,000): each run then scans all of it at once, a
pause of tens of milliseconds on one request — the p99 of a busy proxy."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from proxy.testing import SSE, answer, call
from tests.proxy.builders import RETAIL_TOOLS, make_request
from tests.proxy.conftest import RunningProxy, RunningUpstream

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


@pytest.fixture
def collector_off() -> Iterator[None]:
    """The cycle collector off for the test (what a request leaves in cycles stays findable)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.enable()


def _proxy_objects_in_cycles() -> list[str]:
    """Names of the types, of the proxy's own modules, of objects only the collector would free."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    found = sorted(
        {type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("proxy.")}
    )
    gc.garbage.clear()
    gc.set_debug(0)
    return found


@pytest.mark.parametrize("api", sorted(BODIES))
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_turn_leaves_no_cycle_of_the_proxys_objects(
    api: str, stream: bool, proxy: RunningProxy, upstream: RunningUpstream, collector_off: None
) -> None:
    path, body = BODIES[api]
    # The first answer names a tool that does not exist: the turn re-asks, then validates again.
    wrong, right = answer(None, call("cancel_order", {"order_id": "#W1"})), answer(None, _ORDER)
    with httpx.Client(base_url=proxy.server.url, timeout=10) as http:
        for turn in range(1, 4):
            upstream.script.push(*((SSE.of(wrong), SSE.of(right)) if stream else (wrong, right)))
            sent = {**body, "stream": True} if stream else body
            response = http.post(path, json=sent, headers={"x-session-id": f"cycles-{api}"})
            assert response.status_code == 200, response.text
            assert len(upstream.script.requests) == 2 * turn  # asked, and asked again
    assert _proxy_objects_in_cycles() == []
