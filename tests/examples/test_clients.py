"""The client snippets in examples/clients/ run a real tool-calling loop over HTTP.

They talk to a scripted OpenAI-compatible upstream on loopback: the first turn answers with a call
to `get_order_status`, any turn that carries a tool result answers with text quoting it. The
LangChain and Agents SDK snippets run only where those (optional) packages are installed.
"""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

CLIENTS = Path(__file__).resolve().parents[2] / "examples" / "clients"


@dataclass
class ScriptedUpstream:
    """What the scripted server was sent: request bodies and headers, in order."""

    base_url: str
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


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


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    """A scripted OpenAI-compatible server on a free loopback port."""
    record = ScriptedUpstream(base_url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            record.bodies.append(body)
            record.headers.append({k.lower(): v for k, v in self.headers.items()})
            if self.path.rstrip("/") != "/v1/chat/completions":
                self.send_error(404)
                return
            payload = json.dumps(scripted_reply(body)).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.send_header("x-toolsentry-errors", "0")
            self.send_header("x-toolsentry-max-errors", "10")
            self.send_header("x-toolsentry-repairs", "0")
            self.send_header("x-toolsentry-violations", "")
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    record.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield record
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def load_client(name: str) -> ModuleType:
    """Import examples/clients/<name>.py by path (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_client_{name}", CLIENTS / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_one_tool_round_trip(upstream: ScriptedUpstream, session: str) -> None:
    """Two requests: the tools declared, then the tool result sent back under the call's id."""
    assert len(upstream.bodies) == 2
    first, second = upstream.bodies
    declared = [tool["function"]["name"] for tool in first["tools"]]
    assert declared == ["get_order_status"]
    call = next(m for m in second["messages"] if m.get("tool_calls"))["tool_calls"][0]
    result = next(m for m in second["messages"] if m.get("role") == "tool")
    assert result["tool_call_id"] == call["id"]
    assert "delivered" in result["content"]
    assert all(headers.get("x-session-id") == session for headers in upstream.headers)


def test_openai_sdk_example_runs_the_tool_and_returns_the_final_answer(
    upstream: ScriptedUpstream,
) -> None:
    client = load_client("openai_sdk")
    lines: list[str] = []

    answer = client.run(
        upstream.base_url, model="scripted", session="s-openai", report=lines.append
    )

    assert answer == "Here is what I found: order #W0000001 is delivered"
    assert_one_tool_round_trip(upstream, "s-openai")
    assert len(lines) == 2
    assert "errors 0/10" in lines[0]


def test_openai_sdk_example_reports_an_unknown_tool_as_a_tau2_style_error() -> None:
    client = load_client("openai_sdk")

    assert client.execute("refund_everything", "{}") == "Error: Tool 'refund_everything' not found."
    assert client.execute("get_order_status", "{not json").startswith("Error: bad arguments")


def test_langchain_example_runs_the_tool_and_returns_the_final_answer(
    upstream: ScriptedUpstream,
) -> None:
    pytest.importorskip(
        "langchain_openai", reason="pip install langchain-openai to run the LangChain example"
    )
    client = load_client("langchain_agent")

    answer = client.run(upstream.base_url, model="scripted", session="s-langchain")

    assert answer == "Here is what I found: order #W0000001 is delivered"
    assert_one_tool_round_trip(upstream, "s-langchain")


def test_agents_sdk_example_runs_the_tool_and_returns_the_final_answer(
    upstream: ScriptedUpstream,
) -> None:
    pytest.importorskip("agents", reason="pip install openai-agents to run the Agents SDK example")
    client = load_client("agents_sdk")

    answer = client.run(upstream.base_url, model="scripted", session="s-agents")

    assert answer == "Here is what I found: order #W0000001 is delivered"
    assert_one_tool_round_trip(upstream, "s-agents")
