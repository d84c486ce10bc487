"""Real clients through the proxy in front of a scripted upstream, under the defaults chosen from
their sources (docs/clients.md): when a session's budget runs out, each shows the budget's message
in its own output and sends the refused request once; and the OpenAI Agents SDK, handed a call to
an undeclared tool that survives the re-asks, keeps running."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.testing import LoopbackServer, ScriptedUpstream, answer, call
from tests.clients import run_claude_print, run_codex_exec
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.metrics_text import metric

BUDGET_MESSAGE = "has used its error budget: 1 errors of 1 allowed"


def refused(proxy: RunningProxy, api: str, status: int, model: str = "scripted-model") -> float:
    """How many requests of protocol `api` for `model` the proxy answered with `status`."""
    labels = {"model": model, "api": api, "status": str(status)}
    return metric(proxy.metrics(), "toolsentry_requests_total", may_be_absent=True, **labels)


def agents_run(
    proxy: RunningProxy, model_class: str, session: str, tools: list[Any]
) -> Callable[[], Any]:
    """A run of an Agents SDK agent with `tools` through the proxy, by the SDK's own defaults
    (the openai client retries twice)."""
    agents = pytest.importorskip("agents", reason="pip install openai-agents (a dev dependency)")
    from openai import AsyncOpenAI

    async def run() -> Any:
        agents.set_tracing_disabled(True)
        client = AsyncOpenAI(
            base_url=proxy.base_url, api_key="unused", default_headers={"x-session-id": session}
        )
        agent = agents.Agent(name="support", instructions="Use the tools.", tools=tools)
        agent.model = getattr(agents, model_class)(model="scripted-model", openai_client=client)
        try:
            return await agents.Runner.run(agent, "Where is #W1?", max_turns=4)
        finally:
            await client.close()

    return lambda: asyncio.run(run())


def order_tool() -> Any:
    agents = pytest.importorskip("agents", reason="pip install openai-agents (a dev dependency)")

    @agents.function_tool
    def get_order_status(order_id: str) -> str:
        """Look up the status of an order by its id."""
        raise LookupError(f"order {order_id} not found")

    return get_order_status


@pytest.mark.parametrize(
    ("model_class", "api", "status"),
    [("OpenAIChatCompletionsModel", "chat", 429), ("OpenAIResponsesModel", "responses", 400)],
)
def test_an_agents_sdk_run_out_of_budget_raises_the_budget_message_once(
    make_proxy: Callable[..., RunningProxy],
    upstream: RunningUpstream,
    model_class: str,
    api: str,
    status: int,
) -> None:
    import openai

    proxy = make_proxy(max_errors=1)
    upstream.script.push(answer(None, call("get_order_status", {"order_id": "#W1"})))
    run = agents_run(proxy, model_class, f"agents-budget-{api}", [order_tool()])
    # The tool fails, the SDK reports it: one tool_error, the budget of one spent.
    with pytest.raises(openai.APIStatusError) as raised:
        run()
    assert raised.value.status_code == status
    assert BUDGET_MESSAGE in str(raised.value)
    assert len(upstream.script.requests) == 1
    assert refused(proxy, api, status) == 1  # not retried, though the client retries twice


@pytest.mark.parametrize("model_class", ["OpenAIChatCompletionsModel", "OpenAIResponsesModel"])
def test_an_agents_sdk_run_goes_on_when_an_undeclared_tool_survives_the_reasks(
    proxy: RunningProxy, upstream: RunningUpstream, model_class: str
) -> None:
    agents = pytest.importorskip("agents", reason="pip install openai-agents (a dev dependency)")

    @agents.function_tool
    def get_order_status(order_id: str) -> str:
        """Look up the status of an order by its id."""
        return f"order {order_id} is delivered"

    undeclared = answer(None, call("get_order_details", {"order_id": "#W1"}))
    upstream.script.push(undeclared, undeclared, undeclared)  # the call and both re-asks
    session = f"agents-undeclared-{model_class}"
    result = agents_run(proxy, model_class, session, [get_order_status])()
    # Passed through, the SDK would end the run: ModelBehaviorError: Tool ... not found.
    assert result.final_output == ""
    assert len(upstream.script.requests) == 3
    record = proxy.session(session)
    assert record["channels"] == {"unknown_tool": 1}
    assert record["errors"] == 1


def codex_upstream(body: dict[str, Any]) -> Any:
    """A model that calls `exec_command` without its required `cmd`: a schema violation the
    proxy passes through (repair off), which Codex reports back to the model."""
    return answer(None, call("exec_command", {"command": "ls"}))


def test_codex_out_of_budget_prints_the_budget_message_and_sends_the_refused_request_once(
    make_proxy: Callable[..., RunningProxy], tmp_path: Path
) -> None:
    script = ScriptedUpstream(handler=codex_upstream)
    with LoopbackServer(script.app) as server:
        proxy = make_proxy(
            upstreams=[{"name": "scripted", "base_url": f"{server.url}/v1"}],
            max_errors=1,
            repair="off",
        )
        done = run_codex_exec(proxy.base_url, tmp_path, "List the directory.")
    assert done.returncode == 1
    # Codex prints a 400's body (every error of its turn twice, one line each); of a 429 it
    # would print only `exceeded retry limit, last status: 429 Too Many Requests`.
    shown = [line for line in done.stderr.splitlines() if BUDGET_MESSAGE in line]
    assert shown
    assert all(line.startswith("ERROR: ") for line in shown)
    assert "Reconnecting" not in done.stderr
    assert len(script.requests) == 1
    assert refused(proxy, "responses", 400) == 1


def claude_upstream(body: dict[str, Any]) -> Any:
    """A model that calls `Bash` without its required `command` (a schema violation Claude Code
    reports back); a request without tools (Claude Code's own) gets a short text."""
    if not body.get("tools"):
        return answer("Listing")
    return answer(None, call("Bash", {"cmd": "ls"}))


def test_claude_code_out_of_budget_prints_the_budget_message_and_sends_the_refused_request_once(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, tmp_path: Path
) -> None:
    proxy = make_proxy(max_errors=1, repair="off")
    upstream.script.handler = claude_upstream
    done = run_claude_print(proxy.server.url, tmp_path, "List the directory.")
    assert done.returncode == 1
    # Claude Code retries a 400 (dropping a beta header each time) and a 429 that does not say
    # `x-should-retry: false`; this one says it.
    assert "API Error: Request rejected (429)" in done.stdout
    assert done.stdout.count(BUDGET_MESSAGE) == 1
    assert refused(proxy, "messages", 429, model="claude-sonnet-4-5") == 1
