"""`repair: constrain` end to end: the real openai SDK → proxy (uvicorn) → scripted upstream,
which records what each re-ask asked for."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from proxy.testing import Fault, answer, call, completion, tool_call
from tests.proxy.builders import RETAIL_TOOLS, make_request, make_tool
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.metrics_text import metric
from tests.proxy.system.support import ProxyProcess

VALID_CANCEL = tool_call("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"})
REFUSAL = Fault(
    400,
    {
        "error": {
            "message": "Unrecognized request argument supplied: strict",
            "type": "BadRequestError",
            "code": 400,
        }
    },
)
BILLS = make_tool(
    "get_bills",
    {"customer_id": {"type": "string"}, "limit": {"type": "integer"}},
    ["customer_id"],
    additional=None,
)


REPAIRS = {"model": "scripted-model", "channel": "schema_violation", "api": "chat"}


def chat(
    proxy: RunningProxy, session: str, request: dict[str, Any] | None = None, **headers: str
) -> Any:
    return proxy.client().chat.completions.with_raw_response.create(
        **(request or make_request()), extra_headers={"x-session-id": session, **headers}
    )


def strict_tools(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The tools a request declared strict, by name, with the parameters it declared."""
    return {
        tool["function"]["name"]: tool["function"]["parameters"]
        for tool in request.get("tools") or []
        if tool["function"].get("strict") is True
    }


def streamed_calls(stream: Iterable[Any]) -> list[Any]:
    """The tool-call deltas of a chat stream, in order."""
    return [
        part
        for chunk in stream
        for choice in chunk.choices
        for part in choice.delta.tool_calls or []
        if part.function is not None
    ]


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


@pytest.fixture
def constrain(make_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    return make_proxy(repair="constrain")


@pytest.mark.parametrize(
    ("bad_call", "channel"),
    [
        (
            tool_call("cancel_pendng_order", {"order_id": "#W1", "reason": "no longer needed"}),
            "unknown_tool",
        ),
        (tool_call("cancel_pending_order", {"order_id": "#W1"}), "schema_violation"),
        (
            tool_call("cancel_pending_order", '{"order_id": "#W1", "reason": '),
            "malformed_arguments",
        ),
    ],
)
def test_a_call_whose_tool_is_clear_is_reasked_naming_it_strict_and_alone(
    constrain: RunningProxy, upstream: RunningUpstream, bad_call: dict[str, Any], channel: str
) -> None:
    upstream.script.push(completion(tool_calls=[bad_call]), completion(tool_calls=[VALID_CANCEL]))
    raw = chat(constrain, f"s-{channel}")
    assert raw.parse().choices[0].message.tool_calls[0].function.name == "cancel_pending_order"
    assert raw.headers["x-toolsentry-violations"] == channel
    assert raw.headers["x-toolsentry-repairs"] == "1"
    first, reask = upstream.script.requests
    assert "tool_choice" not in first
    assert strict_tools(first) == {}
    assert reask["tool_choice"] == named("cancel_pending_order")
    assert reask["parallel_tool_calls"] is False
    assert list(strict_tools(reask)) == ["cancel_pending_order"]
    assert reask["messages"][-1]["role"] == "tool"  # the corrective text goes as before


def test_a_truncated_call_is_reasked_naming_its_tool(
    constrain: RunningProxy, upstream: RunningUpstream
) -> None:
    cut = completion(
        tool_calls=[tool_call("get_order_details", '{"order_id": "#W')], finish_reason="length"
    )
    upstream.script.push(
        cut, completion(tool_calls=[tool_call("get_order_details", {"order_id": "#W1"})])
    )
    raw = chat(constrain, "s-cut")
    assert raw.headers["x-toolsentry-violations"] == "truncated"
    assert upstream.script.requests[1]["tool_choice"] == named("get_order_details")


@pytest.mark.parametrize(
    ("first", "channel"),
    [
        (completion(tool_calls=[tool_call("refund_everything", {})]), "unknown_tool"),
        (completion(""), "empty_response"),
    ],
)
def test_an_unclear_intent_is_reasked_with_required_and_every_tool_strict(
    constrain: RunningProxy, upstream: RunningUpstream, first: dict[str, Any], channel: str
) -> None:
    upstream.script.push(first, completion(tool_calls=[VALID_CANCEL]))
    raw = chat(constrain, f"s-required-{channel}")
    assert raw.headers["x-toolsentry-violations"] == channel
    reask = upstream.script.requests[1]
    assert reask["tool_choice"] == "required"
    assert reask["parallel_tool_calls"] is False
    assert set(strict_tools(reask)) == {t["function"]["name"] for t in RETAIL_TOOLS}
    for parameters in strict_tools(reask).values():
        assert parameters["additionalProperties"] is False
        assert sorted(parameters["required"]) == sorted(parameters["properties"])


def test_a_call_where_tool_choice_was_none_is_reasked_with_none(
    constrain: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(completion(tool_calls=[VALID_CANCEL]), completion("Order #W1 is pending."))
    raw = chat(constrain, "s-none", make_request(tool_choice="none"))
    assert raw.parse().choices[0].message.content == "Order #W1 is pending."
    reask = upstream.script.requests[1]
    assert reask["tool_choice"] == "none"
    assert strict_tools(reask) == {}


def test_the_null_a_strict_answer_writes_for_an_optional_property_never_reaches_the_client(
    constrain: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        completion(tool_calls=[tool_call("get_bils", {"customer_id": "C1"})]),
        completion(tool_calls=[tool_call("get_bills", {"customer_id": "C1", "limit": None})]),
    )
    raw = chat(constrain, "s-restore", make_request(tools=[BILLS]))
    call = raw.parse().choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments) == {"customer_id": "C1"}
    assert raw.headers["x-toolsentry-repairs"] == "1"
    declared = strict_tools(upstream.script.requests[1])["get_bills"]
    assert declared["required"] == ["customer_id", "limit"]


def test_a_streamed_request_is_reasked_constrained_and_streams_the_repaired_call(
    constrain: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        completion(tool_calls=[tool_call("cancel_pending_order", {"order_id": "#W1"})]),
        completion(tool_calls=[VALID_CANCEL]),
    )
    with constrain.client().chat.completions.create(
        **make_request(), stream=True, extra_headers={"x-session-id": "s-stream"}
    ) as stream:
        arguments = "".join(part.function.arguments or "" for part in streamed_calls(stream))
    assert json.loads(arguments) == {"order_id": "#W1", "reason": "no longer needed"}
    assert upstream.script.requests[1]["tool_choice"] == named("cancel_pending_order")
    assert not upstream.script.requests[1].get("stream")


def test_an_upstream_that_refuses_the_fields_gets_a_plain_reask_now_and_from_then_on(
    constrain: RunningProxy, upstream: RunningUpstream, log: Any
) -> None:
    def without_structured_outputs(request: dict[str, Any]) -> Any:
        if strict_tools(request) or request.get("tool_choice") not in (None, "auto"):
            return REFUSAL
        if len(request["messages"]) == 2:  # the client's own request
            return completion(tool_calls=[tool_call("cancel_pending_order", {"order_id": "#W1"})])
        return completion(tool_calls=[VALID_CANCEL])

    upstream.script.handler = without_structured_outputs
    raw = chat(constrain, "s-fallback")
    assert raw.parse().choices[0].message.tool_calls[0].function.name == "cancel_pending_order"
    assert raw.headers["x-toolsentry-repairs"] == "1"
    assert raw.headers["x-toolsentry-errors"] == "0"
    _first, refused, plain = upstream.script.requests
    assert refused["tool_choice"] == named("cancel_pending_order")
    assert "tool_choice" not in plain
    assert strict_tools(plain) == {}
    assert plain["messages"] == refused["messages"]  # the same corrective re-ask, plain
    text = constrain.metrics()
    assert metric(text, "toolsentry_repairs_total", **REPAIRS, result="fallback") == 1
    assert metric(text, "toolsentry_repairs_total", **REPAIRS, result="success") == 1
    assert "structured_outputs_refused" in log.getvalue()
    assert constrain.session("s-fallback")["errors"] == 0  # a refusal is not the upstream failing

    # remembered: the next re-ask to this upstream goes plain at once
    chat(constrain, "s-fallback-2")
    assert len(upstream.script.requests) == 5
    assert strict_tools(upstream.script.requests[4]) == {}
    text = constrain.metrics()
    assert metric(text, "toolsentry_repairs_total", **REPAIRS, result="fallback") == 1


def test_structured_outputs_off_makes_constrain_a_plain_reask(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(
        repair="constrain",
        upstreams=[{"name": "s", "base_url": upstream.base_url, "structured_outputs": "off"}],
    )
    upstream.script.push(
        completion(tool_calls=[tool_call("cancel_order", {})]),
        completion(tool_calls=[VALID_CANCEL]),
    )
    raw = chat(proxy, "s-so-off")
    assert raw.headers["x-toolsentry-repairs"] == "1"
    assert "tool_choice" not in upstream.script.requests[1]
    assert strict_tools(upstream.script.requests[1]) == {}


def test_structured_outputs_on_does_not_fall_back_when_the_upstream_refuses(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(
        repair="constrain",
        on_unrepaired="passthrough",
        upstreams=[{"name": "s", "base_url": upstream.base_url, "structured_outputs": "on"}],
    )
    upstream.script.push(completion(tool_calls=[tool_call("cancel_order", {})]), REFUSAL)
    raw = chat(proxy, "s-so-on")
    # the re-ask failed: the client gets the original failure, counted against its budget
    assert raw.parse().choices[0].message.tool_calls[0].function.name == "cancel_order"
    assert raw.headers["x-toolsentry-errors"] == "1"
    assert len(upstream.script.requests) == 2


def test_a_request_header_asks_for_constrain_when_overrides_are_allowed(
    proxy: RunningProxy, upstream: RunningUpstream
) -> None:
    upstream.script.push(
        completion(tool_calls=[tool_call("cancel_order", {})]),
        completion(tool_calls=[VALID_CANCEL]),
    )
    chat(proxy, "s-hdr", **{"x-toolsentry-repair": "constrain"})
    assert upstream.script.requests[1]["tool_choice"] == "required"
    chat(proxy, "s-hdr-reask")  # the configured reask stays plain
    assert "tool_choice" not in upstream.script.requests[-1]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_enforce_strict_marks_the_clients_tools_strict_on_the_first_attempt_only(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, stream: bool
) -> None:
    proxy = make_proxy(enforce_strict=True)
    upstream.script.push(
        completion(tool_calls=[tool_call("get_bills", {"customer_id": "C1", "limit": None})])
    )
    request = make_request(tools=[BILLS, *RETAIL_TOOLS], tool_choice="auto")
    client = proxy.client()
    if stream:
        with client.chat.completions.create(**request, stream=True) as events:
            arguments = "".join(part.function.arguments or "" for part in streamed_calls(events))
    else:
        arguments = (
            client.chat.completions.create(**request)
            .choices[0]
            .message.tool_calls[0]
            .function.arguments
        )
    assert json.loads(arguments) == {"customer_id": "C1"}  # the placeholder null is gone
    (sent,) = upstream.script.requests
    assert sent["tool_choice"] == "auto"  # the client's choice, unchanged
    assert set(strict_tools(sent)) == {"get_bills", *(t["function"]["name"] for t in RETAIL_TOOLS)}
    assert "parallel_tool_calls" not in sent


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_enforce_strict_refused_sends_the_clients_own_request_and_remembers(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, stream: bool
) -> None:
    proxy = make_proxy(enforce_strict=True)

    def without_structured_outputs(request: dict[str, Any]) -> Any:
        return REFUSAL if strict_tools(request) else completion(tool_calls=[VALID_CANCEL])

    upstream.script.handler = without_structured_outputs
    request = make_request()
    client = proxy.client()
    for _ in range(2):
        if stream:
            with client.chat.completions.create(**request, stream=True) as events:
                names = [p.function.name for p in streamed_calls(events) if p.function.name]
        else:
            message = client.chat.completions.create(**request).choices[0].message
            names = [call.function.name for call in message.tool_calls or []]
        assert names == ["cancel_pending_order"]
    refused, plain, second = upstream.script.requests
    assert set(strict_tools(refused)) == {t["function"]["name"] for t in RETAIL_TOOLS}
    assert strict_tools(plain) == {}
    assert plain["tools"] == RETAIL_TOOLS  # the client's tools as it declared them
    assert strict_tools(second) == {}  # remembered: no second refusal


def test_a_responses_reask_asks_in_the_responses_form(
    constrain: RunningProxy, upstream: RunningUpstream
) -> None:
    tools = [
        {
            "type": "function",
            "name": t["function"]["name"],
            "parameters": t["function"]["parameters"],
        }
        for t in RETAIL_TOOLS
    ] + [{"type": "web_search"}]
    upstream.script.push(
        answer(None, call("cancel_pending_order", {"order_id": "#W1"}, id="call_bad")),
        answer(
            None, call("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"})
        ),
    )
    reply = constrain.client().responses.create(
        model="scripted-model", input="Cancel order #W1 please.", tools=tools
    )
    assert [item.name for item in reply.output if item.type == "function_call"] == [
        "cancel_pending_order"
    ]
    reask = upstream.script.requests[1]
    assert reask["tool_choice"] == {"type": "function", "name": "cancel_pending_order"}
    assert reask["parallel_tool_calls"] is False
    strict = [t["name"] for t in reask["tools"] if t.get("strict") is True]
    assert strict == ["cancel_pending_order"]
    assert reask["tools"][-1] == {"type": "web_search"}


def test_a_messages_reask_asks_in_anthropics_form(
    constrain: RunningProxy, upstream: RunningUpstream
) -> None:
    bash = {
        "name": "Bash",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["command"],
        },
    }
    web_search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
    upstream.script.push(
        answer(None, call("Bash", {"cmd": "ls"}, id="toolu_bad")),
        answer(None, call("Bash", {"command": "ls", "timeout": None}, id="toolu_ok")),
    )
    client = anthropic.Anthropic(base_url=constrain.server.url, api_key="k", max_retries=0)
    constrain.clients.append(client)
    raw = client.messages.with_raw_response.create(
        model="scripted-model",
        max_tokens=256,
        messages=[{"role": "user", "content": "List the files here."}],
        tools=[bash, web_search],  # type: ignore[list-item]
    )
    (block,) = raw.parse().content
    assert (block.type, block.name, block.input) == ("tool_use", "Bash", {"command": "ls"})
    assert raw.headers["x-toolsentry-violations"] == "schema_violation"
    assert raw.headers["x-toolsentry-repairs"] == "1"
    first, reask = upstream.script.requests
    assert "tool_choice" not in first
    assert reask["tool_choice"] == {
        "type": "tool",
        "name": "Bash",
        "disable_parallel_tool_use": True,
    }
    strict_bash, server_tool = reask["tools"]
    assert strict_bash["strict"] is True
    assert strict_bash["input_schema"]["additionalProperties"] is False
    assert sorted(strict_bash["input_schema"]["required"]) == ["command", "timeout"]
    assert server_tool == web_search  # a server tool is left as declared
    assert reask["messages"][-1]["content"][0]["type"] == "tool_result"


LEAKED_CANCEL = (
    '<tool_call>\n{"name": "cancel_pending_order", "arguments": {"order_id": "#W1", '
    '"reason": "no longer needed"}}\n</tool_call>'
)


def test_a_call_written_as_text_again_and_again_is_reasked_as_one_named_call(
    constrain: RunningProxy, upstream: RunningUpstream
) -> None:
    # what the CPU vLLM answers to `required`: the call written out, again, then cut off
    repeated = completion(
        LEAKED_CANCEL + LEAKED_CANCEL + '<tool_call>\n{"name": "cancel_pending_order", "argu',
        finish_reason="length",
    )
    upstream.script.push(repeated, completion(tool_calls=[VALID_CANCEL]))
    raw = chat(constrain, "s-leaked", make_request(tool_choice="required"))
    assert raw.headers["x-toolsentry-violations"] == "leaked_tool_call,truncated"
    assert raw.headers["x-toolsentry-repairs"] == "3"
    reask = upstream.script.requests[1]
    assert reask["tool_choice"] == named("cancel_pending_order")
    assert reask["parallel_tool_calls"] is False
    assert list(strict_tools(reask)) == ["cancel_pending_order"]
    assert reask["messages"][-1]["role"] == "user"  # a leaked call has no id to answer


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_serve_repair_constrain_falls_back_against_a_server_without_structured_outputs(
    upstream: RunningUpstream, tmp_path: Path, stream: bool
) -> None:
    """A real `toolsentry serve --repair constrain` process in front of a server that answers
    the constrained fields with a 400 naming them (as servers without structured outputs do)."""
    bad = tool_call("cancel_pending_order", {"order_id": "#W1"})

    def without_structured_outputs(request: dict[str, Any]) -> Any:
        if strict_tools(request) or request.get("tool_choice") not in (None, "auto"):
            return REFUSAL
        if len(request["messages"]) == 2:  # the client's own request
            return completion(tool_calls=[bad])
        return completion(tool_calls=[VALID_CANCEL])

    upstream.script.handler = without_structured_outputs
    proxy = ProxyProcess(upstream.base_url, tmp_path / "serve.log", "--repair", "constrain")
    proxy.wait_ready()
    try:
        with openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0) as client:
            for session in ("first", "second"):
                if stream:
                    with client.chat.completions.create(
                        **make_request(), stream=True, extra_headers={"x-session-id": session}
                    ) as events:
                        parts = streamed_calls(events)
                    names = [p.function.name for p in parts if p.function.name]
                    arguments = "".join(p.function.arguments or "" for p in parts)
                else:
                    message = (
                        client.chat.completions.create(
                            **make_request(), extra_headers={"x-session-id": session}
                        )
                        .choices[0]
                        .message
                    )
                    names = [c.function.name for c in message.tool_calls or []]
                    arguments = "".join(c.function.arguments for c in message.tool_calls or [])
                assert names == ["cancel_pending_order"]
                assert json.loads(arguments)["reason"] == "no longer needed"
                assert proxy.session(session)["errors"] == 0
        text = proxy.metrics()
    finally:
        proxy.stop()
    # first request: the client's, the refused constrained re-ask, the plain one; second: plain
    asked = [(bool(strict_tools(r)), r.get("tool_choice")) for r in upstream.script.requests]
    assert asked == [
        (False, None),
        (True, named("cancel_pending_order")),
        (False, None),
        (False, None),
        (False, None),
    ]
    assert metric(text, "toolsentry_repairs_total", **REPAIRS, result="fallback") == 1
    assert metric(text, "toolsentry_repairs_total", **REPAIRS, result="success") == 2
    assert "structured_outputs_refused" in (tmp_path / "serve.log").read_text()
