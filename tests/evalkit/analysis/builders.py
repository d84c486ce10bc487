"""Builders of results dicts for the analysis tests: episodes described by their calls."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What a call did, and the tool message τ²-bench would have recorded for it.
OK = "ok"
UNKNOWN = "unknown"  # a tool name that does not exist
MALFORMED = "malformed"  # arguments that are not a JSON object
SCHEMA = "schema"  # arguments of the wrong type (a retail schema sees it; no text does)
EXTRA_ARG = "extra_arg"  # an argument the tool does not take (Python's TypeError text)
BUSINESS = "business"  # a valid call the environment refuses
USER_ERROR = "user_error"  # the user's own device tool fails (telecom)
USER_OK = "user_ok"


_ids = itertools.count()


@dataclass(frozen=True)
class Call:
    kind: str
    name: str = "get_order_details"


def _assistant_call(index: int, call: Call) -> tuple[dict[str, Any], dict[str, Any]]:
    call_id = f"call_{index}"
    arguments: dict[str, Any] = {"order_id": "#W0000001"}
    raw_arguments = None
    content = json.dumps({"order_id": "#W0000001", "status": "pending"})
    error = False
    requestor = "assistant"
    if call.kind == UNKNOWN:
        content, error = f"Error: Tool '{call.name}' not found.", True
    elif call.kind == MALFORMED:
        raw_arguments = '{"order_id": "#W00'
        arguments = {}
        content = f"Error: Arguments of tool '{call.name}' are not a JSON object: {raw_arguments}"
        error = True
    elif call.kind == SCHEMA:
        arguments = {"order_id": 1234}
        content, error = "Error: Order not found", True
    elif call.kind == EXTRA_ARG:
        arguments = {"order_id": "#W0000001", "verbose": True}
        content = f"Error: RetailTools.{call.name}() got an unexpected keyword argument 'verbose'"
        error = True
    elif call.kind == BUSINESS:
        content, error = "Error: Non-delivered order cannot be returned", True
    elif call.kind in (USER_ERROR, USER_OK):
        requestor = "user"
        arguments = {}
        error = call.kind == USER_ERROR
        content = "Error: SIM card is not inserted" if error else "Status: connected"
    tool_call: dict[str, Any] = {
        "id": call_id,
        "name": call.name,
        "arguments": arguments,
        "requestor": requestor,
    }
    if raw_arguments is not None:
        tool_call["raw_arguments"] = raw_arguments
    message = {"role": requestor, "content": None, "tool_calls": [tool_call]}
    tool = {
        "role": "tool",
        "id": call_id,
        "content": content,
        "requestor": requestor,
        "error": error,
    }
    return message, tool


def episode(
    task_id: str,
    calls: list[Call] | tuple[Call, ...] = (),
    *,
    reward: float = 1.0,
    termination: str = "user_stop",
    trial: int | None = 0,
    sim_id: str | None = None,
) -> dict[str, Any]:
    """One simulation: a greeting, then each call and its tool message, then a goodbye."""
    messages: list[dict[str, Any]] = [
        {"role": "assistant", "content": "Hi! How can I help you today?"},
        {"role": "user", "content": "I need help with my order."},
    ]
    for index, call in enumerate(calls):
        message, tool = _assistant_call(index, call)
        messages += [message, tool]
    messages.append({"role": "assistant", "content": "Done. Anything else?"})
    return {
        "id": sim_id or f"sim-{next(_ids)}",
        "task_id": task_id,
        "trial": trial,
        "termination_reason": termination,
        "reward_info": {"reward": reward},
        "messages": messages,
    }


def errors(n: int, kind: str = BUSINESS, name: str = "get_order_details") -> list[Call]:
    return [Call(kind, name) for _ in range(n)]


def results(
    simulations: list[dict[str, Any]],
    *,
    domain: str = "retail",
    model: str = "test-model",
    max_errors: int | None = 10,
    tool_defs: Any = None,
) -> dict[str, Any]:
    """A results file's dict in τ²-bench's shape."""
    info: dict[str, Any] = {
        "num_trials": 1,
        "max_steps": 200,
        "agent_info": {"implementation": "llm_agent", "llm": model},
        "user_info": {"implementation": "user_simulator", "llm": "user-model"},
        "environment_info": {"domain_name": domain, "policy": "", "tool_defs": tool_defs},
        "seed": 300,
    }
    if max_errors is not None:
        info["max_errors"] = max_errors
    return {
        "timestamp": "2025-08-01T00:00:00",
        "info": info,
        "tasks": [],
        "simulations": simulations,
    }


def write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path
