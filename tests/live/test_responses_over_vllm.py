"""The Responses API through toolsentry in front of a real vLLM (`/v1/responses`).

The same prompts as the chat suite, written as Responses requests (system message as
`instructions`, history as input items, tools flat): every function call the client receives
through the proxy is valid against the request's tools or named in the proxy's report (headers;
for a stream, the summary comment before `response.completed`), and what is reported is counted in
the session and in `/metrics` under `api="responses"`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from typing import Any

import openai
import pytest

from scripts.live_requests import (
    MODEL,
    MODES,
    PROMPTS,
    SUMMARY_PREFIX,
    Prompt,
    Received,
    tool_choice_for,
)
from tests.live.scenarios import (
    check_turn,
    each_turn,
    sweep,
)

pytestmark = pytest.mark.vllm


@pytest.fixture
def client(proxy_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0, timeout=600
    ) as sdk_client:
        yield sdk_client


def responses_request(prompt: Prompt, choice: str, max_tokens: int) -> dict[str, Any]:
    """`prompt` as a Responses request: system text as instructions, turns as input items."""
    instructions = ""
    items: list[dict[str, Any]] = []
    for message in prompt.messages:
        role = message["role"]
        if role == "system":
            instructions = message["content"]
        elif role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": message["content"],
                }
            )
        else:
            if message.get("content"):
                items.append({"type": "message", "role": role, "content": message["content"]})
            for call in message.get("tool_calls") or []:
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": call["function"]["name"],
                        "arguments": call["function"]["arguments"],
                    }
                )
    tools = [{"type": "function", **tool["function"]} for tool in prompt.tools]
    chat_choice = tool_choice_for(prompt, choice)
    tool_choice = (
        {"type": "function", "name": chat_choice["function"]["name"]}
        if isinstance(chat_choice, dict)
        else chat_choice
    )
    return {
        "model": MODEL,
        "instructions": instructions,
        "input": items,
        "tools": tools,
        "tool_choice": tool_choice,
        "max_output_tokens": max_tokens,
        "temperature": 0,
        **{k: v for k, v in prompt.sampling.items() if k != "seed"},
    }


def as_received(headers: dict[str, str], response: dict[str, Any], summary: Any) -> Received:
    """What the client got, in the chat-message form the suite's judge reads."""
    texts, calls = [], []
    for item in response.get("output") or []:
        if item.get("type") == "message":
            texts += [
                p.get("text") or ""
                for p in item.get("content") or []
                if p.get("type") == "output_text"
            ]
        elif item.get("type") == "function_call":
            calls.append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]},
                }
            )
    details = response.get("incomplete_details") or {}
    cut = response.get("status") == "incomplete" and details.get("reason") == "max_output_tokens"
    finish = "length" if cut else ("tool_calls" if calls else "stop")
    message = {"role": "assistant", "content": "".join(texts), "tool_calls": calls or None}
    return Received(headers, message, finish, summary=summary)


def send(
    client: openai.OpenAI,
    prompt: Prompt,
    choice: str,
    stream: bool,
    session: str,
    max_tokens: int = 96,
) -> Received:
    """Send `prompt` to `/v1/responses` through the proxy with the openai SDK."""
    params = responses_request(prompt, choice, max_tokens)
    extra = {"x-session-id": session}
    if not stream:
        raw = client.responses.with_raw_response.create(**params, extra_headers=extra)
        headers = {k.lower(): v for k, v in raw.headers.items()}
        return as_received(headers, raw.parse().model_dump(), None)
    # Read raw, so that the summary comment (which the SDK's decoder skips) is seen too.
    with client.responses.with_streaming_response.create(
        **params, stream=True, extra_headers=extra
    ) as response:
        headers = {k.lower(): v for k, v in response.headers.items()}
        summary, final, numbers = None, None, []
        for line in response.iter_lines():
            if line.startswith(SUMMARY_PREFIX):
                summary = json.loads(line[len(SUMMARY_PREFIX) :])
            elif line.startswith("data:"):
                event = json.loads(line[len("data:") :])
                numbers.append(event["sequence_number"])
                assert event["type"] != "error", f"the stream ended with an error: {event}"
                if event["type"] in ("response.completed", "response.incomplete"):
                    assert summary is not None, "no summary comment before the terminal event"
                    final = event["response"]
    assert final is not None, "the stream ended without response.completed"
    assert numbers == list(range(len(numbers))), "sequence numbers are not 0, 1, 2, …"
    return as_received(headers, final, summary)


@each_turn
def test_every_function_call_the_responses_client_receives_is_valid_or_reported(
    client: openai.OpenAI, proxy_url: str, prompt: Prompt, choice: str, stream: bool
) -> None:
    check_turn(partial(send, client), proxy_url, prompt, choice, stream, api="responses")


def test_responses_per_channel_summary(
    client: openai.OpenAI, proxy_url: str, summary: list[str]
) -> None:
    seen, problems = sweep(
        partial(send, client, max_tokens=64),
        proxy_url,
        api="responses",
    )
    summary.append(f"/v1/responses: {len(PROMPTS) * len(MODES)} requests through the proxy")
    summary += [f"  {channel:24} {count:4d} responses" for channel, count in sorted(seen.items())]
    assert problems == []
