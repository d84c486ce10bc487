"""Builders for the simulated model's tests: profiles, an in-process agent, conversations."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from evalkit.agent import system_prompt, to_openai_messages
from evalkit.domains.base import Domain
from evalkit.messages import (
    AssistantMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
    now_iso,
    user_view,
)
from evalkit.sim.model import EpisodeKey, SimulatedModel
from evalkit.sim.profiles import BF16, DamageProfile
from proxy.testing import tool_call

OPENING: list[dict[str, Any]] = [
    {"role": "system", "content": "policy"},
    {"role": "assistant", "content": "Hi! How can I help you today?"},
    {"role": "user", "content": "Hi! I want to cancel an order."},
]
"""The start of a retail episode as the model sees it: policy, greeting, the customer's ask."""


def agent_tools(domain: Domain) -> list[dict[str, Any]]:
    """The domain's agent tools as an OpenAI `tools` list."""
    toolkit, _ = domain.toolkit_classes()
    return toolkit.openai_tools()


def make_profile(name: str = "test", **fields: float) -> DamageProfile:
    """A profile with no damage at all unless `fields` say otherwise."""
    base = {
        "unknown_tool": 0.0,
        "malformed_arguments": 0.0,
        "schema_violation": 0.0,
        "leaked_tool_call": 0.0,
        "recover": 1.0,
        "give_up": 0.0,
        "reask_fix": 1.0,
        "policy_error": 0.0,
    }
    return DamageProfile.model_validate({**BF16.model_dump(), **base, **fields, "name": name})


class InProcessSimAgent:
    """The simulated model as an episode's agent, without HTTP or proxy (for pure tests)."""

    def __init__(self, domain: Domain, profile: DamageProfile, key: EpisodeKey) -> None:
        self.model = SimulatedModel(domain)
        self.profile = profile
        self.key = key
        tools, _ = domain.toolkit_classes()
        self.tools = tools.openai_tools()
        self.system = system_prompt(domain.policy)

    async def respond(self, history: Sequence[Any]) -> AssistantMessage:
        from evalkit.agent import parse_tool_call
        from evalkit.messages import agent_view

        messages = to_openai_messages(self.system, agent_view(history))
        reply = self.model.reply(messages, self.tools, self.key, self.profile)
        calls = [
            parse_tool_call(c["id"], c["function"]["name"], c["function"]["arguments"])
            for c in reply.tool_calls
        ]
        return AssistantMessage(
            content=reply.content, tool_calls=calls or None, timestamp=now_iso()
        )


def assistant_call(name: str, arguments: dict[str, Any] | str, call_id: str) -> dict[str, Any]:
    """An assistant message with one tool call."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [tool_call(name, arguments, id=call_id)],
    }


def tool_answer(call_id: str, content: str) -> dict[str, Any]:
    """A tool message answering `call_id`."""
    return {"role": "tool", "tool_call_id": call_id, "content": content}


class NamedCallUser:
    """A customer who does on their device exactly the calls an agent message names as
    `tool({json})` — the rule telecom's scripted customer follows first — and reports back."""

    def __init__(self, tool_names: Sequence[str]) -> None:
        names = "|".join(sorted(tool_names, key=len, reverse=True))
        self.pattern = re.compile(rf"\b({names})\((\{{.*?\}})?\)")

    async def respond(self, history: Sequence[Any]) -> UserMessage:
        view = user_view(history)
        if not any(isinstance(m, UserMessage) for m in view):
            return UserMessage(content="Hi! My phone has no signal.")
        if isinstance(view[-1], ToolMessage):
            return UserMessage(content=f"Done. My phone shows: {view[-1].content}")
        agent = [m for m in view if isinstance(m, AssistantMessage)]
        text = agent[-1].content or "" if agent else ""
        made = sum(len(m.tool_calls or []) for m in view if isinstance(m, UserMessage))
        calls = [
            ToolCall(
                id=f"user_{made + i}",
                name=m.group(1),
                arguments=json.loads(m.group(2) or "{}"),
                requestor="user",
            )
            for i, m in enumerate(self.pattern.finditer(text))
        ]
        if calls:
            return UserMessage(tool_calls=calls)
        if "anything else" in text:
            return UserMessage(content="No, thanks. ###STOP###")
        return UserMessage(content="Yes, please go ahead.")


def responses_request(messages: Sequence[dict[str, Any]]) -> tuple[str | None, list[Any]]:
    """A chat conversation as a Responses request's `instructions` and `input` items."""
    instructions, items = None, []
    for m in messages:
        if m["role"] == "system":
            instructions = m["content"]
        elif m["role"] == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m["tool_call_id"],
                    "output": m["content"],
                }
            )
        else:
            if m.get("content"):
                items.append({"type": "message", "role": m["role"], "content": m["content"]})
            for c in m.get("tool_calls") or []:
                function = c["function"]
                items.append(
                    {
                        "type": "function_call",
                        "call_id": c["id"],
                        "name": function["name"],
                        "arguments": function["arguments"],
                    }
                )
    return instructions, items


def responses_tools(tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat function tools as flat Responses function tools."""
    return [{"type": "function", **t["function"]} for t in tools]


def messages_request(messages: Sequence[dict[str, Any]]) -> tuple[str | None, list[Any]]:
    """A chat conversation as a Messages request's `system` and `messages` (tool answers become
    `tool_result` blocks of a user turn)."""
    system, out = None, list[dict[str, Any]]()
    for m in messages:
        if m["role"] == "system":
            system = m["content"]
            continue
        if m["role"] == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": m["tool_call_id"],
                "content": m["content"],
            }
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
            continue
        blocks: list[dict[str, Any]] = []
        if m.get("content"):
            blocks.append({"type": "text", "text": m["content"]})
        for c in m.get("tool_calls") or []:
            function = c["function"]
            blocks.append(
                {
                    "type": "tool_use",
                    "id": c["id"],
                    "name": function["name"],
                    "input": json.loads(function["arguments"]),
                }
            )
        out.append({"role": m["role"], "content": blocks})
    return system, out


def messages_tools(tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat function tools as Messages tools."""
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            "input_schema": t["function"]["parameters"],
        }
        for t in tools
    ]
