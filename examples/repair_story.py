"""The repair story in one screen: a model hallucinates a tool, the proxy re-asks, the agent never knows.

Starts a scripted upstream and the proxy on loopback ports, makes one call with the `openai` SDK,
and prints what the upstream said, what the proxy asked back, what the client received and the
session's counts. Run: `python examples/repair_story.py`.
"""

from __future__ import annotations

import json

import httpx
import openai
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from proxy.app import create_app
from proxy.config import Settings
from proxy.headers import ERRORS_HEADER, MAX_ERRORS_HEADER, REPAIRS_HEADER, VIOLATIONS_HEADER
from proxy.logs import configure_logging
from proxy.testing import LoopbackServer, ScriptedUpstream, completion, tool_call

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    }
    for name, description in (
        ("get_order_details", "Look up an order."),
        ("cancel_pending_order", "Cancel an order that has not shipped."),
    )
]


def main() -> None:
    configure_logging("warning")
    console = Console()
    hallucinated = completion(
        tool_calls=[tool_call("cancel_order", {"order_id": "#W2378156"}, id="call_1")],
        model="demo-int4",
    )
    repaired = completion(
        tool_calls=[tool_call("cancel_pending_order", {"order_id": "#W2378156"}, id="call_2")],
        model="demo-int4",
    )
    script = ScriptedUpstream([hallucinated, repaired], models=("demo-int4",))
    with LoopbackServer(script.app) as upstream:
        settings = Settings(upstreams=[{"name": "scripted", "base_url": f"{upstream.url}/v1"}])
        with LoopbackServer(create_app(settings)) as proxy:
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="demo", max_retries=0)
            raw = client.chat.completions.with_raw_response.create(
                model="demo-int4",
                messages=[
                    {"role": "system", "content": "You are a retail support agent."},
                    {"role": "user", "content": "Please cancel order #W2378156."},
                ],
                tools=TOOLS,  # type: ignore[arg-type]
                extra_headers={"x-session-id": "demo-session"},
            )
            session = httpx.get(f"{proxy.url}/v1/sessions/demo-session").json()

    said = hallucinated["choices"][0]["message"]["tool_calls"][0]["function"]
    asked_back = script.requests[1]["messages"][-1]["content"]
    received = raw.parse().choices[0].message.tool_calls[0].function  # type: ignore[index]
    console.print(
        Panel.fit("toolsentry — the repair story (a scripted upstream, real HTTP)", style="bold")
    )
    console.print(
        f"[red]1. The model called[/]  {said['name']}({said['arguments']})  — not in the request's tools"
    )
    console.print(f"[yellow]2. The proxy re-asked[/] {asked_back}")
    console.print(f"[green]3. The client received[/] {received.name}({received.arguments})")
    table = Table(title="x-toolsentry-* headers and the session's counts")
    table.add_column("what")
    table.add_column("value")
    for header in (VIOLATIONS_HEADER, REPAIRS_HEADER, ERRORS_HEADER, MAX_ERRORS_HEADER):
        table.add_row(header, raw.headers[header])
    table.add_row("session channels", json.dumps(session["channels"]))
    table.add_row("session errors (budget used)", f"{session['errors']} of {session['max_errors']}")
    console.print(table)
    console.print(
        "The agent saw a valid call and spent none of its error budget; the failure is still "
        "counted per channel, so the damage a flat score hides stays visible."
    )


if __name__ == "__main__":
    main()
