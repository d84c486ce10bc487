"""The simulated upstream over HTTP, through the real openai SDK: streamed and not, marked simulated."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI

from evalkit.agent import episode_headers, episode_metadata
from evalkit.domains import get_domain
from evalkit.sim.profiles import builtin_profiles
from evalkit.sim.server import create_sim_app
from proxy.testing import LoopbackServer
from tests.evalkit.sim.builders import OPENING, agent_tools, make_profile


@pytest.fixture(scope="module")
def tools() -> list[dict[str, Any]]:
    return agent_tools(get_domain("retail"))


@pytest.fixture(scope="module")
def client() -> Iterator[OpenAI]:
    profiles = {**builtin_profiles(), "leaky": make_profile("leaky", leaked_tool_call=0.9)}
    app = create_sim_app(get_domain("retail"), profiles, default_profile="int4", seed=3)
    with (
        LoopbackServer(app) as server,
        OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0) as sdk,
    ):
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


def test_a_request_without_a_task_or_with_an_unknown_one_is_refused(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="x-evalkit-task"):
        client.chat.completions.create(model="sim-int4", messages=OPENING)  # type: ignore[arg-type]
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
