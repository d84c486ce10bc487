"""End to end: an upstream that writes its call as text, in vLLM's formats, in the answer or in
the reasoning (chat's `reasoning`, a Responses `reasoning` item, an Anthropic `thinking` block);
the proxy re-asks and the client (the real openai and anthropic SDKs), plain or streamed, gets a
parsed call."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.testing import answer, call, completion, thinking, tool_call
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.metrics_text import metric
from tests.proxy.pipeline.test_messages import args as messages_args
from tests.proxy.pipeline.test_messages import claude
from tests.proxy.pipeline.test_responses import function_calls
from tests.proxy.pipeline.test_responses import make_request as responses_request
from tests.proxy.pipeline.test_stream import plain_chat, stream_chat

ORDER = {"order_id": "#W1"}
ORDER_TOOL = {
    "name": "get_order_details",
    "description": "Look an order up.",
    "input_schema": {
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
    },
}

# The same call, as models served by vLLM write it when their parser misses it.
LEAKED: dict[str, str] = {
    "hermes": '<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>',
    "kimi_k2": (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_order_details:0"
        '<|tool_call_argument_begin|>{"order_id": "#W1"}<|tool_call_end|><|tool_calls_section_end|>'
    ),
    "deepseek_v31": (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_order_details<｜tool▁sep｜>"
        '{"order_id": "#W1"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    ),
    "glm45": (
        "<tool_call>get_order_details\n<arg_key>order_id</arg_key>\n<arg_value>#W1</arg_value>\n"
        "</tool_call>"
    ),
    "minimax": (
        '<minimax:tool_call>\n<invoke name="get_order_details">\n'
        '<parameter name="order_id">#W1</parameter>\n</invoke>\n</minimax:tool_call>'
    ),
    "harmony": (
        "<|channel|>commentary to=functions.get_order_details <|constrain|>json<|message|>"
        '{"order_id": "#W1"}<|call|>'
    ),
    "gemma4": '<|tool_call>call:get_order_details{order_id:<|"|>#W1<|"|>}<tool_call|>',
    "pythonic": '[get_order_details(order_id="#W1")]',
}
IN_REASONING = ["hermes", "kimi_k2", "minimax", "gemma4"]


def leaking(fmt: str, *, where: str) -> dict[str, Any]:
    text = LEAKED[fmt]
    if where == "content":
        # A bare format (pythonic) is a call only as the whole answer.
        return completion(text if fmt == "pythonic" else "Let me look that up.\n" + text)
    reply = completion(None)
    reply["choices"][0]["message"]["reasoning"] = "I need the order first.\n" + text
    return reply


def push_leak_then_call(upstream: RunningUpstream, fmt: str, where: str) -> None:
    upstream.script.push(
        leaking(fmt, where=where),
        completion(tool_calls=[tool_call("get_order_details", ORDER)]),
    )


def assert_reasked_about_the_leak(
    proxy: RunningProxy, upstream: RunningUpstream, fmt: str, where: str
) -> None:
    reask = upstream.script.requests[1]["messages"]
    assert reask[-1]["role"] == "user"
    assert_corrects_the_leak(reask[-1]["content"], where)
    assert_counted(proxy, fmt, where, "chat")


def assert_corrects_the_leak(text: str, where: str) -> None:
    assert "get_order_details" in text
    assert "tool call" in text
    assert ("in your reasoning" in text) == (where == "reasoning")


def assert_counted(proxy: RunningProxy, fmt: str, where: str, api: str) -> None:
    """One leaked call of `fmt`, counted by where and api, and in the unknown-tools stats."""
    labels = {"model": "scripted-model", "format": fmt, "where": where}
    assert metric(proxy.metrics(), "toolsentry_leaked_calls_total", **labels, api=api) == 1
    with proxy.http() as http:
        stats = http.get("/v1/stats/unknown-tools").json()
    assert stats["leaked_formats"]["scripted-model"] == [{"format": fmt, "count": 1}]


CASES = [(fmt, "content") for fmt in LEAKED] + [(fmt, "reasoning") for fmt in IN_REASONING]


@pytest.mark.parametrize(("fmt", "where"), CASES)
def test_a_call_leaked_as_text_is_reasked_and_the_client_receives_the_parsed_call(
    proxy: RunningProxy, upstream: RunningUpstream, fmt: str, where: str
) -> None:
    push_leak_then_call(upstream, fmt, where)
    raw = plain_chat(proxy, f"s-leak-{fmt}-{where}")
    [call] = raw.parse().choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == (
        "get_order_details",
        '{"order_id":"#W1"}',
    )
    assert raw.headers["x-toolsentry-violations"] == "leaked_tool_call"
    assert raw.headers["x-toolsentry-repairs"] == "1"
    assert_reasked_about_the_leak(proxy, upstream, fmt, where)


@pytest.mark.parametrize(("fmt", "where"), CASES)
def test_a_call_leaked_as_text_in_a_stream_is_reasked_and_the_client_receives_the_parsed_call(
    proxy: RunningProxy, upstream: RunningUpstream, fmt: str, where: str
) -> None:
    push_leak_then_call(upstream, fmt, where)
    streamed = stream_chat(proxy, f"s-leak-stream-{fmt}-{where}")
    [call] = streamed.completion.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == (
        "get_order_details",
        '{"order_id":"#W1"}',
    )
    assert streamed.summary["violations"] == ["leaked_tool_call"]
    assert streamed.summary["repairs"] == 1
    assert_reasked_about_the_leak(proxy, upstream, fmt, where)


# -- the Responses API and Anthropic Messages: a call leaked into a reasoning item or a thinking
# block. The upstream writes the answer in vLLM's shapes (proxy.protocols); the clients are the
# real SDKs, plain and streamed.

SIGNATURE = "EqQBCkgIARABGAIiQ+/=="


def thinking_with_leak(fmt: str) -> Any:
    return answer(
        None, thoughts=[thinking("I need the order first.\n" + LEAKED[fmt], signature=SIGNATURE)]
    )


def push_reasoning_leak_then_call(upstream: RunningUpstream, fmt: str) -> None:
    upstream.script.push(
        thinking_with_leak(fmt), answer(None, call("get_order_details", ORDER, id="call_ok"))
    )


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("fmt", IN_REASONING)
def test_a_call_leaked_into_a_responses_reasoning_item_is_reasked_and_the_client_gets_the_call(
    proxy: RunningProxy, upstream: RunningUpstream, fmt: str, stream: bool
) -> None:
    push_reasoning_leak_then_call(upstream, fmt)
    session = f"s-leak-responses-{fmt}-{stream}"
    request = responses_request(extra_headers={"x-session-id": session})
    client = proxy.client()
    if stream:
        with client.responses.stream(**request) as events:
            kinds = [event.type for event in events]
            final = events.get_final_response()
        # The reasoning went to the client as it came, before the repaired call.
        assert "response.reasoning_text.delta" in kinds
        reasoning = next(item for item in final.output if item.type == "reasoning")
        assert reasoning.content is not None
        assert reasoning.content[0].text == "I need the order first.\n" + LEAKED[fmt]
    else:
        raw = client.responses.with_raw_response.create(**request)
        final = raw.parse()
        assert raw.headers["x-toolsentry-violations"] == "leaked_tool_call"
        assert raw.headers["x-toolsentry-repairs"] == "1"
    assert function_calls(final.output) == [("get_order_details", None, ORDER)]
    record = proxy.session(session)
    assert (record["channels"], record["repairs"]) == ({"leaked_tool_call": 1}, 1)
    reask = upstream.script.requests[1]["input"]
    first_output = upstream.script.requests[0]["input"]
    assert reask[: len(first_output)] == first_output
    # The model's reasoning item goes back as it sent it, then the correction.
    assert reask[-2]["type"] == "reasoning"
    assert reask[-2]["content"] == [
        {"type": "reasoning_text", "text": "I need the order first.\n" + LEAKED[fmt]}
    ]
    assert reask[-1]["role"] == "user"
    assert_corrects_the_leak(reask[-1]["content"][0]["text"], "reasoning")
    assert_counted(proxy, fmt, "reasoning", "responses")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("fmt", IN_REASONING)
def test_a_call_leaked_into_an_anthropic_thinking_block_is_reasked_and_the_client_gets_the_call(
    proxy: RunningProxy, upstream: RunningUpstream, fmt: str, stream: bool
) -> None:
    push_reasoning_leak_then_call(upstream, fmt)
    session = f"s-leak-messages-{fmt}-{stream}"
    request = messages_args(session, tools=[ORDER_TOOL])
    client = claude(proxy)
    thought = "I need the order first.\n" + LEAKED[fmt]
    if stream:
        with client.messages.stream(**request) as events:
            passed = [event for event in events if event.type == "content_block_stop"]
            final = events.get_final_message()
        # The thinking block went to the client as it came, signature and all.
        assert [b.type for b in final.content] == ["thinking", "tool_use"]
        assert passed[0].content_block.type == "thinking"
        assert (final.content[0].thinking, final.content[0].signature) == (thought, SIGNATURE)
    else:
        raw = client.messages.with_raw_response.create(**request)
        final = raw.parse()
        assert raw.headers["x-toolsentry-violations"] == "leaked_tool_call"
        assert raw.headers["x-toolsentry-repairs"] == "1"
    [use] = [block for block in final.content if block.type == "tool_use"]
    assert (use.name, use.input) == ("get_order_details", ORDER)
    assert final.stop_reason == "tool_use"
    record = proxy.session(session)
    assert (record["channels"], record["repairs"]) == ({"leaked_tool_call": 1}, 1)
    assistant, user = upstream.script.requests[1]["messages"][-2:]
    # The re-ask's assistant turn carries the thinking block byte for byte (its signature too).
    block = {"type": "thinking", "thinking": thought, "signature": SIGNATURE}
    assert assistant == {"role": "assistant", "content": [block]}
    assert orjson.dumps(block) in upstream.script.raw_requests[1]
    [correction] = user["content"]
    assert correction["type"] == "text"
    assert_corrects_the_leak(correction["text"], "reasoning")
    assert_counted(proxy, fmt, "reasoning", "messages")
