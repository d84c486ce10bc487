"""The client snippets in examples/clients/ run a real tool-calling loop through the real proxy.

The proxy runs on loopback in front of the scripted upstream (proxy.testing): the first turn
answers with a call to `get_order_status`, any turn that carries a tool result answers with text
quoting it. The `x-toolsentry-*` headers the snippets read are the proxy's own. The LangChain and
Agents SDK snippets run only where those (optional, dev) packages are installed.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from proxy.app import create_app
from proxy.config import Settings
from proxy.testing import LoopbackServer, ScriptedUpstream, completion, tool_call

CLIENTS = Path(__file__).resolve().parents[2] / "examples" / "clients"


@dataclass
class ProxiedUpstream:
    """The proxy's URL, for the snippet, and what the scripted upstream behind it was sent."""

    base_url: str
    script: ScriptedUpstream

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return self.script.requests

    def session(self, session_id: str) -> dict[str, Any]:
        """The proxy's record of one session (GET /v1/sessions/{id})."""
        reply = httpx.get(f"{self.base_url}/sessions/{session_id}", timeout=10)
        reply.raise_for_status()
        data: dict[str, Any] = reply.json()
        return data


def scripted_reply(body: dict[str, Any]) -> dict[str, Any]:
    """A tool call on the first turn, a text answer quoting the tool result afterwards."""
    tool_results = [m for m in body["messages"] if m.get("role") == "tool"]
    if tool_results:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": f"Here is what I found: {tool_results[-1]['content']}",
        }
        finish = "stop"
    else:
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{len(body['messages'])}",
                    "type": "function",
                    "function": {
                        "name": "get_order_status",
                        "arguments": json.dumps({"order_id": "#W0000001"}),
                    },
                }
            ],
        }
        finish = "tool_calls"
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "scripted"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def proxied(handler: Callable[[dict[str, Any]], dict[str, Any]]) -> Iterator[ProxiedUpstream]:
    script = ScriptedUpstream(handler=handler)
    with LoopbackServer(script.app) as upstream:
        settings = Settings(upstreams=[{"name": "scripted", "base_url": f"{upstream.url}/v1"}])
        with LoopbackServer(create_app(settings, environ={})) as proxy:
            yield ProxiedUpstream(f"{proxy.url}/v1", script)


@pytest.fixture
def upstream() -> Iterator[ProxiedUpstream]:
    """The proxy on a loopback port, in front of the scripted upstream."""
    yield from proxied(scripted_reply)


@pytest.fixture
def hallucinating_upstream() -> Iterator[ProxiedUpstream]:
    """As `upstream`, but the model's first call names a tool nobody declared."""

    calls = iter(
        [
            tool_call("check_order", {"order_id": "#W0000001"}),  # the snippet's first turn
            tool_call("get_order_status", {"order_id": "#W0000001"}),  # the proxy's re-ask
        ]
    )

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        call = next(calls, None)
        return scripted_reply(body) if call is None else completion(tool_calls=[call])

    yield from proxied(reply)


def load_client(name: str) -> ModuleType:
    """Import examples/clients/<name>.py by path (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_client_{name}", CLIENTS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_one_tool_round_trip(upstream: ProxiedUpstream, session: str) -> None:
    """Two requests: the tools declared, then the tool result sent back under the call's id."""
    assert len(upstream.bodies) == 2
    first, second = upstream.bodies
    declared = [tool["function"]["name"] for tool in first["tools"]]
    assert declared == ["get_order_status"]
    call = next(m for m in second["messages"] if m.get("tool_calls"))["tool_calls"][0]
    result = next(m for m in second["messages"] if m.get("role") == "tool")
    assert result["tool_call_id"] == call["id"]
    assert "delivered" in result["content"]
    record = upstream.session(session)
    assert record["errors"] == 0, record


def test_openai_sdk_example_runs_the_tool_and_returns_the_final_answer(
    upstream: ProxiedUpstream,
) -> None:
    client = load_client("openai_sdk")
    lines: list[str] = []

    answer = client.run(
        upstream.base_url, model="scripted", session="s-openai", report=lines.append
    )

    assert answer == "Here is what I found: order #W0000001 is delivered"
    assert_one_tool_round_trip(upstream, "s-openai")
    assert lines == [
        "session s-openai: errors 0/10, repairs 0, violations []",
        "session s-openai: errors 0/10, repairs 0, violations []",
    ]


def test_openai_sdk_example_reports_the_proxys_repair_of_an_unknown_tool(
    hallucinating_upstream: ProxiedUpstream,
) -> None:
    client = load_client("openai_sdk")
    lines: list[str] = []

    answer = client.run(
        hallucinating_upstream.base_url, model="scripted", session="s-repair", report=lines.append
    )

    assert answer == "Here is what I found: order #W0000001 is delivered"
    assert lines[0] == "session s-repair: errors 0/10, repairs 1, violations [unknown_tool]"
    # The upstream was asked again; the snippet only ever saw the repaired call.
    assert len(hallucinating_upstream.bodies) == 3


def test_openai_sdk_example_reports_an_unknown_tool_as_a_tau2_style_error() -> None:
    client = load_client("openai_sdk")

    assert client.execute("refund_everything", "{}") == "Error: Tool 'refund_everything' not found."
    assert client.execute("get_order_status", "{not json").startswith("Error: bad arguments")


def test_langchain_example_runs_the_tool_and_returns_the_final_answer(
    upstream: ProxiedUpstream,
) -> None:
    pytest.importorskip(
        "langchain_openai", reason="pip install langchain-openai to run the LangChain example"
    )
    client = load_client("langchain_agent")

    answer = client.run(upstream.base_url, model="scripted", session="s-langchain")

    assert answer == "Here is what I found: order #W0000001 is delivered"
    assert_one_tool_round_trip(upstream, "s-langchain")


def test_agents_sdk_example_runs_the_tool_and_returns_the_final_answer(
    upstream: ProxiedUpstream,
) -> None:
    pytest.importorskip("agents", reason="pip install openai-agents to run the Agents SDK example")
    client = load_client("agents_sdk")

    answer = client.run(upstream.base_url, model="scripted", session="s-agents")

    assert answer == "Here is what I found: order #W0000001 is delivered"
    assert_one_tool_round_trip(upstream, "s-agents")
