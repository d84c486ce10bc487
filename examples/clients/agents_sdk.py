"""The OpenAI Agents SDK pointed at toolsentry (pip install openai-agents).

    python examples/clients/agents_sdk.py http://127.0.0.1:8000/v1 qwen2.5-7b-awq [responses]

The agent uses `OpenAIChatCompletionsModel` over an `AsyncOpenAI` client whose `base_url` is the
proxy, or with `api="responses"` the SDK's default `OpenAIResponsesModel` (vLLM and the proxy serve
`/v1/responses` too). Tracing is off: it would send traces to OpenAI.
"""

from __future__ import annotations

import asyncio
import sys

from agents import (
    Agent,
    Model,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

ORDERS = {"#W0000001": "delivered", "#W0000002": "pending"}


@function_tool
def get_order_status(order_id: str) -> str:
    """Look up the status of an order by its id, e.g. #W0000001."""
    status = ORDERS.get(order_id)
    return (
        f"Error: order {order_id} not found" if status is None else f"order {order_id} is {status}"
    )


async def run_async(
    base_url: str,
    model: str = "qwen2.5-7b-awq",
    session: str = "example-agents-sdk",
    question: str = "Where is my order #W0000001?",
    max_turns: int = 4,
    api: str = "chat",
) -> str:
    """Run the agent on `question` and return its final answer (`api`: chat or responses)."""
    set_tracing_disabled(True)
    async with AsyncOpenAI(
        base_url=base_url, api_key="unused", default_headers={"x-session-id": session}
    ) as client:
        chosen: Model = (
            OpenAIResponsesModel(model=model, openai_client=client)
            if api == "responses"
            else OpenAIChatCompletionsModel(model=model, openai_client=client)
        )
        agent = Agent(
            name="retail support",
            instructions="You are a retail support agent. Use the tools.",
            tools=[get_order_status],
            model=chosen,
        )
        result = await Runner.run(agent, question, max_turns=max_turns)
        return str(result.final_output)


def run(
    base_url: str,
    model: str = "qwen2.5-7b-awq",
    session: str = "example-agents-sdk",
    question: str = "Where is my order #W0000001?",
    max_turns: int = 4,
    api: str = "chat",
) -> str:
    """Run the agent on `question` and return its final answer (synchronous `run_async`)."""
    return asyncio.run(run_async(base_url, model, session, question, max_turns, api))


if __name__ == "__main__":
    print(run(sys.argv[1], *sys.argv[2:3], api=sys.argv[3] if len(sys.argv) > 3 else "chat"))
