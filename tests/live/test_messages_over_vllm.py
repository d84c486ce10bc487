"""The Anthropic Messages API through toolsentry in front of a real vLLM (`/v1/messages`).

The same prompts as the chat suite, written as Messages requests (system text as `system`, tool
calls as `tool_use` blocks, tool answers as `tool_result` blocks, tools as `{name, input_schema}`):
every tool call the client receives through the proxy is valid against the request's tools or
named in the proxy's report (headers; for a stream, the summary comment before `message_stop`),
and what is reported is counted in the session and in `/metrics` under `api="messages"`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from typing import Any

import anthropic
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
def client(proxy_url: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=proxy_url, api_key="unused", max_retries=0, timeout=600
    ) as sdk_client:
        yield sdk_client


def messages_request(prompt: Prompt, choice: str, max_tokens: int) -> dict[str, Any]:
    """`prompt` as a Messages request: system text apart, calls and answers as blocks."""
    system, turns = "", list[dict[str, Any]]()
    for message in prompt.messages:
        role = message["role"]
        if role == "system":
            system = message["content"]
            continue
        if role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": message["tool_call_id"],
                "content": message["content"],
            }
            if turns and turns[-1]["role"] == "user" and isinstance(turns[-1]["content"], list):
                turns[-1]["content"].append(block)
            else:
                turns.append({"role": "user", "content": [block]})
            continue
        blocks: list[dict[str, Any]] = []
        if message.get("content"):
            blocks.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or []:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call["id"],
                    "name": call["function"]["name"],
                    "input": json.loads(call["function"]["arguments"] or "{}"),
                }
            )
        turns.append({"role": role, "content": blocks})
    tools = [
        {
            "name": tool["function"]["name"],
            "description": tool["function"].get("description", ""),
            "input_schema": tool["function"]["parameters"],
        }
        for tool in prompt.tools
    ]
    chat_choice = tool_choice_for(prompt, choice)
    tool_choice = (
        {"type": "tool", "name": chat_choice["function"]["name"]}
        if isinstance(chat_choice, dict)
        else {"type": "any" if chat_choice == "required" else chat_choice}
    )
    sampling = {k: v for k, v in prompt.sampling.items() if k in ("top_p", "top_k")}
    return {
        "model": MODEL,
        "system": system,
        "messages": turns,
        "tools": tools,
        "tool_choice": tool_choice,
        "max_tokens": max_tokens,
        # this anthropic SDK has no sampling parameters of its own; vLLM reads them from the body
        "extra_body": {"temperature": 0, **sampling},
    }


def as_received(headers: dict[str, str], message: dict[str, Any], summary: Any) -> Received:
    """What the client got, in the chat-message form the suite's judge reads."""
    texts = [b.get("text") or "" for b in message.get("content") or [] if b.get("type") == "text"]
    calls = [
        {
            "id": b["id"],
            "type": "function",
            "function": {
                "name": b["name"],
                "arguments": b["input"] if isinstance(b["input"], str) else json.dumps(b["input"]),
            },
        }
        for b in message.get("content") or []
        if b.get("type") == "tool_use"
    ]
    stop = message.get("stop_reason")
    finish = "length" if stop == "max_tokens" else ("tool_calls" if calls else "stop")
    chat = {"role": "assistant", "content": "".join(texts), "tool_calls": calls or None}
    return Received(headers, chat, finish, summary=summary)


def send(
    client: anthropic.Anthropic,
    prompt: Prompt,
    choice: str,
    stream: bool,
    session: str,
    max_tokens: int = 96,
) -> Received:
    """Send `prompt` to `/v1/messages` through the proxy with the anthropic SDK."""
    params = messages_request(prompt, choice, max_tokens)
    extra = {"x-session-id": session}
    if not stream:
        raw = client.messages.with_raw_response.create(**params, extra_headers=extra)
        headers = {k.lower(): v for k, v in raw.headers.items()}
        return as_received(headers, raw.parse().model_dump(), None)
    # Read raw, so that the summary comment (which the SDK's decoder skips) is seen too.
    with client.messages.with_streaming_response.create(
        **params, stream=True, extra_headers=extra
    ) as response:
        headers = {k.lower(): v for k, v in response.headers.items()}
        summary, events = None, []
        for line in response.iter_lines():
            if line.startswith(SUMMARY_PREFIX):
                summary = json.loads(line[len(SUMMARY_PREFIX) :])
            elif line.startswith("data:"):
                event = json.loads(line[len("data:") :])
                assert event["type"] != "error", f"the stream ended with an error: {event}"
                if event["type"] == "message_stop":
                    assert summary is not None, "no summary comment before message_stop"
                events.append(event)
    assert events, "the stream carried no event"
    assert events[-1]["type"] == "message_stop", "the stream ended without message_stop"
    return as_received(headers, accumulate(events), summary)


def accumulate(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A Messages stream's events folded into the message they deliver."""
    message = dict(events[0]["message"])
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, str] = {}
    for event in events[1:]:
        if event["type"] == "content_block_start":
            assert event["index"] == len(blocks), "content block indexes are not 0, 1, 2, …"
            blocks[event["index"]] = dict(event["content_block"])
        elif event["type"] == "content_block_delta":
            delta, block = event["delta"], blocks[event["index"]]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif event["type"] == "message_delta":
            message["stop_reason"] = event["delta"].get("stop_reason")
    for index, text in partial.items():
        try:
            blocks[index]["input"] = json.loads(text)
        except json.JSONDecodeError:
            blocks[index]["input"] = text
    message["content"] = [blocks[i] for i in sorted(blocks)]
    return message


@each_turn
def test_every_tool_use_the_messages_client_receives_is_valid_or_reported(
    client: anthropic.Anthropic, proxy_url: str, prompt: Prompt, choice: str, stream: bool
) -> None:
    check_turn(partial(send, client), proxy_url, prompt, choice, stream, api="messages")


def test_messages_per_channel_summary(
    client: anthropic.Anthropic, proxy_url: str, summary: list[str]
) -> None:
    seen, problems = sweep(
        partial(send, client, max_tokens=64),
        proxy_url,
        api="messages",
    )
    summary.append(f"/v1/messages: {len(PROMPTS) * len(MODES)} requests through the proxy")
    summary += [f"  {channel:24} {count:4d} messages" for channel, count in sorted(seen.items())]
    assert problems == []
