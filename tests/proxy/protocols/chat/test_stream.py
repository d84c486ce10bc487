"""Tests for proxy/protocols/chat/stream.py and the chunk writer of proxy/protocols/chat/answer.py:
chunk assembly and re-emission.

The client side of every equivalence test is the real OpenAI SDK: the relayed bytes are served
to `openai.OpenAI` over an in-process mock transport and accumulated with the SDK's own
`ChatCompletionStreamState`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState

from proxy.errors import ToolsentryError, UpstreamProtocolError, UpstreamStatusError
from proxy.protocols.chat.answer import completion_chunks
from proxy.protocols.chat.stream import ChunkAssembler, FinishedChoice
from proxy.sse import DONE, SSEComment, SSEDecoder, SSEEvent, encode_comment, encode_event

try:  # the HTTP library this openai release is built on
    import httpx2 as sdk_httpx
except ImportError:  # pragma: no cover - openai releases built on httpx
    import httpx as sdk_httpx  # type: ignore[no-redef]

Item = SSEEvent | SSEComment

# ---------------------------------------------------------------- builders


ENVELOPE = {
    "id": "chatcmpl-7f3a",
    "object": "chat.completion.chunk",
    "created": 1_700_000_000,
    "model": "gemma-270m",
}


def make_chunk(
    index: int, delta: dict[str, Any], finish_reason: str | None = None, **choice_fields: Any
) -> dict[str, Any]:
    """An upstream chunk with one choice, shaped as vLLM writes it."""
    choice = {
        "index": index,
        "delta": delta,
        "logprobs": None,
        "finish_reason": finish_reason,
        **choice_fields,
    }
    return {**ENVELOPE, "choices": [choice]}


def make_tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_call_deltas(
    position: int, call: dict[str, Any], fragments: Iterable[str]
) -> list[dict[str, Any]]:
    """vLLM's tool-call deltas: id, type, index and name first, then argument fragments."""
    head = {
        "id": call["id"],
        "type": "function",
        "index": position,
        "function": {"name": call["function"]["name"]},
    }
    tail = [{"index": position, "function": {"arguments": piece}} for piece in fragments]
    return [{"tool_calls": [entry]} for entry in [head, *tail]]


def sdk_stream(body: bytes) -> list[Any]:
    """The chunks the real OpenAI SDK yields for a streamed response whose body is `body`."""

    def serve(request: Any) -> Any:
        return sdk_httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    http_client = sdk_httpx.Client(transport=sdk_httpx.MockTransport(serve))
    with openai.OpenAI(
        api_key="sk-test",
        base_url="http://upstream.invalid/v1",
        http_client=http_client,
        max_retries=0,
    ) as client:
        stream = client.chat.completions.create(
            model="gemma-270m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        return list(stream)


def sdk_accumulate(body: bytes) -> Any:
    """The completion the OpenAI SDK's `ChatCompletionStreamState` accumulates from `body`."""
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for chunk in sdk_stream(body):
        state.handle_chunk(chunk)
    return state.current_completion_snapshot


def sdk_message(completion: Any, index: int = 0) -> dict[str, Any]:
    """A comparable view of one accumulated choice."""
    choice = next(c for c in completion.choices if c.index == index)
    calls = choice.message.tool_calls or []
    return {
        "role": choice.message.role,
        "content": choice.message.content,
        "tool_calls": [make_tool_call(t.id, t.function.name, t.function.arguments) for t in calls]
        or None,
        "finish_reason": choice.finish_reason,
    }


def expected_message(choice: dict[str, Any]) -> dict[str, Any]:
    message = choice["message"]
    return {
        "role": "assistant",
        "content": message["content"],
        "tool_calls": message.get("tool_calls"),
        "finish_reason": choice["finish_reason"],
    }


def relay(
    pieces: Iterable[bytes],
    assembler: ChunkAssembler | None = None,
    repair: Callable[[FinishedChoice], tuple[dict[str, Any], str]] | None = None,
    *,
    content_held: bool = False,
) -> bytes:
    """Drive decoder and assembler as the service does, checking what `add` may forward.

    After every `add`, the content forwarded for each choice is all the content the upstream
    sent for it so far (nothing is delayed; nothing at all when `content_held`), and no tool
    call or finish has been forwarded.
    """
    decoder, assembler = SSEDecoder(), assembler or ChunkAssembler()
    upstream_content: dict[int, str] = {}
    client_content: dict[int, str] = {}
    out: list[bytes] = []

    def handle(items: list[Item]) -> None:
        for item in items:
            if isinstance(item, SSEComment):
                out.append(encode_comment(item.text))
                continue
            if item.payload is None:
                assembler.close()
                out.append(DONE)
                continue
            for choice in item.payload["choices"]:
                upstream_content[choice["index"]] = upstream_content.get(choice["index"], "") + (
                    choice["delta"].get("content") or ""
                )
            for chunk in assembler.add(item.payload):
                for choice in chunk["choices"]:
                    assert "tool_calls" not in choice["delta"]
                    assert choice["finish_reason"] is None
                    client_content[choice["index"]] = client_content.get(
                        choice["index"], ""
                    ) + choice["delta"].get("content", "")
                out.append(encode_event(chunk))
            sent_upstream = {} if content_held else upstream_content
            assert {i: c for i, c in client_content.items() if c} == {
                i: c for i, c in sent_upstream.items() if c
            }
            for finished in assembler.take_finished():
                message, reason = (
                    repair(finished) if repair else (finished.message, finished.finish_reason)
                )
                out.extend(
                    encode_event(chunk)
                    for chunk in assembler.emit_tool_calls(finished.index, message, reason)
                )

    for piece in pieces:
        handle(decoder.feed(piece))
    handle(decoder.flush())
    return b"".join(out)


def sse(*chunks: dict[str, Any], done: bool = True) -> bytes:
    return b"".join(encode_event(c) for c in chunks) + (DONE if done else b"")


# ---------------------------------------------------------------- assembler: forwarding


def test_the_first_content_chunk_is_forwarded_as_soon_as_it_is_added() -> None:
    assembler = ChunkAssembler()
    role = assembler.add(make_chunk(0, {"role": "assistant", "content": ""}))
    first = assembler.add(make_chunk(0, {"content": "Let me"}))
    assert [c["choices"] for c in role] == [
        [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}]
    ]
    assert [c["choices"][0]["delta"] for c in first] == [{"content": "Let me"}]
    assert first[0]["id"] == ENVELOPE["id"]
    assert assembler.take_finished() == []


def test_a_chunk_that_only_carries_tool_call_deltas_forwards_nothing() -> None:
    assembler = ChunkAssembler()
    assembler.add(make_chunk(0, {"role": "assistant", "content": ""}))
    call = make_tool_call("chatcmpl-tool-1", "get_order_details", '{"order_id": "#W1"}')
    for delta in tool_call_deltas(0, call, ['{"order', '_id": ', '"#W1"}']):
        assert assembler.add(make_chunk(0, delta)) == []
    assert assembler.add(make_chunk(0, {}, "tool_calls")) == []


def test_content_arriving_with_the_finish_is_forwarded_without_the_finish() -> None:
    assembler = ChunkAssembler()
    out = assembler.add(
        make_chunk(0, {"role": "assistant", "content": "Done."}, "stop", stop_reason=None)
    )
    assert [c["choices"] for c in out] == [
        [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": "Done."},
                "logprobs": None,
                "finish_reason": None,
            }
        ]
    ]
    [finished] = assembler.take_finished()
    finish = assembler.emit_tool_calls(finished.index)
    assert [c["choices"] for c in finish] == [
        [{"stop_reason": None, "index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]
    ]


def test_a_finished_choice_offers_its_message_in_the_non_streamed_shape() -> None:
    assembler = ChunkAssembler()
    first = make_tool_call("chatcmpl-tool-1", "find_user_id_by_email", '{"email": "a@b.c"}')
    second = make_tool_call("chatcmpl-tool-2", "get_order_details", '{"order_id": "#W1"}')
    deltas = [{"role": "assistant", "content": ""}, {"content": "Checking"}, {"content": " now."}]
    deltas += tool_call_deltas(0, first, ['{"email"', ': "a@b.c"}']) + tool_call_deltas(
        1, second, ['{"order_id": "#W1"}']
    )
    for delta in deltas:
        assembler.add(make_chunk(0, delta))
    assembler.add(make_chunk(0, {}, "tool_calls"))
    assert assembler.take_finished() == [
        FinishedChoice(
            0,
            {"role": "assistant", "content": "Checking now.", "tool_calls": [first, second]},
            "tool_calls",
        )
    ]
    assert assembler.take_finished() == []


def test_a_message_without_content_has_content_none_and_no_tool_calls_key() -> None:
    assembler = ChunkAssembler()
    assembler.add(make_chunk(0, {"role": "assistant", "content": ""}, "stop"))
    [finished] = assembler.take_finished()
    assert finished.message == {"role": "assistant", "content": None}


def test_other_delta_fields_are_forwarded_and_assembled_like_the_sdk_does() -> None:
    assembler = ChunkAssembler()
    out = assembler.add(make_chunk(0, {"role": "assistant", "reasoning_content": "The user"}))
    out += assembler.add(make_chunk(0, {"reasoning_content": " wants"}))
    assert [c["choices"][0]["delta"] for c in out] == [
        {"role": "assistant", "reasoning_content": "The user"},
        {"reasoning_content": " wants"},
    ]
    assembler.add(make_chunk(0, {"content": "Hi"}, "stop"))
    [finished] = assembler.take_finished()
    assert finished.message == {
        "role": "assistant",
        "content": "Hi",
        "reasoning_content": "The user wants",
    }


def test_logprobs_are_forwarded_at_once_and_kept_for_the_completion() -> None:
    assembler = ChunkAssembler()
    token = {"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}
    chunk = make_chunk(0, {"role": "assistant", "content": "Hi"})
    chunk["choices"][0]["logprobs"] = {"content": [token], "refusal": None}
    assert assembler.add(chunk)[0]["choices"][0]["logprobs"] == {
        "content": [token],
        "refusal": None,
    }
    call_chunk = make_chunk(0, tool_call_deltas(0, make_tool_call("c1", "f", "{}"), [])[0])
    call_chunk["choices"][0]["logprobs"] = {"content": [token], "refusal": None}
    [forwarded] = assembler.add(call_chunk)
    assert forwarded["choices"][0]["delta"] == {}
    assembler.add(make_chunk(0, {}, "tool_calls"))
    assembler.emit_tool_calls(0)
    assert assembler.to_completion()["choices"][0]["logprobs"] == {
        "content": [token, token],
        "refusal": None,
    }


# ---------------------------------------------------------------- assembler: release and repair


def stream_with_tool_call(
    content: str, call: dict[str, Any], *, usage: dict[str, Any] | None = None
) -> bytes:
    deltas = [
        {"role": "assistant", "content": ""},
        {"content": content},
        *tool_call_deltas(0, call, [call["function"]["arguments"]]),
    ]
    chunks = [make_chunk(0, d) for d in deltas] + [make_chunk(0, {}, "tool_calls")]
    if usage is not None:
        chunks.append({**ENVELOPE, "choices": [], "usage": usage})
    return sse(*chunks)


BAD_CALL = make_tool_call("chatcmpl-tool-1", "lookup_order", '{"order_id": "#W1"}')
GOOD_CALL = make_tool_call("chatcmpl-tool-9", "get_order_details", '{"order_id": "#W1"}')


def test_repaired_tool_calls_replace_the_held_ones_and_the_streamed_content_stays() -> None:
    def repair(finished: FinishedChoice) -> tuple[dict[str, Any], str]:
        assert finished.message["tool_calls"] == [BAD_CALL]
        return {
            "role": "assistant",
            "content": "Something else.",
            "tool_calls": [GOOD_CALL],
        }, "tool_calls"

    assembler = ChunkAssembler()
    body = relay([stream_with_tool_call("Looking it up.", BAD_CALL)], assembler, repair)
    assert sdk_message(sdk_accumulate(body)) == {
        "role": "assistant",
        "content": "Looking it up.",
        "tool_calls": [GOOD_CALL],
        "finish_reason": "tool_calls",
    }
    assert assembler.to_completion()["choices"][0]["message"] == {
        "role": "assistant",
        "content": "Looking it up.",
        "tool_calls": [GOOD_CALL],
    }


def test_repaired_content_that_extends_the_streamed_content_is_completed() -> None:
    def repair(finished: FinishedChoice) -> tuple[dict[str, Any], str]:
        return {
            "role": "assistant",
            "content": "Looking it up. Found it.",
            "tool_calls": [GOOD_CALL],
        }, "tool_calls"

    body = relay([stream_with_tool_call("Looking it up.", BAD_CALL)], repair=repair)
    assert sdk_message(sdk_accumulate(body))["content"] == "Looking it up. Found it."


def test_held_content_is_replaced_entirely_by_a_repair() -> None:
    def repair(finished: FinishedChoice) -> tuple[dict[str, Any], str]:
        assert finished.message["content"] == "<tool_call>"
        return {"role": "assistant", "content": None, "tool_calls": [GOOD_CALL]}, "tool_calls"

    assembler = ChunkAssembler(hold_content=True)
    body = relay(
        [stream_with_tool_call("<tool_call>", BAD_CALL)], assembler, repair, content_held=True
    )
    assert sdk_message(sdk_accumulate(body)) == {
        "role": "assistant",
        "content": None,
        "tool_calls": [GOOD_CALL],
        "finish_reason": "tool_calls",
    }


def test_a_repair_that_drops_every_call_finishes_with_its_own_reason() -> None:
    def repair(finished: FinishedChoice) -> tuple[dict[str, Any], str]:
        return {"role": "assistant", "content": None}, "stop"

    body = relay([stream_with_tool_call("Hm.", BAD_CALL)], repair=repair)
    assert sdk_message(sdk_accumulate(body)) == {
        "role": "assistant",
        "content": "Hm.",
        "tool_calls": None,
        "finish_reason": "stop",
    }


def test_repair_usage_is_added_to_the_usage_the_client_receives() -> None:
    assembler = ChunkAssembler()
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "total_tokens": 120,
        "prompt_tokens_details": {"cached_tokens": 10},
    }

    def repair(finished: FinishedChoice) -> tuple[dict[str, Any], str]:
        assembler.add_usage(
            {
                "prompt_tokens": 150,
                "completion_tokens": 15,
                "total_tokens": 165,
                "prompt_tokens_details": {"cached_tokens": 100},
            }
        )
        return {"role": "assistant", "content": None, "tool_calls": [GOOD_CALL]}, "tool_calls"

    body = relay([stream_with_tool_call("Hm.", BAD_CALL, usage=usage)], assembler, repair)
    summed = {
        "prompt_tokens": 250,
        "completion_tokens": 35,
        "total_tokens": 285,
        "prompt_tokens_details": {"cached_tokens": 110},
    }
    assert sdk_accumulate(body).usage.to_dict() == summed
    assert assembler.to_completion()["usage"] == summed


def test_usage_sent_on_a_held_finish_chunk_reaches_the_client_on_the_released_finish() -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    deltas = [{"role": "assistant"}, *tool_call_deltas(0, GOOD_CALL, ["{", "}"])]
    chunks = [{**make_chunk(0, d), "usage": None} for d in deltas]
    finish = {**make_chunk(0, {}, "tool_calls"), "usage": usage}
    body = relay([sse(*chunks, finish)])
    assert sdk_accumulate(body).usage.to_dict() == usage


def test_a_tool_call_id_repeated_on_every_delta_is_kept_once() -> None:
    assembler = ChunkAssembler()
    for piece in ['{"order_id"', ': "#W1"}']:
        entry = {"index": 0, "id": "call_1", "function": {"name": "", "arguments": piece}}
        assembler.add(make_chunk(0, {"tool_calls": [entry]}))
    assembler.add(make_chunk(0, {}, "tool_calls"))
    [finished] = assembler.take_finished()
    assert finished.message["tool_calls"] == [make_tool_call("call_1", "", '{"order_id": "#W1"}')]


def test_a_choice_is_released_only_once_and_only_after_it_finished() -> None:
    assembler = ChunkAssembler()
    assembler.add(make_chunk(0, {"role": "assistant", "content": "Hi"}))
    with pytest.raises(ValueError, match="choice 0"):
        assembler.emit_tool_calls(0)
    assembler.add(make_chunk(0, {}, "stop"))
    assembler.emit_tool_calls(0)
    with pytest.raises(ValueError, match="choice 0"):
        assembler.emit_tool_calls(0)


def test_a_second_choice_arriving_first_is_opened_after_the_first_for_the_sdk() -> None:
    chunks = [
        make_chunk(1, {"role": "assistant", "content": "B"}),
        make_chunk(0, {"role": "assistant", "content": ""}),
        *[make_chunk(0, d) for d in tool_call_deltas(0, GOOD_CALL, ['{"order_id"', ': "#W1"}'])],
        make_chunk(1, {}, "stop"),
        make_chunk(0, {}, "tool_calls"),
    ]
    body = relay([sse(*chunks)])
    completion = sdk_accumulate(body)
    assert sdk_message(completion, 0) == {
        "role": "assistant",
        "content": None,
        "tool_calls": [GOOD_CALL],
        "finish_reason": "tool_calls",
    }
    assert sdk_message(completion, 1) == {
        "role": "assistant",
        "content": "B",
        "tool_calls": None,
        "finish_reason": "stop",
    }


# ---------------------------------------------------------------- assembler: errors


def test_an_upstream_error_event_raises_with_the_upstream_body() -> None:
    assembler = ChunkAssembler()
    assembler.add(make_chunk(0, {"role": "assistant", "content": "Hi"}))
    body = {
        "error": {
            "message": "engine died",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
    }
    with pytest.raises(UpstreamStatusError, match="engine died") as caught:
        assembler.add(body)
    assert caught.value.body() == body
    assert caught.value.status == 500


def test_an_error_in_vllm_older_flat_shape_raises_too() -> None:
    with pytest.raises(UpstreamStatusError, match="out of memory") as caught:
        ChunkAssembler().add(
            {"object": "error", "message": "out of memory", "type": "x", "code": "oom"}
        )
    assert caught.value.status == 502


@pytest.mark.parametrize(
    "chunk",
    [
        {"id": "x"},
        {**ENVELOPE, "choices": [{"delta": {}}]},
        {**ENVELOPE, "choices": [{"index": 0, "delta": "text"}]},
        {**ENVELOPE, "choices": [{"index": 0, "delta": {"content": 3}}]},
        {
            **ENVELOPE,
            "choices": [{"index": 0, "delta": {"tool_calls": [{"function": {"name": "f"}}]}}],
        },
        {**ENVELOPE, "choices": [{"index": 0, "delta": {"tool_calls": {"index": 0}}}]},
        {
            **ENVELOPE,
            "choices": [
                {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": {}}}]}}
            ],
        },
        {
            **ENVELOPE,
            "choices": [
                {"index": 0, "delta": {"content": "a"}},
                {"index": 0, "delta": {"content": "b"}},
            ],
        },
        {**ENVELOPE, "choices": [], "usage": 12},
    ],
)
def test_a_chunk_that_is_not_a_chat_completion_chunk_is_a_protocol_error(
    chunk: dict[str, Any],
) -> None:
    with pytest.raises(UpstreamProtocolError, match=r"^upstream sent"):
        ChunkAssembler().add(chunk)


def test_a_delta_after_its_choice_finished_is_a_protocol_error() -> None:
    assembler = ChunkAssembler()
    assembler.add(make_chunk(0, {"content": "Hi"}, "stop"))
    with pytest.raises(UpstreamProtocolError, match="choice 0"):
        assembler.add(make_chunk(0, {"content": "again"}))


def test_a_stream_that_ends_before_a_choice_finished_is_a_protocol_error() -> None:
    assembler = ChunkAssembler()
    assembler.add(make_chunk(0, {"content": "Hi"}))
    with pytest.raises(UpstreamProtocolError, match="before choice 0 finished"):
        assembler.close()
    with pytest.raises(UpstreamProtocolError, match="without any chunk"):
        ChunkAssembler().close()


def test_a_stream_opening_choice_one_implies_choice_zero_must_finish_too() -> None:
    assembler = ChunkAssembler()
    assembler.add(make_chunk(1, {"content": "B"}, "stop"))
    assembler.emit_tool_calls(1)
    with pytest.raises(UpstreamProtocolError, match="before choice 0 finished"):
        assembler.close()


def test_closing_with_a_finished_choice_never_released_is_a_caller_error() -> None:
    assembler = ChunkAssembler()
    assembler.add(make_chunk(0, {"content": "Hi"}, "stop"))
    with pytest.raises(ValueError, match="never emitted"):
        assembler.close()


def test_an_error_sent_after_the_first_byte_makes_the_sdk_raise_it() -> None:
    error = UpstreamProtocolError("upstream sent invalid JSON")
    body = relay(
        [sse(make_chunk(0, {"role": "assistant", "content": "Hi"}), done=False)]
    ) + encode_event(error.body())
    with pytest.raises(openai.APIError, match="upstream sent invalid JSON"):
        sdk_stream(body)
    assert isinstance(error, ToolsentryError)


# ---------------------------------------------------------------- equivalence with the non-streamed response

TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
ARGUMENTS = st.one_of(
    st.dictionaries(
        st.text(max_size=8), st.none() | st.booleans() | st.integers() | TEXT, max_size=4
    ).map(lambda d: json.dumps(d, ensure_ascii=False)),
    TEXT,  # malformed arguments are carried verbatim
)
TOOL_CALLS = st.builds(
    make_tool_call,
    st.text("0123456789abcdef", min_size=8, max_size=8).map(lambda h: f"chatcmpl-tool-{h}"),
    st.sampled_from(["find_user_id_by_email", "get_order_details", "cancel_pending_order"])
    | TEXT.filter(bool),
    ARGUMENTS,
)


@st.composite
def completions(draw: st.DrawFn) -> dict[str, Any]:
    """A non-streamed chat completion: content only, tool calls with or without content, n = 1 or 2."""
    choices = []
    for index in range(draw(st.sampled_from([1, 2]))):
        calls = draw(st.lists(TOOL_CALLS, max_size=3))
        message: dict[str, Any] = {
            "role": "assistant",
            "content": draw(st.none() | TEXT.filter(bool)),
        }
        if calls:
            message["tool_calls"] = calls
        reason = "tool_calls" if calls else draw(st.sampled_from(["stop", "length"]))
        choices.append(
            {
                "index": index,
                "message": message,
                "logprobs": None,
                "finish_reason": reason,
                "stop_reason": None,
            }
        )
    tokens = st.integers(0, 10_000)
    usage = draw(
        st.none()
        | st.builds(
            lambda p, c: {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
            tokens,
            tokens,
        )
    )
    return {**ENVELOPE, "object": "chat.completion", "choices": choices, "usage": usage}


def fragments(text: str, rnd: random.Random, longest: int) -> list[str]:
    pieces = []
    while text:
        size = rnd.randint(1, longest)
        pieces.append(text[:size])
        text = text[size:]
    return pieces


def render_like_vllm(completion: dict[str, Any], rnd: random.Random) -> bytes:
    """The upstream SSE body vLLM streams for `completion`: a role chunk per choice, content in
    fragments, each tool call's id/type/name first and then arguments of 1–5 characters, the
    finish with the last delta or alone, choices interleaved, usage last; keep-alive comments
    and the line-ending style drawn at random."""
    usage_nulls = completion["usage"] is not None and rnd.random() < 0.5  # OpenAI's `"usage": null`
    sequences = []
    for choice in completion["choices"]:
        index, message = choice["index"], choice["message"]
        deltas = [{"role": "assistant", "content": ""}]
        deltas += [{"content": piece} for piece in fragments(message["content"] or "", rnd, 8)]
        for position, call in enumerate(message.get("tool_calls", [])):
            deltas += tool_call_deltas(
                position, call, fragments(call["function"]["arguments"], rnd, 5)
            )
        last = deltas.pop() if len(deltas) > 1 and rnd.random() < 0.5 else {}
        chunks = [make_chunk(index, d) for d in deltas] + [
            make_chunk(index, last, choice["finish_reason"], stop_reason=None)
        ]
        sequences.append(chunks)
    ordered = []
    while any(sequences):
        ordered.append(rnd.choice([s for s in sequences if s]).pop(0))
    if completion["usage"] is not None:
        ordered.append({**ENVELOPE, "choices": [], "usage": completion["usage"]})
    eol = rnd.choice([b"\n", b"\r\n", b"\r"])
    body = b""
    for chunk in ordered:
        if usage_nulls and chunk["choices"]:
            chunk["usage"] = None
        if rnd.random() < 0.1:
            body += b": ping" + eol
        body += b"data: " + json.dumps(chunk, ensure_ascii=rnd.random() < 0.5).encode() + eol + eol
    return body + b"data: [DONE]" + eol + eol


def cut_at_random(body: bytes, rnd: random.Random) -> list[bytes]:
    cuts = sorted(rnd.sample(range(1, len(body)), min(len(body) - 1, rnd.randint(0, 30))))
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(completion=completions(), rnd=st.randoms(use_true_random=False))
def test_a_relayed_stream_accumulates_in_the_sdk_to_the_non_streamed_completion(
    completion: dict[str, Any], rnd: random.Random
) -> None:
    assembler = ChunkAssembler()
    body = relay(cut_at_random(render_like_vllm(completion, rnd), rnd), assembler)
    accumulated = sdk_accumulate(body)
    for choice in completion["choices"]:
        assert sdk_message(accumulated, choice["index"]) == expected_message(choice)
    assert len(accumulated.choices) == len(completion["choices"])
    assert (accumulated.usage.to_dict() if accumulated.usage else None) == completion["usage"]
    assert assembler.to_completion() == completion
    assert body.endswith(DONE)


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(completion=completions(), fragment=st.none() | st.integers(1, 6))
def test_a_completion_rendered_as_chunks_accumulates_in_the_sdk_to_itself(
    completion: dict[str, Any], fragment: int | None
) -> None:
    chunks = completion_chunks(completion, fragment=fragment, include_usage=True)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    accumulated = sdk_accumulate(sse(*chunks))
    for choice in completion["choices"]:
        assert sdk_message(accumulated, choice["index"]) == expected_message(choice)
    assert (accumulated.usage.to_dict() if accumulated.usage else None) == completion["usage"]
    assembler = ChunkAssembler()
    relay([sse(*chunks)], assembler)
    assert assembler.to_completion() == completion


def test_a_completion_rendered_without_usage_sends_no_usage_chunk() -> None:
    completion = {**ENVELOPE, "object": "chat.completion", "usage": {"total_tokens": 3}}
    completion["choices"] = [
        {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}
    ]
    chunks = completion_chunks(completion)
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant"},
        {"content": "Hi"},
        {},
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
