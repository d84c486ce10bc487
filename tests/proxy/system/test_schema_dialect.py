"""Loose tool schemas through a real `toolsentry serve` (a child process on loopback) in front of a
scripted upstream: the request that issue 36 shows refused (`"type": "dict"`, `"amount": {"type":
"float"}`) is answered under the default dialect and its calls still checked, a schema that still
cannot compile is checked in part and says so (the counter, one log line per tool list, the
statistics), and `schema_dialect: strict` keeps the 400."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from proxy.headers import VIOLATIONS_HEADER
from proxy.testing import completion, tool_call
from tests.proxy.conftest import RunningUpstream
from tests.proxy.metrics_text import metric
from tests.proxy.system.support import ProxyProcess

WAIT = 60.0


def order_tools(**more_properties: Any) -> list[dict[str, Any]]:
    """The issue's tool list: a `dict` of parameters with a `float`, and `more_properties`."""
    properties = {"order_id": {"type": "string"}, "amount": {"type": "float"}, **more_properties}
    parameters = {"type": "dict", "properties": properties, "required": ["order_id"]}
    return [
        {"type": "function", "function": {"name": "get_order_details", "parameters": parameters}}
    ]


def issue_request(tools: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools}


def post(proxy: ProxyProcess, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=WAIT)


def logged_events(proxy: ProxyProcess, event: str) -> list[dict[str, Any]]:
    lines = [line for line in proxy.log_path.read_text().splitlines() if line.startswith("{")]
    return [e for e in map(json.loads, lines) if e.get("event") == event]


def test_the_issues_loose_schema_is_answered_and_its_calls_still_checked(
    upstream: RunningUpstream, tmp_path: Path
) -> None:
    valid = tool_call("get_order_details", {"order_id": "W1", "amount": 12})  # an int is a float
    missing = tool_call("get_order_details", {"amount": 12.5})
    upstream.script.push(completion(tool_calls=[valid]), completion(tool_calls=[missing]))
    upstream.script.push(completion(tool_calls=[valid]))
    proxy = ProxyProcess(upstream.base_url, tmp_path / "serve.log").wait_ready()
    try:
        answered = post(proxy, issue_request(order_tools()))
        reasked = post(proxy, issue_request(order_tools()))
        text = proxy.metrics()
    finally:
        proxy.stop()
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["message"]["tool_calls"] == [valid]
    assert answered.headers[VIOLATIONS_HEADER] == ""
    # The upstream got the tools as the client sent them, loose spellings and all.
    assert upstream.script.requests[0]["tools"] == order_tools()
    # A call without the required key is still a violation: re-asked, and answered repaired.
    assert reasked.status_code == 200, reasked.text
    assert reasked.headers[VIOLATIONS_HEADER] == "schema_violation"
    assert reasked.json()["choices"][0]["message"]["tool_calls"] == [valid]
    assert len(upstream.script.requests) == 3
    assert "toolsentry_schema_fallbacks_total{" not in text  # read whole: nothing fell back
    assert logged_events(proxy, "schema_fallback") == []


def test_a_schema_that_still_cannot_compile_is_checked_in_part_and_says_so(
    upstream: RunningUpstream, tmp_path: Path
) -> None:
    tools = order_tools(placed={"type": "datetime"})  # a spelling no table knows
    upstream.script.push(
        completion(tool_calls=[tool_call("get_order_details", {"order_id": "W1", "placed": 0})]),
        completion(tool_calls=[tool_call("get_order_details", {"amount": "12.5"})]),
        completion(tool_calls=[tool_call("get_order_details", {"order_id": "W1"})]),
    )
    proxy = ProxyProcess(upstream.base_url, tmp_path / "serve.log").wait_ready()
    try:
        first, second = post(proxy, issue_request(tools)), post(proxy, issue_request(tools))
        stats = httpx.get(f"{proxy.url}/v1/stats/schema-fallbacks", timeout=WAIT).json()
        text = proxy.metrics()
    finally:
        proxy.stop()
    assert first.status_code == second.status_code == 200, (first.text, second.text)
    assert first.headers[VIOLATIONS_HEADER] == ""  # the property no table knows is not judged
    # What still compiles is checked: the required key, and `amount` as the number it is.
    assert second.headers[VIOLATIONS_HEADER] == "schema_violation"
    assert metric(text, "toolsentry_schema_fallbacks_total", model="m", reason="unknown_type") == 2
    [logged] = logged_events(proxy, "schema_fallback")  # once for the tool list, not per request
    assert logged["tools"] == [
        {"tool": "get_order_details", "reason": "unknown_type", "detail": "unknown type 'datetime'"}
    ]
    assert stats["models"]["m"] == [
        {
            "tool": "get_order_details",
            "reason": "unknown_type",
            "detail": "unknown type 'datetime'",
            "requests": 2,
        }
    ]


def test_the_strict_dialect_still_refuses_the_loose_schema_with_400(
    upstream: RunningUpstream, tmp_path: Path
) -> None:
    proxy = ProxyProcess(
        upstream.base_url, tmp_path / "serve.log", "--schema-dialect", "strict"
    ).wait_ready()
    try:
        refused = post(proxy, issue_request(order_tools()))
    finally:
        proxy.stop()
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "tools"
    assert error["message"].startswith(
        "tools[0] ('get_order_details'): parameters is not a valid JSON Schema"
    )
    assert upstream.script.requests == []
