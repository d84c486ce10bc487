"""The live suite's fixed requests and their judge: the prompts, tools and modes sent to a real
vLLM, the openai-SDK sender that reads what a client receives (headers, message, the stream's
summary comment), and the check that every tool call it received is valid against the request's
tools or reported in `x-toolsentry-violations`.

Shared by the live tests (tests/live), the repair benchmark (bench/repair.py) and the fixture
recorder (scripts/record_vllm_fixtures.py), which may not import one another; like
scripts/vllm_cpu.py it lives in the checkout, not in the installed package.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import jsonschema
from openai import OpenAI
from openai.types.chat import ChatCompletionChunk
from prometheus_client.parser import text_string_to_metric_families

MODEL = "gemma-270m"
SUMMARY_PREFIX = ": x-toolsentry "
HERMES_OPEN = "<tool_call>"

GET_ORDER_DETAILS: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_order_details",
        "description": "Get the status and items of an order.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string", "description": "The order id, such as '#W0000000'."}
            },
            "required": ["order_id"],
            "additionalProperties": False,
        },
    },
}
CANCEL_PENDING_ORDER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "cancel_pending_order",
        "description": "Cancel a pending order.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string"},
                "reason": {"type": "string", "enum": ["no longer needed", "ordered by mistake"]},
            },
            "required": ["order_id", "reason"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [GET_ORDER_DETAILS, CANCEL_PENDING_ORDER]
SYSTEM = {
    "role": "system",
    "content": "You are a retail support agent. Use the tools to help the user.",
}


def tool_round(
    question: str, name: str, arguments: dict[str, Any], result: str, answer: str
) -> list[dict[str, Any]]:
    call_id = f"call_{name}_{len(question)}"
    return [
        {"role": "user", "content": question},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": result},
        {"role": "assistant", "content": answer},
    ]


# Gemma 3 270M is a base model: solved examples in the history make it answer with <tool_call>s.
FEW_SHOT = [
    SYSTEM,
    *tool_round(
        "What is in order #W1000001?",
        "get_order_details",
        {"order_id": "#W1000001"},
        '{"order_id": "#W1000001", "status": "delivered", "items": ["desk lamp"]}',
        "Order #W1000001 was delivered and contains a desk lamp.",
    ),
    *tool_round(
        "Cancel order #W1000002, I ordered it by mistake.",
        "cancel_pending_order",
        {"order_id": "#W1000002", "reason": "ordered by mistake"},
        '{"order_id": "#W1000002", "status": "cancelled"}',
        "Order #W1000002 is cancelled.",
    ),
]


@dataclass(frozen=True)
class Prompt:
    """A conversation to send, the tools declared with it, and the tool a named choice forces."""

    name: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    forced: str
    sampling: dict[str, Any]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


PROMPTS = [
    Prompt(
        "lookup", [*FEW_SHOT, user("What is in order #W2378156?")], TOOLS, "get_order_details", {}
    ),
    Prompt(
        "cancel",
        [*FEW_SHOT, user("Cancel order #W2378156, I no longer need it.")],
        TOOLS,
        "cancel_pending_order",
        {},
    ),
    Prompt(
        "cancel_sampled",
        [*FEW_SHOT, user("Cancel order #W2378156, I no longer need it.")],
        TOOLS,
        "cancel_pending_order",
        {"temperature": 1.0, "seed": 7},
    ),
    Prompt(
        "undeclared_tool",
        [*FEW_SHOT, user("Cancel order #W2378156, I no longer need it.")],
        [GET_ORDER_DETAILS],
        "get_order_details",
        {},
    ),
    Prompt(
        "refund_sampled",
        [*FEW_SHOT, user("Refund order #W2378156 to my gift card.")],
        TOOLS,
        "cancel_pending_order",
        {"temperature": 1.0, "seed": 3},
    ),
    Prompt(
        "zero_shot",
        [SYSTEM, user("Cancel order #W2378156, I no longer need it.")],
        TOOLS,
        "cancel_pending_order",
        {},
    ),
    Prompt(
        "zero_shot_sampled",
        [SYSTEM, user("What did I order in #W2378156?")],
        TOOLS,
        "get_order_details",
        {"temperature": 1.0, "seed": 11},
    ),
    Prompt(
        "after_tool_error",
        [
            *FEW_SHOT,
            *tool_round(
                "Where is order #W2378156?",
                "get_order_details",
                {"order_id": "#W2378156"},
                "Error: order #W2378156 not found",
                "I could not find that order. Could you check the id?",
            ),
            user("Sorry, it is #W2378157."),
        ],
        TOOLS,
        "get_order_details",
        {},
    ),
]


def tool_choice_for(prompt: Prompt, choice: str) -> str | dict[str, Any]:
    """`auto`, `required`, or `named` (the prompt's forced tool) as a request's tool_choice."""
    if choice == "named":
        return {"type": "function", "function": {"name": prompt.forced}}
    return choice


@dataclass(frozen=True)
class Received:
    """What a client got: the proxy's headers, the (accumulated) message and its finish reason,
    and for a stream the proxy's summary comment sent before `[DONE]` (None if there was none)."""

    headers: dict[str, str]
    message: dict[str, Any]
    finish_reason: str | None
    summary: dict[str, Any] | None = None

    @property
    def report(self) -> dict[str, Any]:
        """The proxy's account of this turn in the summary's shape: the summary comment of a
        stream (its headers went out before the turn was settled), else the response headers."""
        if self.summary is not None:
            return self.summary
        raw = self.headers.get("x-toolsentry-violations", "")
        return {
            "session": self.headers.get("x-toolsentry-session"),
            "errors": int(self.headers.get("x-toolsentry-errors", "0")),
            "max_errors": int(self.headers.get("x-toolsentry-max-errors", "0")),
            "repairs": int(self.headers.get("x-toolsentry-repairs", "0")),
            "violations": [part.strip() for part in raw.split(",") if part.strip()],
        }

    @property
    def violations(self) -> set[str]:
        return set(self.report["violations"])

    @property
    def repairs(self) -> int:
        return int(self.report["repairs"])


def send(
    client: OpenAI,
    prompt: Prompt,
    choice: str,
    stream: bool,
    session: str,
    max_tokens: int = 96,
) -> Received:
    """Send `prompt` through the proxy with the openai SDK and return what the client received."""
    params: dict[str, Any] = {
        "model": MODEL,
        "messages": prompt.messages,
        "tools": prompt.tools,
        "tool_choice": tool_choice_for(prompt, choice),
        "max_tokens": max_tokens,
        "temperature": 0,
        **prompt.sampling,
    }
    if not stream:
        raw = client.chat.completions.with_raw_response.create(
            **params, extra_headers={"x-session-id": session}
        )
        choice_out = raw.parse().choices[0]
        headers = {k.lower(): v for k, v in raw.headers.items()}
        return Received(headers, choice_out.message.model_dump(), choice_out.finish_reason)
    # Read raw, so that the summary comment (which the SDK's decoder skips) is seen too.
    with client.chat.completions.with_streaming_response.create(
        **params, stream=True, extra_headers={"x-session-id": session}
    ) as response:
        headers = {k.lower(): v for k, v in response.headers.items()}
        chunks, summary = read_stream(response.iter_lines())
    return Received(headers, *accumulate(chunks), summary=summary)


def read_stream(lines: Any) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The chunks of an SSE chat stream (each checked against the SDK's chunk type) and the
    proxy's `: x-toolsentry {…}` summary, if it sent one.

    Raises AssertionError on an `{"error": …}` event or a stream that ends without `[DONE]`.
    """
    chunks: list[dict[str, Any]] = []
    summary: dict[str, Any] | None = None
    done = False
    for line in lines:
        if line.startswith(SUMMARY_PREFIX):
            assert summary is None, "two summary comments in one stream"
            summary = json.loads(line[len(SUMMARY_PREFIX) :])
        elif line.startswith("data:"):
            payload = line[len("data:") :].strip()
            if payload == "[DONE]":
                done = True
                continue
            data = json.loads(payload)
            assert "error" not in data, f"the stream ended with an error event: {data['error']}"
            chunks.append(ChatCompletionChunk.model_validate(data).model_dump())
    assert done, "the stream ended without [DONE]"
    return chunks, summary


def accumulate(chunks: Any) -> tuple[dict[str, Any], str | None]:
    """Fold chat.completion.chunk deltas of choice 0 into one message, as a client does."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            if choice["index"] != 0:
                continue
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            for part in delta.get("tool_calls") or []:
                call = calls.setdefault(
                    part["index"],
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = part.get("id") or call["id"]
                function = part.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    message = {
        "role": "assistant",
        "content": "".join(content),
        "tool_calls": [calls[i] for i in sorted(calls)] or None,
    }
    return message, finish


@dataclass(frozen=True)
class Failure:
    """A failure in what a client received: the channel DESIGN §4 gives it, and the channels a
    proxy may reasonably report it under (a cut-off call is both `truncated` and malformed)."""

    description: str
    channel: str
    accepted: frozenset[str]


def failures(
    received: Received, tools: list[dict[str, Any]], tool_choice: str | dict[str, Any]
) -> list[Failure]:
    """Every failure in what the client received, judged against the request's tools and choice."""
    schemas = {tool["function"]["name"]: tool["function"]["parameters"] for tool in tools}
    forced = tool_choice["function"]["name"] if isinstance(tool_choice, dict) else None
    calls = received.message.get("tool_calls") or []
    content = received.message.get("content") or ""
    cut = {"truncated"} if received.finish_reason == "length" else set()
    found: list[Failure] = []

    def fail(description: str, channel: str, *others: str) -> None:
        found.append(Failure(description, channel, frozenset({channel, *others})))

    for index, call in enumerate(calls):
        name = call["function"]["name"]
        where = f"call {index} ({name!r})"
        if name not in schemas:
            fail(f"{where} names an undeclared tool", "unknown_tool", "tool_choice_violation")
            continue
        if forced is not None and name != forced:
            fail(f"{where} is not the named tool {forced!r}", "tool_choice_violation")
        try:
            arguments = json.loads(call["function"]["arguments"])
        except json.JSONDecodeError:
            fail(f"{where} has arguments that are not JSON", "malformed_arguments", *cut)
            continue
        if not isinstance(arguments, dict):
            fail(f"{where} has arguments that are not an object", "malformed_arguments", *cut)
            continue
        validator = jsonschema.validators.validator_for(schemas[name])(schemas[name])
        if not validator.is_valid(arguments):
            fail(f"{where} breaks the tool's schema", "schema_violation", *cut)
    if tool_choice == "none" and calls:
        fail("tool_choice none, but a call was made", "tool_choice_violation")
    # A call to an undeclared tool that no re-ask repaired is stripped by the proxy's default
    # (on_unrepaired): a message whose only call it was arrives without one, reported under
    # `unknown_tool`.
    stripped = "unknown_tool"
    if (tool_choice == "required" or forced is not None) and not calls:
        fail(
            "a call was required, none was made",
            "tool_choice_violation",
            "empty_response",
            "leaked_tool_call",
            stripped,
            *cut,
        )
    if (written := written_call(content)) is not None:
        fail(
            f"content holds a call written as text ({written!r})",
            "leaked_tool_call",
            "malformed_arguments",
            *cut,
        )
    if not content.strip() and not calls:
        fail(
            "neither content nor tool calls",
            "empty_response",
            "tool_choice_violation",
            stripped,
            *cut,
        )
    return found


def written_call(content: str) -> str | None:
    """The first hermes call the model wrote into `content` as text, or None: a `<tool_call>`
    before a JSON object (what vLLM's hermes parser reads), or a closed `<tool_call>` element
    that opens a line around something. The tag inside a sentence is prose about it, as when a
    small model at temperature 1 echoes its instructions' "<tool_call></tool_call> XML tags"
    (docs/leaks.md: a marker named in prose is not a call)."""
    for start in (m.start() for m in re.finditer(re.escape(HERMES_OPEN), content)):
        rest = content[start + len(HERMES_OPEN) :]
        line = content[content.rfind("\n", 0, start) + 1 : start]
        body, closed, _ = rest.partition("</tool_call>")
        if rest.lstrip().startswith("{") or (not line.strip() and closed and body.strip()):
            return content[start : start + 80]
    return None


def unreported(
    received: Received, tools: list[dict[str, Any]], tool_choice: str | dict[str, Any]
) -> list[str]:
    """The failures the client received that no channel in `x-toolsentry-violations` accounts for."""
    return [
        f"{failure.description} (expected one of {sorted(failure.accepted)} in "
        f"x-toolsentry-violations, got {sorted(received.violations)})"
        for failure in failures(received, tools, tool_choice)
        if not failure.accepted & received.violations
    ]


def counter_values(metrics_text: str, sample_name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample of `sample_name` in a Prometheus exposition, keyed by its sorted labels."""
    values: dict[tuple[tuple[str, str], ...], float] = defaultdict(float)
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == sample_name:
                values[tuple(sorted(sample.labels.items()))] += sample.value
    return values


def labels(**pairs: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(pairs.items()))


# The (tool_choice, stream) pairs every prompt is sent in by the per-channel sweeps.
MODES = [("auto", False), ("required", False), ("named", True), ("auto", True)]
