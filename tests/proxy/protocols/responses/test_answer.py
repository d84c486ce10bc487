"""Responses rendering, proven with the real openai SDK talking directly to the scripted upstream:
every scripted answer parses (that any stream accumulates to the plain answer: test_answer_streams.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest

from proxy.protocols.answer import Answer
from proxy.protocols.responses import answer as wire
from proxy.testing import SSE, Fault, ScriptedUpstream, answer, call, thinking

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_order",
        "description": "Look an order up.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
    }
]


@pytest.fixture
def client(scripted: tuple[ScriptedUpstream, str]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{scripted[1]}/v1", api_key="x", max_retries=0) as sdk:
        yield sdk


def ask(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.responses.create(model="scripted-model", input="Where is my order?", **kwargs)


def streamed(client: openai.OpenAI, **kwargs: Any) -> tuple[list[Any], Any]:
    with client.responses.stream(
        model="scripted-model", input="Where is my order?", **kwargs
    ) as stream:
        events = list(stream)
        return events, stream.get_final_response()


def test_text_and_calls_parse_as_message_and_function_call_items(
    scripted: tuple[ScriptedUpstream, str], client: openai.OpenAI
) -> None:
    upstream, _ = scripted
    upstream.rescript(answer("Let me look.", call("get_order", {"order_id": "W1"}, id="call_1")))
    got = ask(client, tools=TOOLS, tool_choice="auto", instructions="Be brief.")
    assert got.object == "response"
    assert got.status == "completed"
    assert got.incomplete_details is None
    assert got.output_text == "Let me look."
    message, function_call = got.output
    assert message.type == "message"
    assert message.role == "assistant"
    assert function_call.type == "function_call"
    assert function_call.call_id == "call_1"
    assert function_call.name == "get_order"
    assert orjson.loads(function_call.arguments) == {"order_id": "W1"}
    assert function_call.status == "completed"
    assert got.usage.input_tokens == 10
    assert got.usage.output_tokens == 5
    assert got.usage.total_tokens == 15
    assert got.usage.input_tokens_details.cached_tokens == 0
    assert got.usage.output_tokens_details.reasoning_tokens == 0
    # vLLM echoes the request's settings
    assert got.instructions == "Be brief."
    assert got.tools[0].name == "get_order"
    assert got.tool_choice == "auto"
    assert upstream.apis[-1] == "responses"
    assert upstream.requests[-1]["input"] == "Where is my order?"


def test_a_call_cut_by_the_token_limit_is_an_incomplete_response(
    scripted: tuple[ScriptedUpstream, str], client: openai.OpenAI
) -> None:
    scripted[0].rescript(answer(None, call("get_order", '{"order_id": "W'), finish="length"))
    for got in (ask(client), streamed(client)[1]):
        assert got.status == "incomplete"
        assert got.incomplete_details.reason == "max_output_tokens"
        assert got.output[0].arguments == '{"order_id": "W'


def test_an_empty_answer_has_no_output_items_and_a_leaked_call_stays_text(
    scripted: tuple[ScriptedUpstream, str], client: openai.OpenAI
) -> None:
    scripted[0].rescript(answer())
    assert ask(client).output == []
    assert streamed(client)[1].output == []
    leaked = '<tool_call>\n{"name": "get_order", "arguments": {}}\n</tool_call>'
    scripted[0].rescript(answer(leaked))
    assert ask(client).output_text == leaked


def test_a_stream_is_vllms_event_sequence_numbered_from_zero(
    scripted: tuple[ScriptedUpstream, str], client: openai.OpenAI
) -> None:
    scripted[0].rescript(
        SSE.of(answer("Hi there", call("get_order", {"order_id": "W1"})), fragment=3)
    )
    events, final = streamed(client, tools=TOOLS)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds.count("response.output_text.delta") == 3
    text_end = kinds.index("response.output_text.done")
    assert kinds[text_end : text_end + 4] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
    ]
    assert kinds.count("response.function_call_arguments.delta") == 6  # 17 characters
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.output[1].arguments == '{"order_id":"W1"}'


def test_raw_stream_events_are_named_after_their_type(
    scripted: tuple[ScriptedUpstream, str],
) -> None:
    upstream, url = scripted
    upstream.rescript(answer("Hi"))
    with httpx.Client(base_url=url) as http:
        raw = http.post("/v1/responses", json={"input": "x", "stream": True}).content
    blocks = raw.decode().split("\n\n")
    assert blocks[0].startswith("event: response.created\ndata: {")
    assert b"[DONE]" not in raw  # vLLM ends a Responses stream with response.completed


def test_reasoning_is_an_item_before_the_message(
    scripted: tuple[ScriptedUpstream, str], client: openai.OpenAI
) -> None:
    scripted[0].rescript(answer("Done.", thoughts=[thinking("The user wants an order.")]))
    got = ask(client)
    reasoning, message = got.output
    assert reasoning.type == "reasoning"
    assert reasoning.content[0].text == "The user wants an order."
    assert message.content[0].text == "Done."
    _, final = streamed(client)
    assert final.output[0].content[0].text == "The user wants an order."


def test_a_namespaced_call_names_its_function_and_namespace_apart(
    scripted: tuple[ScriptedUpstream, str], client: openai.OpenAI
) -> None:
    scripted[0].rescript(answer(None, call("spawn_agent", {}, namespace="multi_agent_v1")))
    (item,) = ask(client).output
    assert (item.name, item.namespace) == ("spawn_agent", "multi_agent_v1")


def test_errors_are_openai_shaped_before_the_stream_and_an_error_event_inside_it(
    scripted: tuple[ScriptedUpstream, str], client: openai.OpenAI
) -> None:
    scripted[0].rescript(Fault.error(400, "max_output_tokens is too large"))
    with pytest.raises(openai.BadRequestError, match="max_output_tokens is too large") as caught:
        ask(client)
    assert caught.value.body["type"] == "BadRequestError"  # type: ignore[index]
    scripted[0].rescript(SSE.of(answer("Hello there"), fail_after=3, fail_message="engine died"))
    with client.responses.create(model="scripted-model", input="x", stream=True) as events:  # type: ignore[call-overload]
        kinds = [(e.type, getattr(e, "message", None)) for e in events]
    assert kinds[-1] == ("error", "engine died")
    assert len(kinds) == 4


def test_a_broken_stream_raises_in_the_sdk(
    scripted: tuple[ScriptedUpstream, str], client: openai.OpenAI
) -> None:
    scripted[0].rescript(SSE.of(answer("Hello there"), drop_after=3))
    with pytest.raises(openai.APIError):
        streamed(client)


def test_a_rendered_body_is_what_the_stream_completes_with() -> None:
    reply = Answer("Hi", (call("get_order", "{}"),), id="a", created=5)
    completed = wire.events(reply)[-1]
    assert completed["type"] == "response.completed"
    assert completed["response"] == wire.body(reply, streamed=True)
