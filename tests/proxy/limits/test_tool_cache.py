"""Tool lists cost a bounded amount: the compiled lists kept are bounded by the bytes of their
JSON (`tool_cache_bytes`), not by their number whatever their size, and a list over
`max_tools_bytes` is refused with 413 in the protocol's own error shape before it is compiled."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from proxy.app import create_app
from proxy.config import Settings
from proxy.guard import toolcheck
from proxy.testing import LoopbackServer
from tests.proxy.limits.hostile import Hostile

KB = 1024


def big_tools(tag: str, size: int) -> list[dict[str, Any]]:
    """A tool list whose JSON is about `size` bytes (one long description), distinct per `tag`."""
    parameters = {"type": "object", "properties": {"q": {"type": "string"}}}
    function = {"name": "search", "description": tag + "d" * size, "parameters": parameters}
    return [{"type": "function", "function": function}]


def test_the_compiled_lists_kept_are_bounded_by_their_bytes() -> None:
    toolcheck.clear_cache()
    toolcheck.configure_cache(1024 * KB)
    try:
        for n in range(20):
            toolcheck.compile_tools(big_tools(f"list {n} ", 200 * KB))
        assert toolcheck.cached_tool_lists() <= 5  # 20 of 200 KB in a 1 MB budget
        assert toolcheck.cached_tool_bytes() <= 1024 * KB
    finally:
        toolcheck.configure_cache(toolcheck.CACHE_BYTES)
        toolcheck.clear_cache()


@pytest.fixture
def proxy() -> Iterator[str]:
    script = Hostile(mode="small_gzip")
    with LoopbackServer(script.app) as upstream:
        upstreams = [{"name": "hostile", "base_url": f"{upstream.url}/v1"}]
        settings = Settings(upstreams=upstreams, max_tools_bytes=64 * KB)
        with LoopbackServer(create_app(settings, environ={})) as server:
            yield server.url


def anthropic_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in tools
    ]


def responses_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "function", **t["function"]} for t in tools]


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_tool_list_over_the_limit_is_refused_with_413_in_the_protocols_shape(
    proxy: str, api: str
) -> None:
    tools = big_tools("too big ", 100 * KB)
    message = [{"role": "user", "content": "hi"}]
    path, body = {
        "chat": ("/v1/chat/completions", {"messages": message, "tools": tools}),
        "responses": ("/v1/responses", {"input": "hi", "tools": responses_tools(tools)}),
        "messages": (
            "/v1/messages",
            {"messages": message, "max_tokens": 8, "tools": anthropic_tools(tools)},
        ),
    }[api]
    response = httpx.post(
        f"{proxy}{path}",
        content=orjson.dumps({"model": "hostile", **body}),
        headers={"content-type": "application/json", "anthropic-version": "2023-06-01"},
        timeout=30,
    )
    assert response.status_code == 413, response.text[:300]
    error = response.json()
    if api == "messages":
        assert error["type"] == "error"
    assert "max_tools_bytes=65536" in error["error"]["message"]
