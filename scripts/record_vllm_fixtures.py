"""Record real vLLM chat-completion responses as fixtures for the guard and the stream assembler.

Sends a fixed set of requests straight to a vLLM server (``scripts/vllm-cpu start``): with and
without tools, ``tool_choice`` auto / required / named / none, non-streaming and streaming, and
prompts that make the small model leak, truncate or invent its calls. Writes, under
``tests/fixtures/vllm/``:

- ``NAME.json``: ``{"recorded": {...}, "request": {...}, "status": N, "response": {...}}`` for a
  non-streaming request (``response`` is vLLM's JSON body, error bodies included);
- ``NAME.sse`` (the raw bytes of the event stream) and ``NAME.request.json`` (the same envelope
  without ``response``) for a streaming request;
- ``index.json``: one line per fixture with what came back (finish reason, tool names, whether the
  content holds a ``<tool_call>``), so a test can pick fixtures by what they show.

Usage: python scripts/record_vllm_fixtures.py [--url http://127.0.0.1:PORT/v1] [--only NAME ...]
The URL defaults to $TOOLSENTRY_VLLM_URL, else to what ``scripts/vllm-cpu status`` prints.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

# The fixtures are recorded with the very tools and system prompt the live suite sends.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts.live_requests import (
    GET_ORDER_DETAILS,
    SYSTEM,
    TOOLS,
)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "vllm"
MODEL = "gemma-270m"

# A schema with a typo'd type: vLLM's guided decoding for `required` cannot follow it.
TYPO_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "find_user_id_by_email",
            "description": "Find a user id by email address.",
            "parameters": {
                "type": "object",
                "properties": {"email": {"type": "strin"}},
                "required": ["email"],
            },
        },
    }
]


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def tool_round(
    question: str, call: dict[str, Any], result: dict[str, Any], answer: str
) -> list[dict[str, Any]]:
    """One solved exchange: question, tool call, tool result, answer."""
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)},
        {"role": "assistant", "content": answer},
    ]


# The model is a base model: two solved examples in the history make it answer in <tool_call> form.
FEW_SHOT = [
    SYSTEM,
    *tool_round(
        "What is in order #W1000001?",
        tool_call("call_1", "get_order_details", {"order_id": "#W1000001"}),
        {"order_id": "#W1000001", "status": "delivered", "items": ["desk lamp"]},
        "Order #W1000001 was delivered and contains a desk lamp.",
    ),
    *tool_round(
        "Cancel order #W1000002, I ordered it by mistake.",
        tool_call(
            "call_2",
            "cancel_pending_order",
            {"order_id": "#W1000002", "reason": "ordered by mistake"},
        ),
        {"order_id": "#W1000002", "status": "cancelled"},
        "Order #W1000002 is cancelled.",
    ),
]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


@dataclass(frozen=True)
class Case:
    """One recorded request: its fixture name, what it is meant to show, and the body sent."""

    name: str
    note: str
    body: dict[str, Any]
    stream: bool = False

    def request(self) -> dict[str, Any]:
        body = {"model": MODEL, "temperature": 0, "max_tokens": 96} | self.body
        if self.stream:
            body["stream"] = True
        return body


LOOKUP = [*FEW_SHOT, user("What is in order #W2378156?")]
CANCEL = [*FEW_SHOT, user("Cancel order #W2378156, I no longer need it.")]
CANCEL_ZERO_SHOT = [SYSTEM, user("Cancel order #W2378156, I no longer need it.")]
FOLLOW_UP = [
    *FEW_SHOT,
    user("What is in order #W2378156?"),
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [tool_call("call_3", "get_order_details", {"order_id": "#W2378156"})],
    },
]

CASES = [
    Case(
        "chat_no_tools",
        "plain chat, no tools",
        {"messages": [SYSTEM, user("Greet the customer in one sentence.")], "max_tokens": 32},
    ),
    Case(
        "chat_no_tools_stream",
        "plain chat, no tools, streamed: content deltas only",
        {"messages": [SYSTEM, user("Greet the customer in one sentence.")], "max_tokens": 32},
        stream=True,
    ),
    Case("auto_lookup", "tool_choice auto, few-shot lookup", {"messages": LOOKUP, "tools": TOOLS}),
    Case(
        "auto_lookup_stream",
        "tool_choice auto, few-shot lookup, streamed: tool-call deltas",
        {"messages": LOOKUP, "tools": TOOLS, "max_tokens": 64},
        stream=True,
    ),
    Case(
        "auto_cancel_sampled",
        "tool_choice auto, sampled: calls the parser could not parse stay in content",
        {"messages": CANCEL, "tools": TOOLS, "temperature": 1.0, "seed": 7},
    ),
    Case(
        "auto_cancel_sampled_stream",
        "tool_choice auto, sampled, streamed: a leaked call arrives as content deltas",
        {"messages": CANCEL, "tools": TOOLS, "temperature": 1.0, "seed": 7},
        stream=True,
    ),
    Case(
        "auto_refund_sampled",
        "tool_choice auto, sampled, a request no tool serves",
        {
            "messages": [*FEW_SHOT, user("Refund order #W2378156 to my gift card.")],
            "tools": TOOLS,
            "temperature": 1.0,
            "seed": 3,
        },
    ),
    Case(
        "auto_zero_shot",
        "tool_choice auto, no examples: the base model echoes the tool prompt",
        {"messages": CANCEL_ZERO_SHOT, "tools": TOOLS},
    ),
    Case(
        "auto_undeclared_tool",
        "tool_choice auto, cancel_pending_order used in the history but not declared now",
        {"messages": CANCEL, "tools": [GET_ORDER_DETAILS], "max_tokens": 64},
    ),
    Case(
        "auto_undeclared_tool_stream",
        "tool_choice auto, an undeclared tool called, streamed",
        {"messages": CANCEL, "tools": [GET_ORDER_DETAILS]},
        stream=True,
    ),
    Case(
        "required_cancel",
        "tool_choice required (guided decoding), few-shot",
        {"messages": CANCEL, "tools": TOOLS, "tool_choice": "required"},
    ),
    Case(
        "required_cancel_stream",
        "tool_choice required, streamed",
        {"messages": CANCEL, "tools": TOOLS, "tool_choice": "required"},
        stream=True,
    ),
    Case(
        "required_zero_shot",
        "tool_choice required, no examples: arguments that break the schema",
        {"messages": CANCEL_ZERO_SHOT, "tools": TOOLS, "tool_choice": "required"},
    ),
    Case(
        "required_sampled_1",
        "tool_choice required, sampled",
        {
            "messages": CANCEL_ZERO_SHOT,
            "tools": TOOLS,
            "tool_choice": "required",
            "temperature": 1.0,
            "seed": 11,
        },
    ),
    Case(
        "required_sampled_2",
        "tool_choice required, sampled",
        {
            "messages": CANCEL,
            "tools": TOOLS,
            "tool_choice": "required",
            "temperature": 1.0,
            "seed": 12,
        },
    ),
    Case(
        "required_low_max_tokens",
        "tool_choice required, max_tokens 12: the call is cut off",
        {"messages": CANCEL, "tools": TOOLS, "tool_choice": "required", "max_tokens": 12},
    ),
    Case(
        "required_low_max_tokens_stream",
        "tool_choice required, max_tokens 12, streamed with usage",
        {
            "messages": CANCEL,
            "tools": TOOLS,
            "tool_choice": "required",
            "max_tokens": 12,
            "stream_options": {"include_usage": True},
        },
        stream=True,
    ),
    Case(
        "named_get_order",
        "tool_choice names get_order_details",
        {"messages": CANCEL, "tools": TOOLS, "tool_choice": named("get_order_details")},
    ),
    Case(
        "named_get_order_stream",
        "tool_choice names get_order_details, streamed",
        {"messages": CANCEL, "tools": TOOLS, "tool_choice": named("get_order_details")},
        stream=True,
    ),
    Case(
        "named_low_max_tokens",
        "tool_choice named, max_tokens 8: the arguments are cut off",
        {
            "messages": CANCEL,
            "tools": TOOLS,
            "tool_choice": named("cancel_pending_order"),
            "max_tokens": 8,
        },
    ),
    Case(
        "none_choice",
        "tool_choice none with tools declared",
        {"messages": LOOKUP, "tools": TOOLS, "tool_choice": "none"},
    ),
    Case(
        "typo_schema_required",
        "a parameters schema with type 'strin', tool_choice required",
        {
            "messages": [SYSTEM, user("My email is ada@example.com, find my account.")],
            "tools": TYPO_TOOLS,
            "tool_choice": "required",
        },
    ),
    Case(
        "tool_result_follow_up",
        "the turn after a tool result",
        {
            "messages": [
                *FOLLOW_UP,
                {
                    "role": "tool",
                    "tool_call_id": "call_3",
                    "content": json.dumps(
                        {"order_id": "#W2378156", "status": "pending", "items": ["kettle"]}
                    ),
                },
            ],
            "tools": TOOLS,
        },
    ),
    Case(
        "tool_error_follow_up",
        "the turn after a tool result that reports an error (τ²-bench's 'Error: ...')",
        {
            "messages": [
                *FOLLOW_UP,
                {
                    "role": "tool",
                    "tool_call_id": "call_3",
                    "content": "Error: order #W2378156 not found",
                },
            ],
            "tools": TOOLS,
        },
    ),
    Case(
        "error_unknown_model",
        "a model the server does not serve",
        {"model": "no-such-model", "messages": [user("hello")]},
    ),
    Case(
        "error_named_tool_not_declared",
        "tool_choice names a tool that is not in tools",
        {"messages": LOOKUP, "tools": TOOLS, "tool_choice": named("refund_order")},
    ),
    Case(
        "error_max_tokens_over_context",
        "max_tokens beyond the 4096-token context",
        {"messages": [user("hello")], "max_tokens": 100_000},
    ),
    Case(
        "error_max_tokens_over_context_stream",
        "max_tokens beyond the context, streamed: the error comes as JSON, not as an event",
        {"messages": [user("hello")], "max_tokens": 100_000},
        stream=True,
    ),
    Case(
        "error_negative_temperature",
        "a sampling parameter out of range",
        {"messages": [user("hello")], "temperature": -1},
    ),
]


def server_url() -> str:
    """The vLLM base URL: $TOOLSENTRY_VLLM_URL, else `scripts/vllm-cpu status`."""
    if url := os.environ.get("TOOLSENTRY_VLLM_URL"):
        return url.rstrip("/")
    status = subprocess.run(
        [str(ROOT / "scripts" / "vllm-cpu"), "status"], capture_output=True, text=True, check=False
    )
    if status.returncode != 0 or not status.stdout.strip():
        sys.exit(
            "no vLLM server is running: start one with "
            "`scripts/vllm-cpu setup && scripts/vllm-cpu start`, or set TOOLSENTRY_VLLM_URL"
        )
    return status.stdout.strip().splitlines()[-1].rstrip("/")


def summarize_message(message: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    content = message.get("content") or ""
    calls = message.get("tool_calls") or []
    return {
        "finish_reason": finish_reason,
        "tool_calls": [call["function"]["name"] for call in calls],
        "content_has_tool_call": "<tool_call>" in content,
        "content_chars": len(content),
    }


def assemble_stream(raw: bytes) -> tuple[dict[str, Any], str | None]:
    """Accumulate the first choice's deltas into one message (for the index only)."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line.removeprefix("data: "))
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            content.append(delta.get("content") or "")
            for part in delta.get("tool_calls") or []:
                call = calls.setdefault(part["index"], {"function": {"name": "", "arguments": ""}})
                function = part.get("function", {})
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    message = {"content": "".join(content), "tool_calls": [calls[i] for i in sorted(calls)]}
    return message, finish


def record(client: httpx.Client, case: Case, recorded: dict[str, Any]) -> dict[str, Any]:
    """Send one case, write its fixture files, and return its index entry."""
    request = case.request()
    envelope: dict[str, Any] = {"recorded": recorded | {"note": case.note}, "request": request}
    started = time.monotonic()
    if case.stream:
        with client.stream("POST", "/chat/completions", json=request) as response:
            raw = b"".join(response.iter_raw())
            status = response.status_code
        envelope |= {"status": status, "content_type": response.headers.get("content-type")}
        (OUT / f"{case.name}.sse").write_bytes(raw)
        (OUT / f"{case.name}.request.json").write_text(json.dumps(envelope, indent=2) + "\n")
        entry = {"file": f"{case.name}.sse", "stream": True}
        if status == 200:
            entry |= summarize_message(*assemble_stream(raw))
        else:
            entry |= {"error": json.loads(raw).get("error")}
    else:
        response = client.post("/chat/completions", json=request)
        envelope |= {"status": response.status_code, "response": response.json()}
        (OUT / f"{case.name}.json").write_text(json.dumps(envelope, indent=2) + "\n")
        entry = {"file": f"{case.name}.json", "stream": False}
        body = envelope["response"]
        if response.status_code == 200:
            choice = body["choices"][0]
            entry |= summarize_message(choice["message"], choice["finish_reason"])
        else:
            entry |= {"error": body.get("error", body)}
    entry = {"status": envelope["status"], "note": case.note} | entry
    print(
        f"{case.name:34} {envelope['status']} {time.monotonic() - started:5.1f}s "
        f"{entry.get('finish_reason', '')} {entry.get('tool_calls', '')}"
        f"{' leaked' if entry.get('content_has_tool_call') else ''}",
        flush=True,
    )
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="vLLM base URL, e.g. http://127.0.0.1:8001/v1")
    parser.add_argument("--only", nargs="*", help="record only these fixture names")
    args = parser.parse_args(argv)

    url = (args.url or server_url()).rstrip("/")
    cases = [c for c in CASES if not args.only or c.name in args.only]
    OUT.mkdir(parents=True, exist_ok=True)
    with httpx.Client(base_url=url, timeout=300) as client:
        version = client.get(url.removesuffix("/v1") + "/version").json()["version"]
        recorded = {"server": f"vLLM {version} (vllm-cpu)", "model": MODEL}
        entries = {c.name: record(client, c, recorded) for c in cases}

    index_path = OUT / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() and args.only else {}
    index.update(entries)
    index_path.write_text(
        "{\n"
        + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(index.items()))
        + "\n}\n"
    )
    print(f"{len(entries)} fixtures written to {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
