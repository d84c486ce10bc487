"""Real clients whose tools fail, through the proxy in front of a scripted upstream: the session's
`tool_error` count equals the failures the client itself reported, once each, in the form each
client sends (proxy/guard/tool_errors.py, docs/tool-errors.md)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.testing import LoopbackServer, ScriptedUpstream, answer, call
from tests.clients import run_codex_exec
from tests.proxy.conftest import RunningProxy, RunningUpstream

ORDERS = {"#W1": "delivered"}


@pytest.mark.parametrize("model_class", ["OpenAIChatCompletionsModel", "OpenAIResponsesModel"])
def test_each_failed_tool_of_an_agents_sdk_run_is_one_tool_error(
    proxy: RunningProxy, upstream: RunningUpstream, model_class: str
) -> None:
    agents = pytest.importorskip("agents", reason="pip install openai-agents (a dev dependency)")
    from agents.tool import default_tool_error_function, default_tool_timeout_error_message
    from openai import AsyncOpenAI

    @agents.function_tool
    def get_order_status(order_id: str) -> str:
        """Look up the status of an order by its id."""
        if order_id not in ORDERS:
            raise LookupError(f"order {order_id} not found")
        return f"order {order_id} is {ORDERS[order_id]}"

    @agents.function_tool(timeout=0.05)
    async def cancel_order(order_id: str) -> str:
        """Cancel an order by its id."""
        await asyncio.Event().wait()  # never answers: the SDK's own timeout ends the call
        return f"order {order_id} is cancelled"

    upstream.script.push(
        answer(None, call("get_order_status", {"order_id": "#W1"})),  # runs
        answer(None, call("get_order_status", {"order_id": "#W2"})),  # raises
        answer(None, call("cancel_order", {"order_id": "#W1"})),  # times out
        answer("I could not cancel it."),
    )
    session = f"agents-failures-{model_class}"

    async def run() -> Any:
        agents.set_tracing_disabled(True)
        client = AsyncOpenAI(
            base_url=proxy.base_url,
            api_key="unused",
            max_retries=0,
            default_headers={"x-session-id": session},
        )
        model = getattr(agents, model_class)(model="scripted-model", openai_client=client)
        agent = agents.Agent(
            name="support", instructions="Use the tools.", tools=[get_order_status, cancel_order]
        )
        agent.model = model
        try:
            return await agents.Runner.run(agent, "Cancel #W1 if #W2 is lost.", max_turns=6)
        finally:
            await client.close()

    result = asyncio.run(run())
    assert result.final_output == "I could not cancel it."
    outputs = [item.output for item in result.new_items if item.type == "tool_call_output_item"]
    # What the SDK reported to the model for each call, in its own default words.
    failed = default_tool_error_function(None, LookupError())  # type: ignore[arg-type]
    timed_out = default_tool_timeout_error_message(tool_name="cancel_order", timeout_seconds=0.05)
    assert outputs == ["order #W1 is delivered", failed, timed_out]
    record = proxy.session(session)
    assert record["channels"] == {"tool_error": 2}
    assert record["errors"] == 2


def three_lookups(proxy: RunningProxy, upstream: RunningUpstream, session: str, tool: Any) -> Any:
    """A langchain-openai chat model bound to `tool`, talking to the proxy in `session`, whose
    upstream asks for the status of #W1, #W2 and #W3 in turn, then answers in text."""
    from langchain_openai import ChatOpenAI

    upstream.script.push(
        *(answer(None, call("get_order_status", {"order_id": f"#W{n}"})) for n in (1, 2, 3)),
        answer("Two of them are lost."),
    )
    return ChatOpenAI(
        base_url=proxy.base_url,
        api_key="unused",  # type: ignore[arg-type]
        model="scripted-model",
        max_retries=0,
        default_headers={"x-session-id": session},
    ).bind_tools([tool])


def test_each_failed_tool_of_a_langchain_loop_is_one_tool_error(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    pytest.importorskip("langchain_openai", reason="pip install langchain-openai")
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
    from langchain_core.tools import ToolException, tool

    @tool
    def get_order_status(order_id: str) -> str:
        """Look up the status of an order by its id."""
        if order_id == "#W2":
            raise ToolException(f"Error: order {order_id} not found")  # τ²-bench's convention
        if order_id == "#W3":
            raise ToolException()  # LangChain's own words: "Tool execution error"
        return f"order {order_id} is {ORDERS[order_id]}"

    get_order_status.handle_tool_error = True
    llm = three_lookups(proxy, upstream, "langchain-failures", get_order_status)
    messages: list[BaseMessage] = [HumanMessage("Where are #W1, #W2 and #W3?")]
    results: list[ToolMessage] = []
    for _ in range(4):
        reply = llm.invoke(messages)
        assert isinstance(reply, AIMessage)
        messages.append(reply)
        for tool_call in reply.tool_calls:
            result = get_order_status.invoke(tool_call)
            assert isinstance(result, ToolMessage)
            results.append(result)
            messages.append(result)
    assert messages[-1].content == "Two of them are lost."
    # LangChain marks a failure with status="error" on its ToolMessage, which stays on the client.
    reported = [r.content for r in results if r.status == "error"]
    assert reported == ["Error: order #W2 not found", "Tool execution error"]
    record = proxy.session("langchain-failures")
    assert record["channels"] == {"tool_error": len(reported)}


def test_each_failed_tool_of_a_langgraph_tool_node_is_one_tool_error(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    pytest.importorskip("langgraph", reason="pip install langgraph (a dev dependency)")
    # τ²-bench's "Error" prefix off: LangGraph's own form alone is read.
    proxy = make_proxy(tool_error_prefix="")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    @tool
    def get_order_status(order_id: str) -> str:
        """Look up the status of an order by its id."""
        if order_id not in ORDERS:
            raise LookupError(f"order {order_id} not found")
        return f"order {order_id} is {ORDERS[order_id]}"

    llm = three_lookups(proxy, upstream, "langgraph-failures", get_order_status)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    # ToolNode's default re-raises a tool's exception and ends the run (only an invocation
    # error is reported); handle_tool_errors=True reports every failure to the model.
    graph.add_node("tools", ToolNode([get_order_status], handle_tool_errors=True))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    graph.add_edge("tools", "agent")
    final = graph.compile().invoke({"messages": [HumanMessage("Where are #W1, #W2, #W3?")]})
    assert final["messages"][-1].content == "Two of them are lost."
    # ToolNode reports a failure in the ToolMessage's text and its status="error".
    results = [m for m in final["messages"] if isinstance(m, ToolMessage)]
    reported = [r for r in results if r.status == "error"]
    assert len(results) == 3
    assert len(reported) == 2
    assert all(str(r.content).startswith("Error: LookupError(") for r in reported)
    record = proxy.session("langgraph-failures")
    assert record["channels"] == {"tool_error": len(reported)}


CODEX_EXIT = re.compile(r"^(?:Process exited with code|Exit code:) (-?\d+)$", re.MULTILINE)


def codex_failing_upstream(body: dict[str, Any]) -> Any:
    """The scripted model Codex talks to: it runs a command that fails, then answers in text."""
    outputs = [
        item for item in body.get("input") or [] if item.get("type") == "function_call_output"
    ]
    if outputs:
        return answer("The directory does not exist.")
    return answer(None, call("exec_command", {"cmd": "ls /nonexistent-toolsentry"}))


def test_a_failed_codex_command_is_one_tool_error(
    make_proxy: Callable[..., RunningProxy], tmp_path: Path
) -> None:
    script = ScriptedUpstream(handler=codex_failing_upstream)
    with LoopbackServer(script.app) as server:
        proxy = make_proxy(upstreams=[{"name": "scripted", "base_url": f"{server.url}/v1"}])
        done = run_codex_exec(proxy.base_url, tmp_path, "List /nonexistent-toolsentry.")
        assert done.returncode == 0, done.stderr[-2000:]
        last = script.requests[-1]["input"]
        outputs = [i["output"] for i in last if i.get("type") == "function_call_output"]
        texts = [o if isinstance(o, str) else json.dumps(o) for o in outputs]
        # What Codex told the model: the command's exit code, in its own header.
        exits = [int(m[1]) for t in texts if (m := CODEX_EXIT.search(t))]
        assert len(exits) == 1
        assert exits[0] != 0
        session = proxy.session(script.request_headers[0]["session-id"])
        assert session["channels"] == {"tool_error": 1}
        assert session["errors"] == 1
