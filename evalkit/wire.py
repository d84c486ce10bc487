"""The agent's three wire protocols: one agent turn asked over Chat Completions, the Responses API
or the Anthropic Messages API, and the answer read back as the same `AssistantMessage`.

`evalkit.agent.LLMAgent` builds one protocol-neutral `AgentTurn` (system prompt, the agent's view
of the episode, the domain's tools in Chat Completions' shape, headers, body metadata); a wire
writes it in its protocol with the protocol's real SDK (`openai` for chat and Responses,
`anthropic` for Messages), sends it, and reads the answer: text, tool calls, a finish reason in
chat's words (`stop`, `tool_calls`, `length`), token counts, and the `x-toolsentry-*` headers.

What each protocol writes in its own way:

    chat       system message; assistant `tool_calls`; `role: tool` answers (an error is text
               starting with `Error`); tools `{type: function, function: {...}}`
    responses  `instructions`; `function_call` / `function_call_output` items (an error is
               output text starting with `Error`); flat function tools; `store: false`
    messages   `system`; `tool_use` blocks; a user turn of `tool_result` blocks, `is_error: true`
               on an environment error; tools `{name, description, input_schema}`

An answer's `raw_data` is the chat choice it amounts to (what `evalkit.analysis` reads) and the
protocol under `api`; a Responses or Messages answer's own body is kept beside it under `body`,
so every protocol's results read the same way. Endpoint failures become `EndpointError` with the
status, the error type and the error's own message, the proxy's `error_budget_exhausted` refusal
(429, 400 on the Responses API) included (the SDKs do not retry it: the proxy says
`x-should-retry: false`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import anthropic
import openai
from openai import AsyncOpenAI

from evalkit.agent import (
    AgentTurn,
    AgentWire,
    arguments_text,
    endpoint_error,
    make_client,
    parse_tool_call,
    status_error,
    to_openai_messages,
)
from evalkit.errors import AgentError, EndpointError
from evalkit.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage, now_iso
from proxy.headers import HEADER_PREFIX

ApiName = Literal["chat", "responses", "messages"]
API_NAMES: Final[tuple[ApiName, ...]] = ("chat", "responses", "messages")
API_TITLES: Final[dict[str, str]] = {
    "chat": "Chat Completions",
    "responses": "the Responses API",
    "messages": "the Anthropic Messages API",
}
"""How the protocols are named in sentences."""
MESSAGES_MAX_TOKENS: Final = 4096
"""`max_tokens` of a Messages request (the protocol requires one; chat and Responses send none)."""


# -- the conversation in each protocol --------------------------------------------------------


def responses_input(history: Sequence[Any]) -> list[dict[str, Any]]:
    """The conversation as Responses `input` items: messages, `function_call` items and their
    `function_call_output`s (an environment error is output text starting with `Error`)."""
    out: list[dict[str, Any]] = []
    for m in history:
        if isinstance(m, AssistantMessage):
            # An assistant turn with calls and no text is its calls alone, as a model writes it.
            if m.content is not None or not m.tool_calls:
                out.append({"type": "message", "role": "assistant", "content": m.content or ""})
            out += [
                {
                    "type": "function_call",
                    "call_id": c.id,
                    "name": c.name,
                    "arguments": arguments_text(c),
                }
                for c in m.tool_calls or []
            ]
        elif isinstance(m, UserMessage):
            out.append({"type": "message", "role": "user", "content": m.content or ""})
        elif isinstance(m, ToolMessage):
            out.append({"type": "function_call_output", "call_id": m.id, "output": m.content or ""})
    return out


def messages_turns(history: Sequence[Any]) -> list[dict[str, Any]]:
    """The conversation as Messages turns: assistant turns of `text` and `tool_use` blocks, user
    turns of `text` and `tool_result` blocks (`is_error: true` on an environment error); the
    answers to one assistant turn's calls share one user turn."""
    out: list[dict[str, Any]] = []
    for m in history:
        if isinstance(m, AssistantMessage):
            blocks: list[dict[str, Any]] = []
            if m.content:
                blocks.append({"type": "text", "text": m.content})
            blocks += [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": tool_input(c)}
                for c in m.tool_calls or []
            ]
            out.append({"role": "assistant", "content": blocks})
            continue
        if isinstance(m, UserMessage):
            block: dict[str, Any] = {"type": "text", "text": m.content or ""}
        elif isinstance(m, ToolMessage):
            block = {
                "type": "tool_result",
                "tool_use_id": m.id,
                "content": m.content or "",
                "is_error": m.error,
            }
        else:
            continue
        if out and out[-1]["role"] == "user":
            out[-1]["content"].append(block)
        else:
            out.append({"role": "user", "content": [block]})
    return out


def tool_input(call: ToolCall) -> Any:
    """A call's `tool_use` input: its arguments, or its raw text when that was not a JSON object
    (so a malformed call goes back as it came)."""
    return call.raw_arguments if call.raw_arguments is not None else call.arguments


def responses_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat function tools as Responses function tools (`{type, name, description, parameters}`)."""
    out = []
    for tool in tools:
        function = tool["function"]
        out.append(
            {
                "type": "function",
                "name": function["name"],
                "description": function.get("description", ""),
                "parameters": function.get("parameters", {}),
                "strict": False,
            }
        )
    return out


def messages_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat function tools as Messages tools (`{name, description, input_schema}`)."""
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            "input_schema": t["function"].get("parameters", {}),
        }
        for t in tools
    ]


# -- the answer in each protocol -------------------------------------------------------------


@dataclass(frozen=True)
class _Read:
    """An answer as chat would have said it."""

    content: str | None
    calls: list[tuple[str, str, str]]  # (id, name, arguments text)
    finish_reason: str | None
    usage: dict[str, Any] | None


def read_responses(body: Mapping[str, Any]) -> _Read:
    """A Responses answer: its `output_text` parts joined, its `function_call` items, `length`
    when it is incomplete for `max_output_tokens`."""
    texts: list[str] = []
    calls = []
    for item in body.get("output") or []:
        if item.get("type") == "message":
            texts += [
                p.get("text", "")
                for p in item.get("content") or []
                if p.get("type") == "output_text"
            ]
        elif item.get("type") == "function_call":
            calls.append(
                (item.get("call_id", ""), item.get("name", ""), item.get("arguments") or "")
            )
    incomplete = body.get("incomplete_details") or {}
    if body.get("status") == "incomplete" and incomplete.get("reason") == "max_output_tokens":
        finish = "length"
    else:
        finish = "tool_calls" if calls else "stop"
    return _Read("".join(texts) if texts else None, calls, finish, _counts(body.get("usage")))


_STOP_REASONS: Final = {"tool_use": "tool_calls", "max_tokens": "length"}


def read_messages(body: Mapping[str, Any]) -> _Read:
    """A Messages answer: its `text` blocks joined, its `tool_use` blocks (an `input` that is not
    an object kept as its text), `stop_reason` in chat's words."""
    texts: list[str] = []
    calls = []
    for block in body.get("content") or []:
        if block.get("type") == "text":
            texts.append(block.get("text", ""))
        elif block.get("type") == "tool_use":
            given = block.get("input")
            arguments = given if isinstance(given, str) else json.dumps(given)
            calls.append((block.get("id", ""), block.get("name", ""), arguments))
    stop = body.get("stop_reason")
    finish = _STOP_REASONS.get(stop, "stop") if isinstance(stop, str) else None
    return _Read("".join(texts) if texts else None, calls, finish, _counts(body.get("usage")))


def _counts(usage: object) -> dict[str, Any] | None:
    """Responses' and Messages' `input_tokens` / `output_tokens` in chat's names."""
    if not isinstance(usage, dict):
        return None
    return {
        "completion_tokens": usage.get("output_tokens"),
        "prompt_tokens": usage.get("input_tokens"),
    }


def _message(
    api: ApiName, read: _Read, body: Mapping[str, Any], headers: Mapping[str, str]
) -> AssistantMessage:
    calls = [parse_tool_call(i, n, a) for i, n, a in read.calls]
    choice_message: dict[str, Any] = {"role": "assistant", "content": read.content}
    if read.calls:
        choice_message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in read.calls
        ]
    raw = {"index": 0, "finish_reason": read.finish_reason, "message": choice_message}
    return AssistantMessage(
        content=read.content,
        tool_calls=calls or None,
        timestamp=now_iso(),
        usage=read.usage,
        raw_data={**raw, "api": api, "body": dict(body)},
        proxy_headers=proxy_headers(headers),
    )


def proxy_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The proxy's `x-toolsentry-*` headers of an answer, names lower-cased."""
    return {k.lower(): v for k, v in headers.items() if k.lower().startswith(HEADER_PREFIX)}


# -- the clients ------------------------------------------------------------------------------


class ChatWire:
    """Chat Completions (`POST {base}/chat/completions`) with the `openai` SDK."""

    api: ApiName = "chat"

    def __init__(self, client: AsyncOpenAI) -> None:
        self.client = client

    async def send(self, turn: AgentTurn) -> AssistantMessage:
        extra_body = {"metadata": dict(turn.metadata)} if turn.metadata is not None else None
        try:
            raw = await self.client.chat.completions.with_raw_response.create(
                model=turn.model,
                messages=to_openai_messages(turn.system, turn.history),  # type: ignore[arg-type]
                tools=list(turn.tools),  # type: ignore[arg-type]
                extra_headers=dict(turn.headers),
                extra_body=extra_body,
                **turn.options,
            )
        except openai.OpenAIError as exc:
            raise endpoint_error(exc, "agent") from exc
        completion = raw.parse()
        if not completion.choices:
            raise AgentError("the agent's endpoint returned no choices")
        choice = completion.choices[0]
        calls = [
            parse_tool_call(c.id, c.function.name, c.function.arguments)
            for c in (choice.message.tool_calls or [])
            if c.type == "function"
        ]
        usage = None
        if completion.usage is not None:
            usage = {
                "completion_tokens": completion.usage.completion_tokens,
                "prompt_tokens": completion.usage.prompt_tokens,
            }
        return AssistantMessage(
            content=choice.message.content,
            tool_calls=calls or None,
            timestamp=now_iso(),
            usage=usage,
            raw_data={**choice.model_dump(mode="json"), "api": self.api},
            proxy_headers=proxy_headers(raw.headers),
        )

    async def close(self) -> None:
        await self.client.close()


class ResponsesWire:
    """The Responses API (`POST {base}/responses`) with the `openai` SDK; the whole conversation
    goes with every request (`store: false`), as a stateless client sends it."""

    api: ApiName = "responses"

    def __init__(self, client: AsyncOpenAI) -> None:
        self.client = client

    async def send(self, turn: AgentTurn) -> AssistantMessage:
        optional: dict[str, Any] = {}
        if turn.system is not None:
            optional["instructions"] = turn.system
        if turn.metadata is not None:
            optional["metadata"] = dict(turn.metadata)
        try:
            raw = await self.client.responses.with_raw_response.create(
                model=turn.model,
                input=responses_input(turn.history),  # type: ignore[arg-type]
                tools=responses_tools(turn.tools),  # type: ignore[arg-type]
                store=False,
                extra_headers=dict(turn.headers),
                **optional,
                **turn.options,
            )
        except openai.OpenAIError as exc:
            raise endpoint_error(exc, "agent") from exc
        body = raw.parse().model_dump(mode="json")
        return _message(self.api, read_responses(body), body, raw.headers)

    async def close(self) -> None:
        await self.client.close()


class MessagesWire:
    """The Anthropic Messages API (`POST {root}/v1/messages`) with the `anthropic` SDK."""

    api: ApiName = "messages"

    def __init__(self, client: anthropic.AsyncAnthropic) -> None:
        self.client = client

    async def send(self, turn: AgentTurn) -> AssistantMessage:
        optional: dict[str, Any] = {}
        if turn.system is not None:
            optional["system"] = turn.system
        # Anthropic's `metadata` holds only `user_id`, and this SDK takes no sampling arguments
        # (`temperature`, …): the episode's keys and the options go in as extra body.
        extra_body: dict[str, Any] = dict(turn.options)
        if turn.metadata is not None:
            extra_body["metadata"] = dict(turn.metadata)
        try:
            raw = await self.client.messages.with_raw_response.create(
                model=turn.model,
                max_tokens=MESSAGES_MAX_TOKENS,
                messages=messages_turns(turn.history),  # type: ignore[arg-type]
                tools=messages_tools(turn.tools),  # type: ignore[arg-type]
                extra_headers=dict(turn.headers),
                extra_body=extra_body,
                **optional,
            )
        except anthropic.APIStatusError as exc:
            raise status_error("agent", exc.status_code, exc.message, exc.body) from exc
        except anthropic.AnthropicError as exc:
            raise EndpointError(f"agent endpoint failed: {exc}") from exc
        # The answer as the server wrote it: a malformed call's `input` is text there, which the
        # SDK's typed Message cannot re-serialize without a warning (and would not keep as sent).
        body = await raw.json()
        if not isinstance(body, dict):
            raise EndpointError("agent endpoint answered a Messages request with no JSON object")
        return _message(self.api, read_messages(body), body, raw.headers)

    async def close(self) -> None:
        await self.client.close()


def agent_wire(
    api: ApiName, base_url: str, *, api_key: str = "EMPTY", max_retries: int = 2
) -> AgentWire:
    """The wire of `api` on the OpenAI-style base URL `base_url` (`http://host:port/v1`); the
    Messages client is rooted where the base URL's `/v1` starts, as the anthropic SDK appends
    `/v1/messages` itself.

    Raises:
        ValueError: for an api that is not one of `API_NAMES`.
    """
    if api == "chat":
        return ChatWire(make_client(base_url, api_key=api_key, max_retries=max_retries))
    if api == "responses":
        return ResponsesWire(make_client(base_url, api_key=api_key, max_retries=max_retries))
    if api == "messages":
        root = base_url.rstrip("/").removesuffix("/v1")
        client = anthropic.AsyncAnthropic(
            base_url=root, api_key=api_key, max_retries=max_retries, timeout=120.0
        )
        return MessagesWire(client)
    raise ValueError(f"api must be one of {', '.join(API_NAMES)}, got {api!r}")
