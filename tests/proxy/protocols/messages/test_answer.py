"""Messages rendering, proven with the real anthropic SDK talking directly to the scripted upstream:
every scripted answer parses and thinking signatures survive (that any stream accumulates to the
plain message: test_answer_streams.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from proxy.protocols.answer import Answer, Usage
from proxy.protocols.messages import answer as wire
from proxy.testing import SSE, Fault, ScriptedUpstream, answer, call, thinking

TOOLS: list[Any] = [
    {
        "name": "Bash",
        "description": "Run a command.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    }
]
ASKED: list[Any] = [{"role": "user", "content": "List the files."}]


@pytest.fixture
def client(scripted: tuple[ScriptedUpstream, str]) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=scripted[1], api_key="x", max_retries=0) as sdk:
        yield sdk


def ask(client: anthropic.Anthropic, **kwargs: Any) -> Any:
    return client.messages.create(model="scripted-model", max_tokens=256, messages=ASKED, **kwargs)


def streamed(client: anthropic.Anthropic, **kwargs: Any) -> tuple[list[Any], Any]:
    with client.messages.stream(
        model="scripted-model", max_tokens=256, messages=ASKED, **kwargs
    ) as stream:
        events = list(stream)
        return events, stream.get_final_message()


def test_text_and_a_call_parse_as_text_and_tool_use_blocks(
    scripted: tuple[ScriptedUpstream, str], client: anthropic.Anthropic
) -> None:
    upstream, _ = scripted
    upstream.rescript(answer("Listing.", call("Bash", {"command": "ls"}, id="toolu_1")))
    got = ask(client, tools=TOOLS, tool_choice={"type": "auto"})
    assert (got.type, got.role, got.model) == ("message", "assistant", "scripted-model")
    text, tool_use = got.content
    assert (text.type, text.text) == ("text", "Listing.")
    assert (tool_use.type, tool_use.id, tool_use.name) == ("tool_use", "toolu_1", "Bash")
    assert tool_use.input == {"command": "ls"}
    assert got.stop_reason == "tool_use"
    assert (got.usage.input_tokens, got.usage.output_tokens) == (10, 5)
    assert upstream.apis[-1] == "messages"
    assert upstream.request_headers[-1]["anthropic-version"]


def test_the_beta_endpoint_query_string_is_recorded(
    scripted: tuple[ScriptedUpstream, str], client: anthropic.Anthropic
) -> None:
    upstream, _ = scripted
    upstream.rescript(answer("Hi"))
    got = client.beta.messages.create(  # Claude Code's TypeScript SDK adds ?beta=true itself
        model="scripted-model",
        max_tokens=8,
        messages=ASKED,
        betas=["claude-code-20250219"],
        extra_query={"beta": "true"},
    )
    assert got.content[0].text == "Hi"  # type: ignore[union-attr]
    assert upstream.queries[-1] == "beta=true"
    assert upstream.request_headers[-1]["anthropic-beta"] == "claude-code-20250219"


def test_thinking_blocks_keep_their_signature_plain_and_streamed(
    scripted: tuple[ScriptedUpstream, str], client: anthropic.Anthropic
) -> None:
    thoughts = [thinking("Plan: run ls.", "sig-Ab3+/="), thinking("opaque==", redacted=True)]
    scripted[0].rescript(answer("Ok.", thoughts=thoughts))
    for got in (ask(client), streamed(client)[1]):
        first, second, text = got.content
        assert (first.type, first.thinking, first.signature) == (
            "thinking",
            "Plan: run ls.",
            "sig-Ab3+/=",
        )
        assert (second.type, second.data) == ("redacted_thinking", "opaque==")
        assert text.text == "Ok."


def test_the_token_limit_inside_a_call_stops_with_max_tokens(
    scripted: tuple[ScriptedUpstream, str], client: anthropic.Anthropic
) -> None:
    scripted[0].rescript(answer(None, call("Bash", '{"command": "l'), finish="length"))
    got = ask(client)
    assert got.stop_reason == "max_tokens"
    assert got.content[0].input == '{"command": "l'  # not JSON: the raw text, as sent
    events, final = streamed(client)
    assert final.stop_reason == "max_tokens"
    sent = "".join(e.partial_json for e in events if e.type == "input_json")
    assert sent == '{"command": "l'
    assert final.content[0].input == {}  # the SDK's partial reading drops the unfinished string


def test_an_empty_answer_is_one_empty_text_block_plain_and_no_block_streamed(
    scripted: tuple[ScriptedUpstream, str], client: anthropic.Anthropic
) -> None:
    scripted[0].rescript(answer())
    got = ask(client)
    assert [(b.type, b.text) for b in got.content] == [("text", "")]
    assert got.stop_reason == "end_turn"
    assert streamed(client)[1].content == []  # as vLLM streams it


def test_a_stream_is_vllms_event_sequence_with_an_optional_ping(
    scripted: tuple[ScriptedUpstream, str], client: anthropic.Anthropic
) -> None:
    scripted[0].rescript(SSE.of(answer("Hi", call("Bash", {"command": "ls"})), ping=True))
    events, final = streamed(client, tools=TOOLS)
    # the SDK adds `text` / `input_json` helper events and swallows the ping
    raw = [e.type for e in events if e.type not in ("text", "input_json")]
    assert raw == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",  # '{"command":"ls"}' in fragments of 4
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert [e.index for e in events if e.type == "content_block_start"] == [0, 1]
    assert final.content[1].input == {"command": "ls"}
    assert final.stop_reason == "tool_use"
    with httpx.Client(base_url=scripted[1]) as http:
        body = http.post("/v1/messages", json={"messages": [], "stream": True}).text
    assert body.startswith("event: message_start\ndata: {")
    assert 'event: ping\ndata: {"type":"ping"}\n\n' in body
    assert "[DONE]" not in body


def test_errors_are_anthropic_shaped_before_and_inside_the_stream(
    scripted: tuple[ScriptedUpstream, str], client: anthropic.Anthropic
) -> None:
    scripted[0].rescript(Fault.error(400, "max_tokens: too large"))
    with pytest.raises(anthropic.BadRequestError, match="too large") as caught:
        ask(client)
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: too large"},
    }
    scripted[0].rescript(Fault.error(529, "busy"))
    with pytest.raises(anthropic.APIStatusError) as overloaded:
        ask(client)
    assert overloaded.value.status_code == 529
    scripted[0].rescript(SSE.of(answer("Hello there"), fail_after=3, fail_message="engine died"))
    with pytest.raises(anthropic.APIStatusError, match="engine died"):
        streamed(client)


def test_a_broken_stream_raises_in_the_sdk(
    scripted: tuple[ScriptedUpstream, str], client: anthropic.Anthropic
) -> None:
    scripted[0].rescript(SSE.of(answer("Hello there"), drop_after=3))
    # this SDK version reads through its own httpx fork, so the error is matched by its text
    with pytest.raises(Exception, match="peer closed connection"):
        streamed(client)


def test_count_tokens_answers_in_vllms_shape(
    scripted: tuple[ScriptedUpstream, str], client: anthropic.Anthropic
) -> None:
    upstream, _ = scripted
    got = client.messages.count_tokens(model="scripted-model", messages=ASKED)
    assert got.input_tokens > 0
    assert upstream.paths[-1] == "/v1/messages/count_tokens"


def test_usage_counts_cached_input_apart_as_vllm_does() -> None:
    reply = Answer("Hi", usage=Usage(100, 4, cached_tokens=60), id="u")
    assert wire.body(reply)["usage"] == {
        "input_tokens": 40,
        "output_tokens": 4,
        "cache_read_input_tokens": 60,
    }
    start, *_, delta, stop = wire.events(reply)
    assert start["message"]["usage"]["output_tokens"] == 0
    assert delta["usage"]["output_tokens"] == 4
    assert stop == {"type": "message_stop"}
    assert orjson.loads(orjson.dumps(wire.error_body("x", 418))) == {
        "type": "error",
        "error": {"type": "api_error", "message": "x"},
    }
