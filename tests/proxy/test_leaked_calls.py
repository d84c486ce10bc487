"""End to end: an upstream that writes its call as text, in vLLM's formats, in the answer or in
the reasoning; the proxy re-asks and the client, plain or streamed, gets a parsed call."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.testing import completion, tool_call
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.metrics_text import metric
from tests.proxy.pipeline.test_stream import plain_chat, stream_chat

ORDER = {"order_id": "#W1"}

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
    assert "get_order_details" in reask[-1]["content"]
    assert "tool call" in reask[-1]["content"]
    assert ("in your reasoning" in reask[-1]["content"]) == (where == "reasoning")
    text = proxy.metrics()
    assert (
        metric(
            text, "toolsentry_leaked_calls_total", model="scripted-model", format=fmt, where=where
        )
        == 1
    )
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
