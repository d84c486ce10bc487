"""Real Responses clients through the proxy: the OpenAI Agents SDK's default model class
(`OpenAIResponsesModel`) and the Codex CLI, each in front of a scripted Responses upstream."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.testing import LoopbackServer, ScriptedUpstream, answer, call
from tests.clients import run_codex_exec
from tests.proxy.conftest import RunningProxy, RunningUpstream


def test_an_agents_sdk_run_executes_the_tool_once_with_the_right_arguments(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    agents = pytest.importorskip("agents", reason="pip install openai-agents (a dev dependency)")
    from openai import AsyncOpenAI

    executed: list[str] = []

    @agents.function_tool
    def get_order_status(order_id: str) -> str:
        """Look up the status of an order by its id."""
        executed.append(order_id)
        return f"order {order_id} is delivered"

    upstream.script.push(
        answer(None, call("get_order_state", {"order_id": "#W1"})),  # hallucinated
        answer(None, call("get_order_status", {"order_id": "#W1"})),  # the re-ask
        answer("Your order #W1 is delivered."),
    )

    async def run() -> Any:
        agents.set_tracing_disabled(True)
        client = AsyncOpenAI(
            base_url=proxy.base_url,
            api_key="unused",
            max_retries=0,
            default_headers={"x-session-id": "agents-responses"},
        )
        agent = agents.Agent(
            name="support",
            instructions="Use the tools.",
            tools=[get_order_status],
            model=agents.OpenAIResponsesModel(model="scripted-model", openai_client=client),
        )
        try:
            return await agents.Runner.run(agent, "Where is #W1?", max_turns=4)
        finally:
            await client.close()

    result = asyncio.run(run())
    assert result.final_output == "Your order #W1 is delivered."
    assert executed == ["#W1"]
    assert [api.value for api in upstream.script.apis] == ["responses"] * 3
    session = proxy.session("agents-responses")
    assert session["channels"] == {"unknown_tool": 1}
    assert (session["errors"], session["repairs"]) == (0, 1)
    outputs = [
        item
        for item in upstream.script.requests[2]["input"]
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    assert [o["output"] for o in outputs] == ["order #W1 is delivered"]


def test_the_agents_sdk_example_runs_on_the_responses_api_through_the_proxy(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    pytest.importorskip("agents", reason="pip install openai-agents (a dev dependency)")
    path = Path(__file__).parents[3] / "examples" / "clients" / "agents_sdk.py"
    spec = importlib.util.spec_from_file_location("example_agents_sdk", path)
    assert spec is not None
    assert spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    upstream.script.push(
        answer(None, call("get_order_status", {"order_id": "#W0000001"})),
        answer("Here is what I found: order #W0000001 is delivered"),
    )
    final = example.run(proxy.base_url, model="scripted-model", session="ex-resp", api="responses")
    assert final == "Here is what I found: order #W0000001 is delivered"
    assert [api.value for api in upstream.script.apis] == ["responses", "responses"]
    assert proxy.session("ex-resp")["requests"] == 2


MARKER = "toolsentry-codex-ran-this"


def codex_upstream(body: dict[str, Any]) -> Any:
    """The scripted Responses model Codex talks to through the proxy: it first calls a tool that
    does not exist; told so (the proxy's re-ask), it calls `exec_command` with a harmless command;
    given the command's output, it answers in text."""
    outputs = [
        item.get("output")
        for item in body.get("input") or []
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    texts = [o if isinstance(o, str) else json.dumps(o) for o in outputs]
    if any(MARKER in text and "does not exist" not in text for text in texts):
        return answer("The command printed the marker; done.")
    if any("does not exist" in text for text in texts):
        return answer(None, call("exec_command", {"cmd": f"echo {MARKER}"}))
    return answer(None, call("run_shell_command", {"command": f"echo {MARKER}"}))


def test_codex_cli_runs_the_repaired_command_through_the_proxy(
    make_proxy: Callable[..., RunningProxy], tmp_path: Path
) -> None:
    script = ScriptedUpstream(handler=codex_upstream)
    with LoopbackServer(script.app) as server:
        proxy = make_proxy(upstreams=[{"name": "scripted", "base_url": f"{server.url}/v1"}])
        done = run_codex_exec(proxy.base_url, tmp_path, "Print the marker with a shell command.")
        assert done.returncode == 0, done.stderr[-2000:]
        turns = [
            r
            for r, api in zip(script.requests, script.apis, strict=True)
            if api.value == "responses"
        ]
        # The command ran: its output came back to the model as the tool's result.
        last = turns[-1]["input"]
        results = [
            i for i in last if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]
        assert any(MARKER in json.dumps(r["output"]) for r in results)
        calls = [i for i in last if isinstance(i, dict) and i.get("type") == "function_call"]
        assert [c["name"] for c in calls] == ["exec_command"]  # Codex never saw the bad call
        session_id = script.request_headers[0]["session-id"]
        session = proxy.session(session_id)
        assert session["channels"] == {"unknown_tool": 1}
        assert (session["repairs"], session["errors"]) == (1, 0)
        assert "upstream_error" not in session["channels"]
