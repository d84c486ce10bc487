"""Tests for proxy/protocols/messages/request.py: session hints and tool results read, and the conversation continued by a re-ask."""

from __future__ import annotations

import pytest

from proxy.guard.toolcheck import validate
from proxy.protocols.messages.reply import THINKING_KEY
from proxy.protocols.messages.request import history
from proxy.session.budget import content_text, fingerprint_of, resolve_session
from tests.proxy.protocols.messages.test_adapter import BODY, PROTOCOL, TOOLS, guard_call


@pytest.mark.parametrize(
    ("user_id", "declared", "user"),
    [
        # JSON only Python's parser takes: the session inside is still read.
        ('{"session_id": "cc-2", "score": NaN}', "cc-2", None),
        ('{"session_id": "cc-3", "note": "\\ud800"}', "cc-3", None),  # a lone surrogate
        ('{"session_id": "cc-4"', None, '{"session_id": "cc-4"'),  # not JSON: the user id
        ('{"device_id": "d"}', None, '{"device_id": "d"}'),
    ],
)
def test_the_session_inside_a_user_id_is_read_as_pythons_json_parser_reads_it(
    user_id: str, declared: object, user: object
) -> None:
    hints = PROTOCOL.view({**BODY, "metadata": {"user_id": user_id}}, None).hints
    assert (hints.declared, hints.user) == (declared, user)


def test_the_fingerprint_reads_text_blocks_as_content_text_does() -> None:
    odd = {"type": "text", "text": 7}  # not a string: its canonical JSON, as content_text has it
    s1, s2, u = ({"type": "text", "text": t} for t in ("S1", "S2", "U"))
    odd_text = content_text([odd])
    for system, user, expected in [
        ([s1, s2], [u], ("S1S2", "U")),
        ([s1, odd], [odd, u], ("S1" + odd_text, odd_text + "U")),
        ([s1, {"type": "image"}, odd], [odd, "stray", u], ("S1" + odd_text, odd_text + "U")),
        ([], [], ("", "")),
    ]:
        body = {
            **BODY,
            "system": system,
            "messages": [
                {"role": "assistant", "content": "before the user"},
                {"role": "user", "content": user},
            ],
        }
        assert PROTOCOL.view(body, None).hints.fingerprint == ("m", *expected)


def test_the_opening_text_is_read_only_when_the_session_falls_back_to_the_fingerprint() -> None:
    def unread(content: object) -> str:
        raise AssertionError(f"read {content!r} for a session the body names")

    system = [{"type": "text", "text": "S1"}, {"type": "text", "text": "S2"}]
    body = {**BODY, "system": system, "metadata": {"user_id": '{"session_id": "cc-9"}'}}
    named = PROTOCOL.view(body, None).hints
    assert resolve_session({}, named._replace(read=unread)) == "cc-9"
    anonymous = PROTOCOL.view({**body, "metadata": {}}, None).hints
    assert resolve_session({}, anonymous) == fingerprint_of("m", "S1S2", "List files.")


def test_tool_results_are_found_beside_blocks_that_are_not_objects() -> None:
    result = {
        "type": "tool_result",
        "tool_use_id": "t1",
        "content": [{"type": "text", "text": "E"}],
    }
    body = {
        **BODY,
        "messages": [
            {"role": "user", "content": ["stray", result]},
            {"role": "user", "content": [{"type": "text", "text": "no result"}, 3]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "x"}, {**result, "tool_use_id": "t2"}],
            },
        ],
    }
    view = PROTOCOL.view(body, None)
    assert [(r.call_id, r.text) for r in view.tool_results] == [("t1", "E"), ("t2", "E")]


def test_a_reask_continues_with_the_answer_and_error_tool_results_in_messages_form() -> None:
    index = PROTOCOL.compile_tools(TOOLS)
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [guard_call("Bash", "{'command': 'ls'}", "t1")],
        THINKING_KEY: [{"type": "thinking", "thinking": "p", "signature": "sig"}],
    }
    found = validate(message, None, index=index)
    request = PROTOCOL.reask(BODY, message, found, index)
    assert "stream" not in request
    assert request["messages"][:-2] == BODY["messages"]
    assistant, user = request["messages"][-2:]
    assert assistant["content"] == [
        {"type": "thinking", "thinking": "p", "signature": "sig"},
        {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}},  # only objects go back
    ]
    (result,) = user["content"]
    assert (result["tool_use_id"], result["is_error"]) == ("t1", True)
    assert "JSON object" in result["content"]
    empty = {"role": "assistant", "content": None}
    request = PROTOCOL.reask(BODY, empty, validate(empty, None, index=index), index)
    (note,) = request["messages"][len(BODY["messages"]) :]  # nothing to repeat, a user note
    assert note["role"] == "user"
    assert note["content"][0]["type"] == "text"


def test_the_history_of_a_messages_request_is_extended_by_its_next_turn() -> None:
    system = [
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}
    ]
    opening = {
        "model": "m",
        "system": system,
        "messages": [{"role": "user", "content": "List files."}],
    }
    answer = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "s"},
            {"type": "text", "text": "Listing."},
            {"type": "tool_use", "id": "tu1", "name": "Bash", "input": {"command": "ls"}},
        ],
    }
    results = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "tu1", "content": "Error: denied", "is_error": True},
        {"type": "text", "text": "Go on."},
    ]}  # fmt: skip
    first = history(opening)
    second = history({**opening, "messages": [*opening["messages"], answer, results]})
    assert second.prefixes == (first.tip,)
    # The cache mark moved, the thinking dropped, the strings as blocks: the same history.
    resent = {
        "model": "m",
        "system": "You are Claude Code.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "List files.",
                                          "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": answer["content"][1:]},
            results,
        ],
    }  # fmt: skip
    assert history(resent) == second
    other_input = {**answer, "content": [*answer["content"][:2],
                   {"type": "tool_use", "id": "tu1", "name": "Bash", "input": {"command": "pwd"}}]}  # fmt: skip
    assert history({**opening, "messages": [*opening["messages"], other_input, results]}) != second
