from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.errors import BadRequestError
from proxy.session.budget import (
    MAX_SESSION_ID_LENGTH,
    ErrorBudget,
    ExhaustionPolicy,
    content_text,
    fingerprint,
    fingerprint_of,
    message_hints,
    named_session,
    owned,
    resolve_session,
    resolve_session_id,
    scoped,
    tool_errors_in,
)


def make_body(
    *,
    model: str = "qwen3-8b-int4",
    system: Any = "You are a retail agent.",
    first_user: Any = "I want to return an order.",
    turns: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    """A chat request whose history has `turns` assistant/tool/user rounds after the opening."""
    messages: list[dict[str, Any]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": first_user})
    for i in range(turns):
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": "get_order", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"call_{i}", "content": "{}"},
            {"role": "user", "content": f"turn {i}"},
        ]
    return {"model": model, "messages": messages, **extra}


# --- session-id resolution -------------------------------------------------------------


def test_the_header_wins_over_metadata_and_user() -> None:
    body = make_body(metadata={"session_id": "from-metadata"}, user="from-user")
    assert resolve_session_id({"x-session-id": "from-header"}, body) == "from-header"


def test_metadata_session_id_wins_over_user() -> None:
    body = make_body(metadata={"session_id": "from-metadata"}, user="from-user")
    assert resolve_session_id({}, body) == "from-metadata"


def test_user_is_used_when_nothing_more_specific_is_given() -> None:
    assert resolve_session_id({}, make_body(user="customer-42")) == "customer-42"


def test_without_any_id_the_session_is_a_fingerprint() -> None:
    session = resolve_session_id({}, make_body())
    assert session.startswith("fp-")
    assert session == fingerprint(make_body())


@pytest.mark.parametrize("name", ["X-Conversation", "x-conversation", "X-CONVERSATION"])
def test_the_header_name_is_configurable_in_any_case(name: str) -> None:
    headers = {"x-session-id": "ignored", "x-conversation": "conv-1"}
    assert resolve_session_id(headers, make_body(), header_name=name) == "conv-1"


def test_blank_values_count_as_absent() -> None:
    body = make_body(metadata={"session_id": "  "}, user="")
    assert resolve_session_id({"x-session-id": " "}, body).startswith("fp-")


def test_surrounding_whitespace_is_stripped() -> None:
    assert resolve_session_id({"x-session-id": "  abc \t"}, make_body()) == "abc"


@pytest.mark.parametrize(
    "bad",
    ["a" * (MAX_SESSION_ID_LENGTH + 1), "tab\there", "new\nline", "naïve", "\x00"],
)
def test_an_invalid_header_id_is_a_bad_request(bad: str) -> None:
    with pytest.raises(BadRequestError, match="invalid session id") as caught:
        resolve_session_id({"x-session-id": bad}, make_body())
    assert caught.value.param == "x-session-id"


def test_an_id_of_the_longest_allowed_length_is_accepted() -> None:
    longest = "a" * MAX_SESSION_ID_LENGTH
    assert resolve_session_id({"x-session-id": longest}, make_body()) == longest


@pytest.mark.parametrize("bad", ["x" * 500, "bad\x07id", 42])
def test_an_invalid_metadata_session_id_is_a_bad_request(bad: Any) -> None:
    with pytest.raises(BadRequestError) as caught:
        resolve_session_id({}, make_body(metadata={"session_id": bad}))
    assert caught.value.param == "metadata.session_id"


def test_a_user_that_is_not_a_valid_id_is_hashed_to_a_stable_one() -> None:
    first = resolve_session_id({}, make_body(user="Zoë Müller"))
    again = resolve_session_id({}, make_body(user="Zoë Müller", turns=3))
    other = resolve_session_id({}, make_body(user="Zoe Muller"))
    assert first.startswith("user-")
    assert first == again
    assert other == "Zoe Muller"


def test_a_user_that_is_not_a_string_is_ignored() -> None:
    assert resolve_session_id({}, make_body(user=["not", "an", "id"])).startswith("fp-")


@given(st.text(max_size=300))
def test_every_resolved_id_is_printable_ascii_of_bounded_length(user: str) -> None:
    session = resolve_session_id({}, make_body(user=user))
    assert 0 < len(session) <= MAX_SESSION_ID_LENGTH
    assert all(" " <= char <= "~" for char in session)


# --- fingerprint -----------------------------------------------------------------------


def test_the_fingerprint_is_stable_across_turns_of_one_conversation() -> None:
    assert len({fingerprint(make_body(turns=n)) for n in range(5)}) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"model": "qwen3-8b-bf16"},
        {"system": "You are a telecom agent."},
        {"first_user": "Where is my parcel?"},
        {"system": None},
    ],
)
def test_different_conversations_get_different_fingerprints(change: dict[str, Any]) -> None:
    assert fingerprint(make_body(**change)) != fingerprint(make_body())


def test_content_parts_fingerprint_like_the_same_text_as_a_string() -> None:
    parts = make_body(
        system=[{"type": "text", "text": "You are a retail agent."}],
        first_user=[
            {"type": "text", "text": "I want to return "},
            {"type": "text", "text": "an order."},
        ],
    )
    assert fingerprint(parts) == fingerprint(make_body())


def test_a_developer_message_plays_the_part_of_the_system_message() -> None:
    body = make_body(system=None)
    body["messages"].insert(0, {"role": "developer", "content": "You are a retail agent."})
    assert fingerprint(body) == fingerprint(make_body())


def test_a_body_without_messages_still_has_a_fingerprint() -> None:
    assert fingerprint({"model": "m"}) == fingerprint({"model": "m", "messages": []})
    assert fingerprint({}).startswith("fp-")


def test_the_fingerprint_of_a_conversation_never_changes() -> None:
    # Stored sessions are keyed by it: a proxy upgraded mid-conversation must find them again.
    body = make_body()
    assert fingerprint(body) == "fp-717984ac397ff137"
    assert fingerprint(body) == "fp-717984ac397ff137"  # remembered, the same
    texts = ("m", 'Ünïcode \u2603 "quoted" \\ back', "tab\there\nnewline \ud800")
    assert fingerprint_of(*texts) == "fp-16bce3b29315c444"


@given(st.text(max_size=20), st.text(max_size=200), st.text(max_size=200))
def test_the_fingerprint_hashes_the_json_of_model_system_and_user(
    model: str, system: str, user: str
) -> None:
    encoded = json.dumps([model, system, user]).encode("utf-8", "surrogatepass")
    expected = "fp-" + hashlib.sha256(encoded).hexdigest()[:16]
    assert fingerprint_of(model, system, user) == expected
    assert fingerprint_of(model, system, user) == expected


def test_more_openings_than_are_remembered_keep_their_fingerprints() -> None:
    def expected(system: str) -> str:
        return "fp-" + hashlib.sha256(json.dumps(["m", system, "u"]).encode()).hexdigest()[:16]

    openings = [f"You are agent {i}." for i in range(600)]
    for _ in range(2):
        assert [fingerprint_of("m", s, "u") for s in openings] == [expected(s) for s in openings]


def test_long_openings_are_fingerprinted_without_being_remembered() -> None:
    system = "You are a retail agent. " * 2000
    first = fingerprint(make_body(system=system))
    assert first == fingerprint(make_body(system=system))
    assert first != fingerprint(make_body(system=system + "!"))


def test_non_text_parts_still_distinguish_messages() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    other = {"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB"}}
    assert content_text([image]) != content_text([other])
    assert content_text(None) == ""


# --- error budget ----------------------------------------------------------------------


def test_the_default_budget_is_tau2_bench_s() -> None:
    budget = ErrorBudget()
    assert (budget.max_errors, budget.policy) == (10, ExhaustionPolicy.REJECT)


@pytest.mark.parametrize(
    ("errors", "exhausted", "remaining"),
    [(0, False, 3), (2, False, 1), (3, True, 0), (7, True, 0)],
)
def test_a_budget_is_exhausted_when_errors_reach_max_errors(
    errors: int, exhausted: bool, remaining: int
) -> None:
    budget = ErrorBudget(max_errors=3)
    assert budget.exhausted(errors) is exhausted
    assert budget.remaining(errors) == remaining


@given(max_errors=st.integers(1, 6), additions=st.lists(st.integers(0, 4), min_size=1, max_size=8))
def test_exactly_the_addition_that_reaches_the_budget_spends_it(
    max_errors: int, additions: list[int]
) -> None:
    budget, errors, spent = ErrorBudget(max_errors=max_errors), 0, []
    for added in additions:
        errors += added
        spent.append(budget.spent_by(errors, added))
    assert spent.count(True) == (1 if errors >= max_errors else 0)
    if True in spent:
        at = spent.index(True)
        assert sum(additions[:at]) < max_errors <= sum(additions[: at + 1])


def test_a_budget_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ErrorBudget(max_errors=0)


def test_policies_are_named_as_in_the_configuration() -> None:
    assert [p.value for p in ExhaustionPolicy] == ["reject", "finish", "observe"]
    assert ExhaustionPolicy("finish") is ExhaustionPolicy.FINISH


# --- tool errors -----------------------------------------------------------------------


def tool(call_id: str | None, content: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "tool", "content": content}
    if call_id is not None:
        message["tool_call_id"] = call_id
    return message


def test_tool_messages_starting_with_error_are_tool_errors() -> None:
    messages = [
        {"role": "user", "content": "Error in my order"},
        tool("c1", "Error: Tool 'get_ordr' not found."),
        tool("c2", '{"order_id": "#W1"}'),
        tool("c3", [{"type": "text", "text": "Error: Order not found"}]),
        tool("c4", "No Error here"),
    ]
    assert tool_errors_in(messages) == ["c1", "c3"]


def test_tool_errors_without_a_call_id_are_skipped_and_ids_appear_once() -> None:
    messages = [tool(None, "Error: x"), tool("c1", "Error: x"), tool("c1", "Error: y")]
    assert tool_errors_in(messages) == ["c1"]


def test_a_custom_rule_decides_what_an_error_is() -> None:
    messages = [tool("c1", '{"error": true}'), tool("c2", "Error: x"), tool("c3", "ok")]
    assert tool_errors_in(messages, rule=lambda text: '"error": true' in text) == ["c1"]


def test_no_tool_messages_means_no_tool_errors() -> None:
    assert tool_errors_in(make_body(turns=3)["messages"]) == []


# Sessions scoped to the client key that sent them (issue 32).

KEY_NAME = st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True)
SESSION_ID = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=200
)


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"x-session-id": "victim"}, make_body()),
        ({}, make_body(metadata={"session_id": "victim"})),
        ({}, make_body(user="alice")),
        ({}, make_body()),  # the fingerprint
    ],
)
def test_every_source_of_a_session_is_scoped_to_the_key(
    headers: dict[str, str], body: dict[str, Any]
) -> None:
    hints = message_hints(body)
    plain = resolve_session(headers, hints)
    a = resolve_session(headers, hints, owner="key-A")
    b = resolve_session(headers, hints, owner="key-B")
    assert (a, b) == (scoped("key-A", plain), scoped("key-B", plain))
    assert (owned("key-A", a), owned("key-A", b)) == (plain, None)


def test_a_response_chained_from_another_keys_session_does_not_continue_it() -> None:
    hints = message_hints(make_body())._replace(previous_response_id="resp_1")
    theirs = scoped("key-B", "victim")
    assert resolve_session({}, hints, owner="key-B", chained=theirs) == theirs
    mine = resolve_session({}, hints, owner="key-A", chained=theirs)
    assert mine == scoped("key-A", fingerprint(make_body()))


@given(KEY_NAME, SESSION_ID, KEY_NAME, SESSION_ID)
def test_two_keys_never_share_a_stored_session(
    key_a: str, session_a: str, key_b: str, session_b: str
) -> None:
    if (key_a, session_a) != (key_b, session_b):
        assert scoped(key_a, session_a) != scoped(key_b, session_b)
    assert owned(key_a, scoped(key_a, session_a)) == session_a
    if key_a != key_b:
        assert owned(key_b, scoped(key_a, session_a)) is None


def test_named_session_is_none_only_where_resolution_falls_back_to_the_opening() -> None:
    body = make_body()
    assert named_session({}, message_hints(body)) is None
    assert resolve_session({}, message_hints(body)) == fingerprint(body)
    assert named_session({}, message_hints(make_body(user="u-1")), owner="k") == "k:u-1"
    assert named_session({"x-session-id": "s"}, message_hints(body)) == "s"
    assert named_session({}, message_hints(body), chained="k:s", owner="k") == "k:s"
