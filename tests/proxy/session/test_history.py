"""The digests of a history and the rule that follows a conversation by them (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.session.history import (
    ASSISTANT,
    MAX_PER_TIP,
    MAX_PREFIXES,
    SYSTEM,
    TOOL,
    USER,
    History,
    Item,
    assistant,
    digest_history,
    follow,
)

TTL = 100.0


def opening() -> list[Item]:
    return [(SYSTEM, "You are a retail agent."), (USER, "I want to return an order.")]


def rounds(n: int, start: int = 0) -> list[Item]:
    """`n` rounds of an assistant's call and its tool result."""
    items: list[Item] = []
    for i in range(start, start + n):
        items += [assistant("", [(f"call_{i}", "get_order", "{}")]), (TOOL, f"call_{i}", "{}")]
    return items


# --- digests ------------------------------------------------------------------------------


def test_the_next_request_has_the_previous_request_as_its_longest_prefix() -> None:
    first = digest_history("m", opening())
    second = digest_history("m", opening() + rounds(1))
    third = digest_history("m", opening() + rounds(2))
    assert second.prefixes[0] == first.tip
    assert third.prefixes[0] == second.tip
    assert third.prefixes[1] == first.tip


def test_an_opening_has_no_prefix_and_each_assistant_turn_adds_one() -> None:
    assert digest_history("m", opening()).prefixes == ()
    assert len(digest_history("m", opening() + rounds(3)).prefixes) == 3


def test_consecutive_assistant_items_are_one_turn() -> None:
    # A Responses answer: a message item, then its calls, each an item of its own.
    items = [*opening(), assistant("Looking."), assistant("", [("c1", "f", "{}")])]
    history = digest_history("m", [*items, (TOOL, "c1", "ok")])
    assert history.prefixes == (digest_history("m", opening()).tip,)


def test_only_the_last_prefixes_are_kept_longest_first() -> None:
    many = digest_history("m", opening() + rounds(MAX_PREFIXES + 3))
    assert len(many.prefixes) == MAX_PREFIXES
    assert many.prefixes[0] == digest_history("m", opening() + rounds(MAX_PREFIXES + 2)).tip
    assert many.prefixes[-1] == digest_history("m", opening() + rounds(3)).tip


def test_the_digests_depend_on_every_item_the_model_and_the_order() -> None:
    base = digest_history("m", opening() + rounds(1)).tip
    assert digest_history("other", opening() + rounds(1)).tip != base
    assert digest_history("m", opening() + rounds(1, start=7)).tip != base
    assert digest_history("m", list(reversed(opening())) + rounds(1)).tip != base
    assert digest_history("m", opening()[:1] + rounds(1)).tip != base


def test_items_cannot_run_into_each_other() -> None:
    assert (
        digest_history("m", [(USER, "ab"), (USER, "c")]).tip
        != digest_history("m", [(USER, "a"), (USER, "bc")]).tip
    )


def test_a_lone_surrogate_in_a_text_is_digested() -> None:
    one = digest_history("m", [(USER, "\ud800")])
    assert one == digest_history("m", [(USER, "\ud800")])
    assert one.tip != digest_history("m", [(USER, "\ud801")]).tip


@given(st.lists(st.sampled_from([USER, ASSISTANT, TOOL]), max_size=30))
def test_every_prefix_is_the_tip_of_the_history_before_an_assistant_turn(roles: list[str]) -> None:
    items: list[Item] = [
        assistant(str(i)) if r == ASSISTANT else (r, str(i)) for i, r in enumerate(roles)
    ]
    history = digest_history("m", items)
    starts = [
        i for i, r in enumerate(roles) if r == ASSISTANT and (i == 0 or roles[i - 1] != ASSISTANT)
    ]
    expected = [digest_history("m", items[:i]).tip for i in reversed(starts)][:MAX_PREFIXES]
    assert list(history.prefixes) == expected
    assert history.tip == digest_history("m", list(items)).tip


# --- follow ---------------------------------------------------------------------------------


class Lists(dict[str, list[tuple[str, float]]]):
    """The lists a store keeps, written back as a store writes them."""

    def resolve(self, history: History, new: str, now: float = 0.0) -> str:
        session, writes = follow(self, history, new, now=now, ttl=TTL)
        for digest, entries in writes.items():
            if entries:
                self[digest] = entries
            else:
                self.pop(digest, None)
        return session


def test_a_request_that_extends_a_conversation_joins_it() -> None:
    lists = Lists()
    assert lists.resolve(History("t1", ()), "a") == "a"
    assert lists.resolve(History("t2", ("t1",)), "b") == "a"
    assert lists == {"t2": [("a", 0.0)]}


def test_an_exact_repeat_is_a_retry_and_stays_in_its_conversation() -> None:
    lists = Lists()
    lists.resolve(History("t1", ()), "a")
    assert lists.resolve(History("t1", ()), "b", now=5.0) == "a"
    assert lists == {"t1": [("a", 5.0)]}


def test_two_identical_conversations_part_at_their_first_continuation() -> None:
    lists = Lists()
    assert lists.resolve(History("t1", ()), "a") == "a"
    assert lists.resolve(History("t1", ()), "b") == "a"  # identical so far: one session
    assert lists.resolve(History("t2", ("t1",)), "c") == "a"
    assert lists.resolve(History("t2x", ("t1",)), "d") == "d"  # the other one, now apart


def test_the_longest_prefix_with_a_conversation_wins() -> None:
    lists = Lists({"p1": [("long", 0.0)], "p2": [("short", 0.0)]})
    assert lists.resolve(History("t", ("p1", "p2")), "new") == "long"
    assert lists.resolve(History("u", ("p1", "p2")), "new") == "short"


def test_expired_entries_are_not_followed() -> None:
    lists = Lists({"t1": [("old", 0.0)]})
    assert lists.resolve(History("t2", ("t1",)), "new", now=TTL) == "new"
    assert lists.resolve(History("t2", ()), "again", now=TTL + 1) == "new"


def test_a_digest_keeps_its_newest_conversations() -> None:
    lists = Lists({"p": [(f"s{i}", 0.0) for i in range(MAX_PER_TIP + 2)]})
    for i in range(MAX_PER_TIP + 2):
        lists.resolve(History("t", (f"x{i}", "p")), "new")
    assert [s for s, _ in lists["t"]] == [f"s{i}" for i in range(2, MAX_PER_TIP + 2)]
    assert "p" not in lists
