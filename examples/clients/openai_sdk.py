"""The openai SDK pointed at toolsentry: a tool-calling loop that reads the proxy's headers.

    python examples/clients/openai_sdk.py http://127.0.0.1:8000/v1 qwen2.5-7b-awq

Nothing changes in the agent but `base_url`. The `x-session-id` header ties the turns of one
conversation to one error budget; the `x-toolsentry-*` response headers say what the proxy saw.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from openai import OpenAI

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_order_status",
            "description": "Look up the status of an order by its id.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string", "description": "e.g. #W0000001"}},
                "required": ["order_id"],
                "additionalProperties": False,
            },
        },
    }
]

ORDERS = {"#W0000001": "delivered", "#W0000002": "pending"}


def get_order_status(order_id: str) -> str:
    """The tool itself: a dictionary lookup standing in for the shop's database."""
    status = ORDERS.get(order_id)
    return (
        f"Error: order {order_id} not found" if status is None else f"order {order_id} is {status}"
    )


def execute(name: str, arguments: str) -> str:
    """Run one tool call; failures come back as `Error: ...` text, as τ²-bench reports them."""
    if name != "get_order_status":
        return f"Error: Tool '{name}' not found."
    try:
        args = json.loads(arguments)
        return get_order_status(**args)
    except (json.JSONDecodeError, TypeError) as exc:
        return f"Error: bad arguments for {name}: {exc}"


def run(
    base_url: str,
    model: str = "qwen2.5-7b-awq",
    session: str = "example-openai-sdk",
    question: str = "Where is my order #W0000001?",
    max_turns: int = 4,
    report: Callable[[str], None] = print,
) -> str:
    """Ask `question`, run the tool calls the model makes, and return its final answer."""
    with OpenAI(
        base_url=base_url, api_key="unused", default_headers={"x-session-id": session}
    ) as client:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a retail support agent. Use the tools."},
            {"role": "user", "content": question},
        ]
        for _ in range(max_turns):
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=messages, tools=TOOLS, temperature=0
            )
            report(
                f"session {raw.headers.get('x-toolsentry-session')}: "
                f"errors {raw.headers.get('x-toolsentry-errors')}/{raw.headers.get('x-toolsentry-max-errors')}, "
                f"repairs {raw.headers.get('x-toolsentry-repairs')}, "
                f"violations [{raw.headers.get('x-toolsentry-violations', '')}]"
            )
            message = raw.parse().choices[0].message
            if not message.tool_calls:
                return message.content or ""
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                result = execute(call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    raise RuntimeError(f"no final answer after {max_turns} turns")


if __name__ == "__main__":
    print(run(sys.argv[1], *sys.argv[2:3]))
