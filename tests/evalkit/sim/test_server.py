"""The simulated upstream over HTTP, through the real openai SDK: streamed and not, marked simulated."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from openai import OpenAI

from evalkit.agent import episode_headers, episode_metadata
from evalkit.domains import get_domain
from evalkit.sim.profiles import builtin_profiles
from evalkit.sim.server import create_sim_app
from proxy.testing import LoopbackServer
from tests.evalkit.sim.builders import (
    OPENING,
    agent_tools,
    assistant_call,
    make_profile,
    messages_request,
    messages_tools,
    responses_request,
    responses_tools,
    tool_answer,
)


@pytest.fixture(scope="module")
def tools() -> list[dict[str, Any]]:
    return agent_tools(get_domain("retail"))


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    profiles = {**builtin_profiles(), "leaky": make_profile("leaky", leaked_tool_call=0.9)}
    app = create_sim_app(get_domain("retail"), profiles, default_profile="int4", seed=3)
    with LoopbackServer(app) as server:
        yield server.url


@pytest.fixture(scope="module")
def client(sim_url: str) -> Iterator[OpenAI]:
    with OpenAI(base_url=f"{sim_url}/v1", api_key="x", max_retries=0) as sdk:
        yield sdk


@pytest.fixture(scope="module")
def claude(sim_url: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=sim_url, api_key="x", max_retries=0) as sdk:
        yield sdk


def ask(client: OpenAI, tools: list[dict[str, Any]], model: str = "sim-bf16", **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model=model,
        messages=OPENING,  # type: ignore[arg-type]
        tools=tools,  # type: ignore[arg-type]
        extra_headers=episode_headers(None, "0", 0, 1),
        **kwargs,
    )


def test_answers_say_they_are_simulated_and_play_the_task(
    client: OpenAI, tools: list[dict[str, Any]]
) -> None:
    completion = ask(client, tools)
    assert completion.model == "sim-bf16"
    assert completion.system_fingerprint == "evalkit-sim-bf16"
    (call,) = completion.choices[0].message.tool_calls or []
    assert call.type == "function"
    assert call.function.name == "find_user_id_by_name_zip"
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 0


def test_an_unknown_model_name_gets_the_default_profile(
    client: OpenAI, tools: list[dict[str, Any]]
) -> None:
    assert ask(client, tools, model="my-model").system_fingerprint == "evalkit-sim-int4"
    names = {m.id for m in client.models.list()}
    assert {"sim-bf16", "sim-fp8", "sim-int4", "sim-leaky"} <= names


def test_the_episode_travels_in_headers_or_in_body_metadata(
    client: OpenAI, tools: list[dict[str, Any]]
) -> None:
    by_header = ask(client, tools, model="sim-int4")
    by_metadata = client.chat.completions.create(
        model="sim-int4",
        messages=OPENING,  # type: ignore[arg-type]
        tools=tools,  # type: ignore[arg-type]
        extra_body={"metadata": episode_metadata("0", 0, 1)},
    )
    assert by_header.choices[0].message == by_metadata.choices[0].message
    assert by_header.id == by_metadata.id


def test_a_request_without_a_task_gets_the_generic_turn_marked_simulated(
    client: OpenAI, claude: anthropic.Anthropic
) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "cancel_pending_order",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "force": {"type": "boolean"}},
                "required": ["order_id"],
            },
        },
    }
    asked = [{"role": "user", "content": "Cancel order #W2378156 please"}]
    called = client.chat.completions.create(model="sim-int4", messages=asked, tools=[tool])  # type: ignore[arg-type,list-item]
    assert called.system_fingerprint == "evalkit-sim-int4"
    (call,) = called.choices[0].message.tool_calls or []
    assert call.function.name == "cancel_pending_order"
    assert json.loads(call.function.arguments) == {"order_id": "#W2378156"}
    answered = [
        *asked,
        called.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "cancelled"},
    ]
    closing = client.chat.completions.create(model="sim-int4", messages=answered, tools=[tool])  # type: ignore[arg-type,list-item]
    assert closing.choices[0].message.content == "Done. The tool answered: cancelled"
    plain = client.chat.completions.create(model="sim-int4", messages=OPENING)  # type: ignore[arg-type]
    assert "x-evalkit-task" in (plain.choices[0].message.content or "")
    # The same turn in the Messages protocol.
    message = claude.messages.create(
        model="sim-int4",
        max_tokens=64,
        messages=[{"role": "user", "content": "Cancel order #W2378156"}],
        tools=[{"name": "cancel_pending_order", "input_schema": tool["function"]["parameters"]}],  # type: ignore[index]
    )
    (use,) = [block for block in message.content if block.type == "tool_use"]
    assert use.input == {"order_id": "#W2378156"}


def test_a_request_naming_an_unknown_task_is_refused(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="no task 'nope'"):
        client.chat.completions.create(
            model="sim-int4",
            messages=OPENING,  # type: ignore[arg-type]
            extra_headers=episode_headers(None, "nope"),
        )


@pytest.mark.parametrize("model", ["sim-bf16", "sim-leaky"], ids=["tool_call", "content"])
def test_a_stream_accumulates_to_the_non_streamed_message(
    client: OpenAI, tools: list[dict[str, Any]], model: str
) -> None:
    whole = ask(client, tools, model=model).choices[0]
    assert bool(whole.message.content) == (model == "sim-leaky")
    content = ""
    calls: dict[int, dict[str, str]] = {}
    finish = None
    usage = None
    for chunk in ask(
        client, tools, model=model, stream=True, stream_options={"include_usage": True}
    ):
        assert chunk.system_fingerprint == f"evalkit-sim-{model[4:]}"
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += delta.id or ""
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
    assert (content or None) == whole.message.content
    expected = [
        {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
        for c in whole.message.tool_calls or []
    ]
    assert [calls[i] for i in sorted(calls)] == expected
    assert finish == whole.finish_reason
    assert usage is not None


def responses_args(
    tools: list[dict[str, Any]], history: list[dict[str, Any]], model: str
) -> dict[str, Any]:
    instructions, items = responses_request(history)
    return {
        "model": model,
        "instructions": instructions,
        "input": items,
        "tools": responses_tools(tools),
        "extra_headers": episode_headers(None, "0", 0, 1),
    }


def messages_args(
    tools: list[dict[str, Any]], history: list[dict[str, Any]], model: str
) -> dict[str, Any]:
    system, messages = messages_request(history)
    return {
        "model": model,
        "system": system or "",
        "messages": messages,
        "max_tokens": 1024,
        "tools": messages_tools(tools),
        "extra_headers": episode_headers(None, "0", 0, 1),
    }


def ask_responses(
    client: OpenAI, tools: list[dict[str, Any]], history: list[dict[str, Any]], model: str
) -> Any:
    return client.responses.create(**responses_args(tools, history, model))


def ask_messages(
    claude: anthropic.Anthropic,
    tools: list[dict[str, Any]],
    history: list[dict[str, Any]],
    model: str,
) -> Any:
    return claude.messages.create(**messages_args(tools, history, model))


def decision_of_chat(completion: Any) -> tuple[Any, ...]:
    message = completion.choices[0].message
    calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]
    return message.content, calls


def decision_of_response(response: Any) -> tuple[Any, ...]:
    calls = [(i.call_id, i.name, i.arguments) for i in response.output if i.type == "function_call"]
    return response.output_text or None, calls


def decision_of_message(message: Any) -> tuple[Any, ...]:
    # the sim writes arguments with json.dumps, so an object's text round-trips exactly
    text = "".join(b.text for b in message.content if b.type == "text") or None
    calls = [
        (b.id, b.name, json.dumps(b.input) if isinstance(b.input, dict) else b.input)
        for b in message.content
        if b.type == "tool_use"
    ]
    return text, calls


BROKEN = "find_user_by_name"  # not a retail tool
HISTORIES = {
    "opening": OPENING,
    # the proxy's corrective re-ask of an unknown tool: the model's second attempt at the turn
    "reask": [
        *OPENING,
        assistant_call(BROKEN, {"first_name": "Yusuf"}, "call_9"),
        tool_answer(
            "call_9",
            f"Error: tool '{BROKEN}' does not exist. Available tools: a, b. Call one of these, "
            "or answer without a tool.",
        ),
    ],
}


@pytest.mark.parametrize("model", ["sim-bf16", "sim-int4", "sim-leaky"])
@pytest.mark.parametrize("history", sorted(HISTORIES))
def test_one_decision_is_rendered_alike_in_every_protocol(
    client: OpenAI,
    claude: anthropic.Anthropic,
    tools: list[dict[str, Any]],
    model: str,
    history: str,
) -> None:
    messages = HISTORIES[history]
    chat = client.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        tools=tools,  # type: ignore[arg-type]
        extra_headers=episode_headers(None, "0", 0, 1),
    )
    response = ask_responses(client, tools, messages, model)
    message = ask_messages(claude, tools, messages, model)
    assert decision_of_response(response) == decision_of_chat(chat)
    assert decision_of_message(message) == decision_of_chat(chat)
    assert response.model == message.model == chat.model == model


def test_responses_and_messages_answers_say_they_are_simulated(
    sim_url: str, client: OpenAI, claude: anthropic.Anthropic, tools: list[dict[str, Any]]
) -> None:
    response = ask_responses(client, tools, OPENING, "sim-fp8")
    assert response.model_extra["system_fingerprint"] == "evalkit-sim-fp8"
    message = ask_messages(claude, tools, OPENING, "sim-fp8")
    assert message.model_extra["system_fingerprint"] == "evalkit-sim-fp8"
    raw = claude.messages.with_raw_response.create(
        model="sim-fp8",
        max_tokens=8,
        messages=[{"role": "user", "content": "Hi"}],
        extra_headers=episode_headers(None, "0", 0, 1),
    )
    assert raw.headers["x-evalkit-simulated"] == "fp8"


def test_errors_take_the_shape_of_the_protocol_asked(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude.messages.create(
            model="sim-int4",
            max_tokens=8,
            messages=[{"role": "user", "content": "Hi"}],
            extra_headers=episode_headers(None, "nope"),
        )
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "domain 'retail' has no task 'nope'"},
    }


@pytest.mark.parametrize("model", ["sim-bf16", "sim-leaky"], ids=["tool_call", "content"])
def test_responses_and_messages_streams_accumulate_to_the_plain_answer(
    client: OpenAI, claude: anthropic.Anthropic, tools: list[dict[str, Any]], model: str
) -> None:
    plain = ask_responses(client, tools, OPENING, model)
    with client.responses.stream(**responses_args(tools, OPENING, model)) as stream:
        final = stream.get_final_response()
    assert decision_of_response(final) == decision_of_response(plain)
    plain_message = ask_messages(claude, tools, OPENING, model)
    with claude.messages.stream(**messages_args(tools, OPENING, model)) as events:
        streamed = events.get_final_message()
    assert decision_of_message(streamed) == decision_of_message(plain_message)
    assert streamed.stop_reason == plain_message.stop_reason
