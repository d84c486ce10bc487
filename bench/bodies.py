"""The request bodies bench.overhead sends: one agent turn in each wire protocol, at two sizes.

- `small`: one turn of a retail conversation (system, user, a tool round trip, a follow-up) with
  17 τ²-bench-like tools, about 7 kB; on the Responses API as instructions and input items, on
  the Messages API as `system`, content blocks and `tool_use` / `tool_result`.
- `large`: a Claude-Code-sized turn, about 75 kB: 24 tools named as Claude Code 2.1 names its
  own (`Bash`, `Read`, `Edit`, `Write`, …, plain `{name, description, input_schema}`), three
  system blocks with `cache_control`, a `<system-reminder>` context block, a `Bash` round trip,
  `max_tokens: 32000`, `thinking: {type: adaptive}`, `metadata.user_id` holding the session, and
  Claude Code's other top-level fields (/work/shared/CLIENTS.md). The sizes (per-tool
  description and schema lengths, system and context lengths) follow one request Claude Code
  2.1.332 sent; the words are filler written here, not Claude Code's. On chat completions the
  same turn and tools, as messages and function tools, so the two protocols compare on the
  same body size.

The canned answer (bench/fake_upstream.py) calls `get_order_details` for the small bodies and
`Bash` for the large ones: a declared tool either way, so every request validates one call.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import orjson

from bench.fake_upstream import MODEL
from bench.validate import TOOLS

SIZES = ("small", "large")

_WORDS = [
    "the",
    "agent",
    "reads",
    "the",
    "repository",
    "before",
    "it",
    "edits",
    "a",
    "file",
    "and",
    "keeps",
    "every",
    "change",
    "small",
    "runs",
    "the",
    "tests",
    "that",
    "cover",
    "the",
    "code",
    "it",
    "touched",
    "reports",
    "what",
    "it",
    "found",
    "in",
    "plain",
    "words",
    "never",
    "guesses",
    "a",
    "path",
    "asks",
    "when",
    "a",
    "request",
    "is",
    "unclear",
    "and",
    "prefers",
    "the",
    "tools",
    "it",
    "was",
    "given",
]


def filler(chars: int, seed: int = 0) -> str:
    """Deterministic prose of exactly `chars` characters."""
    words = itertools.cycle(_WORDS[seed % len(_WORDS) :] + _WORDS[: seed % len(_WORDS)])
    out: list[str] = []
    size = 0
    while size < chars:
        word = next(words)
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:chars]


# -- small: the retail turn -----------------------------------------------------------------------


def _retail_chat() -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a retail customer-service agent. " * 8},
            {"role": "user", "content": "Hi, I want to know where my order #W1234567 is."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {
                            "name": "find_user_id_by_email",
                            "arguments": '{"email": "ana@example.com"}',
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": "ana_4521"},
            {"role": "user", "content": "Yes, that is me. What is the status of the order?"},
        ],
        "tools": TOOLS,
        "tool_choice": "auto",
        "temperature": 0.0,
    }


def _as_responses(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat body's turn as a Responses request: instructions, input items, flat tools."""
    system, *turns = chat["messages"]
    items: list[dict[str, Any]] = []
    for message in turns:
        if message["role"] == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": message["content"],
                }
            )
            continue
        if message.get("content"):
            items.append(
                {"type": "message", "role": message["role"], "content": message["content"]}
            )
        for call in message.get("tool_calls") or []:
            function = call["function"]
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": function["name"],
                    "arguments": function["arguments"],
                }
            )
    return {
        "model": chat["model"],
        "instructions": system["content"],
        "input": items,
        "tools": [{"type": "function", **tool["function"]} for tool in chat["tools"]],
        "tool_choice": "auto",
        "temperature": 0.0,
    }


def _as_messages(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat body's turn as a Messages request: `system`, content blocks, tool_use/tool_result."""
    system, *turns = chat["messages"]
    messages: list[dict[str, Any]] = []
    for message in turns:
        if message["role"] == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": message["tool_call_id"],
                "content": message["content"],
            }
            messages.append({"role": "user", "content": [block]})
            continue
        blocks: list[dict[str, Any]] = []
        if message.get("content"):
            blocks.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or []:
            function = call["function"]
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call["id"],
                    "name": function["name"],
                    "input": orjson.loads(function["arguments"]),
                }
            )
        messages.append({"role": message["role"], "content": blocks})
    return {
        "model": chat["model"],
        "max_tokens": 1024,
        "system": system["content"],
        "messages": messages,
        "tools": [
            {
                "name": tool["function"]["name"],
                "description": tool["function"].get("description", ""),
                "input_schema": tool["function"]["parameters"],
            }
            for tool in chat["tools"]
        ],
        "tool_choice": {"type": "auto"},
        "temperature": 0.0,
    }


# -- large: the Claude-Code-sized turn ------------------------------------------------------------

# (name, description length, properties: name → JSON type, required) of Claude Code 2.1's tools.
_CLAUDE_CODE_TOOLS: tuple[tuple[str, int, dict[str, str], tuple[str, ...]], ...] = (
    ("Agent", 3225, {"description": "string", "prompt": "string", "subagent_type": "string", "model": "string", "run_in_background": "boolean"}, ("description", "prompt")),
    ("Bash", 2110, {"command": "string", "timeout": "number", "description": "string", "run_in_background": "boolean", "dangerouslyDisableSandbox": "boolean"}, ("command",)),
    ("CronCreate", 3716, {"schedule": "string", "prompt": "string", "name": "string"}, ("schedule", "prompt")),
    ("CronDelete", 167, {"id": "string"}, ("id",)),
    ("CronList", 106, {}, ()),
    ("Edit", 360, {"file_path": "string", "old_string": "string", "new_string": "string", "replace_all": "boolean"}, ("file_path", "old_string", "new_string")),
    ("EnterWorktree", 3220, {"name": "string", "branch": "string"}, ("name",)),
    ("ExitWorktree", 2149, {"keep": "boolean"}, ()),
    ("NotebookEdit", 619, {"notebook_path": "string", "cell_id": "string", "new_source": "string", "cell_type": "string", "edit_mode": "string"}, ("notebook_path", "new_source")),
    ("Read", 790, {"file_path": "string", "offset": "integer", "limit": "integer", "pages": "string"}, ("file_path",)),
    ("ReportFindings", 574, {"title": "string", "summary": "string", "findings": "array", "severity": "string"}, ("title", "findings")),
    ("ScheduleWakeup", 3396, {"at": "string", "reason": "string", "prompt": "string"}, ("at", "prompt")),
    ("SendMessage", 4761, {"to": "string", "message": "string", "summary": "string"}, ("to", "message")),
    ("Skill", 1417, {"skill": "string", "args": "string"}, ("skill",)),
    ("TaskCreate", 1880, {"subject": "string", "description": "string", "activeForm": "string"}, ("subject", "description")),
    ("TaskGet", 420, {"taskId": "string"}, ("taskId",)),
    ("TaskList", 610, {}, ()),
    ("TaskOutput", 830, {"task_id": "string", "block": "boolean", "timeout": "number"}, ("task_id",)),
    ("TaskStop", 364, {"task_id": "string"}, ("task_id",)),
    ("TaskUpdate", 1970, {"taskId": "string", "status": "string", "subject": "string", "description": "string", "owner": "string"}, ("taskId",)),
    ("WebFetch", 469, {"url": "string", "prompt": "string"}, ("url", "prompt")),
    ("WebSearch", 334, {"query": "string", "allowed_domains": "array", "blocked_domains": "array"}, ("query",)),
    ("Workflow", 3496, {"name": "string", "steps": "array", "inputs": "object", "dry_run": "boolean"}, ("name", "steps")),
    ("Write", 240, {"file_path": "string", "content": "string"}, ("file_path", "content")),
)  # fmt: skip

_SESSION = "0f3c1a52-7d1e-4b8a-9c55-2b1d6e4f9a10"
_SYSTEM_LENGTHS = (74, 62, 6752)
_CONTEXT_LENGTH = 9245  # the <system-reminder> context block (CLAUDE.md, environment)
_REMINDER_LENGTH = 576


def _schema(properties: dict[str, str], required: tuple[str, ...], seed: int) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for i, (name, kind) in enumerate(properties.items()):
        prop: dict[str, Any] = {"type": kind, "description": filler(110 + 50 * (i % 4), seed + i)}
        if kind == "array":
            prop["items"] = {"type": "string"}
        props[name] = prop
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": props,
        "required": list(required),
        "additionalProperties": False,
    }


def claude_code_tools() -> list[dict[str, Any]]:
    """Claude Code's 24 tools as it declares them: `{name, description, input_schema}`."""
    return [
        {
            "name": name,
            "description": filler(length, seed),
            "input_schema": _schema(properties, required, seed),
        }
        for seed, (name, length, properties, required) in enumerate(_CLAUDE_CODE_TOOLS)
    ]


_BASH_ARGUMENTS = {"command": "git status --short", "description": "Show the working tree status"}
_BASH_OUTPUT = "\n".join(f" M src/module_{i}.py" for i in range(40))
_PROMPT = "Fix the failing test in tests/test_parser.py and run it."
_FOLLOW_UP = "Good. Now run the tests of the parser."


def _claude_code_messages() -> dict[str, Any]:
    system = [
        {"type": "text", "text": filler(_SYSTEM_LENGTHS[0], 1)},
        {"type": "text", "text": filler(_SYSTEM_LENGTHS[1], 2), "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": filler(_SYSTEM_LENGTHS[2], 3), "cache_control": {"type": "ephemeral"}},
    ]  # fmt: skip
    reminder = "<system-reminder>\n" + filler(_REMINDER_LENGTH, 4) + "\n</system-reminder>"
    context = "<system-reminder>\n" + filler(_CONTEXT_LENGTH, 5) + "\n</system-reminder>"
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": reminder},
                {"type": "text", "text": context},
                {"type": "text", "text": _PROMPT},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look at the working tree first."},
                {"type": "tool_use", "id": "toolu_0", "name": "Bash", "input": _BASH_ARGUMENTS},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_0", "content": _BASH_OUTPUT},
                {"type": "text", "text": _FOLLOW_UP, "cache_control": {"type": "ephemeral"}},
            ],
        },
    ]
    user_id = orjson.dumps({"device_id": "5" * 64, "account_uuid": "", "session_id": _SESSION})
    return {
        "model": MODEL,
        "messages": messages,
        "system": system,
        "tools": claude_code_tools(),
        "metadata": {"user_id": user_id.decode()},
        "max_tokens": 32000,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
    }


def _claude_code_chat() -> dict[str, Any]:
    """The Claude-Code-sized turn on chat completions: the same texts, calls and tools."""
    anthropic = _claude_code_messages()
    system = "\n\n".join(block["text"] for block in anthropic["system"])
    first, _, last = anthropic["messages"]
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": [{"type": "text", "text": b["text"]} for b in first["content"]]},
            {
                "role": "assistant",
                "content": "Let me look at the working tree first.",
                "tool_calls": [
                    {
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "Bash", "arguments": orjson.dumps(_BASH_ARGUMENTS).decode()},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_0", "content": _BASH_OUTPUT},
            {"role": "user", "content": last["content"][1]["text"]},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": tool["name"],
                    "description": tool["description"],
                    "parameters": tool["input_schema"],
                },
            }
            for tool in anthropic["tools"]
        ],
        "max_tokens": 32000,
        "user": _SESSION,
    }  # fmt: skip


def named_body(body: bytes, session: str) -> bytes:
    """`body` naming its session in `metadata.session_id`, as a client that keeps one sends it
    (every load generator passes the body on unchanged): its requests are one session and the
    store does its per-request work, without the conversation lookup of a request that names
    none (README, "A request that names no session")."""
    parsed = orjson.loads(body)
    parsed["metadata"] = {**parsed.get("metadata", {}), "session_id": session}
    return orjson.dumps(parsed)


def request_body(stream: bool = False, api: str = "chat", size: str = "small") -> bytes:
    """The benchmark's request in `api` (chat, responses, messages) at `size` (small, large)."""
    if size == "large":
        if api == "responses":
            raise ValueError("the Claude-Code-sized body is measured on chat and messages")
        body = _claude_code_messages() if api == "messages" else _claude_code_chat()
    else:
        chat = _retail_chat()
        body = {"chat": chat, "responses": _as_responses(chat), "messages": _as_messages(chat)}[api]
    if stream:
        body["stream"] = True
    return orjson.dumps(body)


@dataclass(frozen=True)
class Workload:
    """One request measured: a wire protocol's route and a body size (bench/bodies.py)."""

    name: str
    api: str
    size: str
    route: str
    ttft: bool  # also streamed one at a time for the time to first token

    def body(self, stream: bool = False) -> bytes:
        return request_body(stream=stream, api=self.api, size=self.size)


WORKLOADS = {
    w.name: w
    for w in (
        Workload("chat", "chat", "small", "/v1/chat/completions", True),
        Workload("responses", "responses", "small", "/v1/responses", True),
        Workload("messages", "messages", "small", "/v1/messages", True),
        Workload("chat-large", "chat", "large", "/v1/chat/completions", False),
        # Claude Code's own route, query string and all.
        Workload("messages-large", "messages", "large", "/v1/messages?beta=true", False),
    )
}
"""What `--workloads` chooses among; small bodies are about 7 kB, large ones about 75 kB."""
