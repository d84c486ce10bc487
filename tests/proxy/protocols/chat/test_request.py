"""Tests for proxy/protocols/chat/request.py: a chat request's history as digests."""

from __future__ import annotations

from typing import Any

from proxy.protocols.chat.request import history
from proxy.session.history import MAX_PREFIXES


def body(*messages: dict[str, Any], model: str = "m") -> dict[str, Any]:
    return {"model": model, "messages": list(messages)}


SYSTEM = {"role": "system", "content": "You are a retail agent."}
USER = {"role": "user", "content": "Where is my order?"}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "get_order", "arguments": '{"id": "7"}'}}
    ],
}  # fmt: skip
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "Error: no such order"}


def test_the_next_turn_extends_the_previous_request() -> None:
    first = history(body(SYSTEM, USER))
    second = history(body(SYSTEM, USER, CALL, RESULT))
    third = history(body(SYSTEM, USER, CALL, RESULT, {"role": "assistant", "content": "Sorry."},
                         {"role": "user", "content": "Try 8."}))  # fmt: skip
    assert second.prefixes == (first.tip,)
    assert third.prefixes == (second.tip, first.tip)


def test_parts_and_strings_and_the_fields_sdks_add_read_alike() -> None:
    plain = history(body(SYSTEM, USER, CALL, RESULT))
    as_parts = history(
        body(
            {"role": "system", "content": [{"type": "text", "text": "You are a retail agent."}]},
            {"role": "user", "content": [{"type": "text", "text": "Where is "},
                                         {"type": "text", "text": "my order?"}]},
            # What the openai SDK's `message.model_dump()` adds to an answer it resends.
            {**CALL, "refusal": None, "audio": None, "function_call": None, "annotations": [],
             "reasoning_content": "think"},
            {**RESULT, "name": "get_order"},
        )
    )  # fmt: skip
    assert as_parts == plain
    assert history(body({**SYSTEM, "role": "developer"}, USER)) == history(body(SYSTEM, USER))


def test_what_a_conversation_says_and_calls_makes_it_differ() -> None:
    base = history(body(SYSTEM, USER, CALL, RESULT)).tip
    renamed = {**CALL, "tool_calls": [{**CALL["tool_calls"][0], "id": "c2"}]}
    other_args = {**CALL, "tool_calls": [{**CALL["tool_calls"][0],
                  "function": {"name": "get_order", "arguments": '{"id": "8"}'}}]}  # fmt: skip
    assert history(body(SYSTEM, USER, renamed, RESULT)).tip != base
    assert history(body(SYSTEM, USER, other_args, RESULT)).tip != base
    assert history(body(SYSTEM, USER, CALL, {**RESULT, "content": "{}"})).tip != base
    assert history(body(SYSTEM, USER, CALL, RESULT, model="n")).tip != base


def test_a_body_without_messages_or_with_odd_ones_has_a_history() -> None:
    assert history({"model": "m"}) == history(body())
    odd = history(body("not a message", {"role": "assistant", "tool_calls": ["?"]}))  # type: ignore[arg-type]
    assert len(odd.prefixes) == 1


def test_a_long_conversation_keeps_its_last_prefixes() -> None:
    messages: list[dict[str, Any]] = [SYSTEM, USER]
    for i in range(MAX_PREFIXES + 4):
        messages += [
            {"role": "assistant", "content": f"a{i}"},
            {"role": "user", "content": f"u{i}"},
        ]
    whole = history(body(*messages))
    assert len(whole.prefixes) == MAX_PREFIXES
    assert whole.prefixes[0] == history(body(*messages[:-2])).tip
