"""LangChain's `ChatOpenAI` pointed at toolsentry (pip install langchain-openai).

    python examples/clients/langchain_agent.py http://127.0.0.1:8000/v1 qwen2.5-7b-awq

`bind_tools` declares the tools; toolsentry checks every call against them before LangChain parses
it, so `invalid_tool_calls` stays empty unless a repair failed.
"""

from __future__ import annotations

import sys

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

ORDERS = {"#W0000001": "delivered", "#W0000002": "pending"}


@tool
def get_order_status(order_id: str) -> str:
    """Look up the status of an order by its id, e.g. #W0000001."""
    status = ORDERS.get(order_id)
    return (
        f"Error: order {order_id} not found" if status is None else f"order {order_id} is {status}"
    )


def run(
    base_url: str,
    model: str = "qwen2.5-7b-awq",
    session: str = "example-langchain",
    question: str = "Where is my order #W0000001?",
    max_turns: int = 4,
) -> str:
    """Ask `question`, run the tool calls the model makes, and return its final answer."""
    llm = ChatOpenAI(
        base_url=base_url,
        api_key="unused",
        model=model,
        temperature=0,
        default_headers={"x-session-id": session},
    ).bind_tools([get_order_status])
    messages: list[BaseMessage] = [
        SystemMessage("You are a retail support agent. Use the tools."),
        HumanMessage(question),
    ]
    for _ in range(max_turns):
        reply = llm.invoke(messages)
        assert isinstance(reply, AIMessage)
        messages.append(reply)
        if not reply.tool_calls and not reply.invalid_tool_calls:
            return str(reply.content)
        for call in reply.tool_calls:
            if call["name"] == get_order_status.name:
                result = str(get_order_status.invoke(call["args"]))
            else:
                result = f"Error: Tool '{call['name']}' not found."
            messages.append(ToolMessage(result, tool_call_id=call["id"]))
        for bad in reply.invalid_tool_calls:
            messages.append(
                ToolMessage(f"Error: {bad.get('error')}", tool_call_id=bad.get("id") or "")
            )
    raise RuntimeError(f"no final answer after {max_turns} turns")


if __name__ == "__main__":
    print(run(sys.argv[1], *sys.argv[2:3]))
