"""Both SDKs' streams, proven against the plain answer: whatever the scripted upstream answers,
streamed in fragments of any size, the real anthropic and openai SDKs accumulate the stream to
what the plain answer says."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.protocols.answer import Answer
from proxy.testing import SSE, ScriptedUpstream
from tests.proxy.protocols.messages import test_answer as messages
from tests.proxy.protocols.responses import test_answer as responses
from tests.proxy.protocols.strategies import answers, fragments, json_objects


@dataclass(frozen=True)
class Wire:
    """A protocol as its SDK sees it: the answers generated for it, an SDK client on the
    upstream's root URL, and the plain and the streamed answer each folded to what must agree."""

    answers: st.SearchStrategy[Answer]
    client: Callable[[str], AbstractContextManager[Any]]
    plain: Callable[[Any], Any]
    streamed: Callable[[Any], Any]


EMPTY_TEXT = {"type": "text", "text": "", "citations": None}


def messages_plain(client: anthropic.Anthropic) -> Any:
    plain = messages.ask(client).model_dump()
    plain["content"] = [block for block in plain["content"] if block != EMPTY_TEXT]
    return plain


def messages_streamed(client: anthropic.Anthropic) -> Any:
    return messages.streamed(client)[1].model_dump()


RESPONSES_DELTAS = (
    "response.output_text.delta",
    "response.function_call_arguments.delta",
    "response.reasoning_text.delta",
)


def text_of(item: Any) -> str:
    if item.type == "function_call":
        return str(item.arguments)
    return "".join(part.text for part in item.content)


def comparable(got: Any) -> Any:
    body = got.model_dump(exclude_none=True)
    for item in body["output"]:
        if item["type"] == "reasoning":
            item.pop("status", None)  # vLLM: none in a plain body, `completed` once streamed
    return body


def responses_plain(client: openai.OpenAI) -> Any:
    plain = responses.ask(client)
    return [text_of(item) for item in plain.output], comparable(plain), plain.usage


def responses_streamed(client: openai.OpenAI) -> Any:
    events, final = responses.streamed(client)
    # what the deltas add up to, item by item, as the SDK hands them out
    built: dict[int, dict[str, Any]] = {}
    for event in events:
        if event.type == "response.output_item.added":
            built[event.output_index] = {"item": event.item.type, "text": ""}
        elif event.type in RESPONSES_DELTAS:
            built[event.output_index]["text"] += event.delta
    return [b["text"] for _, b in sorted(built.items())], comparable(final), final.usage


WIRES = {
    "messages": Wire(
        answers(["Bash", "Read", "Edit"], json_objects, thoughts=2),
        lambda url: anthropic.Anthropic(base_url=url, api_key="x", max_retries=0),
        messages_plain,
        messages_streamed,
    ),
    "responses": Wire(
        # a Responses call carries its arguments as text, JSON or not
        answers(
            ["get_order", "cancel_order", "refund"],
            json_objects.map(lambda d: orjson.dumps(d).decode()) | st.text(max_size=12),
            thoughts=1,
        ),
        lambda url: openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0),
        responses_plain,
        responses_streamed,
    ),
}


@pytest.fixture(params=sorted(WIRES))
def sdk(
    request: pytest.FixtureRequest, scripted: tuple[ScriptedUpstream, str]
) -> Iterator[tuple[Wire, Any]]:
    """A protocol, and its SDK's client on the scripted upstream."""
    wire = WIRES[request.param]
    with wire.client(scripted[1]) as client:
        yield wire, client


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), fragment=fragments)
def test_a_stream_accumulates_in_the_sdk_to_the_plain_answer(
    scripted: tuple[ScriptedUpstream, str],
    sdk: tuple[Wire, Any],
    data: st.DataObject,
    fragment: int,
) -> None:
    wire, client = sdk
    reply = data.draw(wire.answers, label="reply")
    scripted[0].rescript(SSE.of(reply, fragment=fragment))
    plain = wire.plain(client)
    assert wire.streamed(client) == plain
