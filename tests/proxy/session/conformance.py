"""The behaviour every `SessionStore` must show, whatever keeps the counts.

A test module subclasses `StoreConformance` and provides a `make_store` fixture: a callable
`(ttl_seconds, clock) -> SessionStore` whose stores are closed after the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from proxy.protocols.chat.request import history
from proxy.session.budget import SessionTracking, message_hints, scoped
from proxy.session.history import MAX_PER_TIP, History
from proxy.session.stores import SessionRecord, SessionStore, SessionUpdate
from proxy.session.tracking import unnamed_session

StoreFactory = Callable[..., SessionStore]

T0 = 1_700_000_000.0
TTL = 3600.0


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


async def record(
    store: SessionStore, session: str, clock: FakeClock, **counts: Any
) -> SessionRecord:
    counts.setdefault("max_errors", 10)
    return await store.record(session, now=clock(), **counts)


def conversation(task: str, turns: int, *, trial: str = "") -> dict[str, Any]:
    """A chat request of a conversation about `task` after `turns` rounds of a call and its
    result; `trial` names the calls (two runs of one task differ by their call ids)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a retail agent."},
        {"role": "user", "content": task},
    ]
    for i in range(turns):
        call = {"id": f"{trial}call_{i}", "type": "function",
                "function": {"name": "get_order", "arguments": "{}"}}  # fmt: skip
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": f"result {i}"},
        ]
    return {"model": "m", "messages": messages}


async def session_of(
    store: SessionStore, body: dict[str, Any], clock: FakeClock, owner: str | None = None
) -> str:
    """The session a request without a session header gets, as the pipeline finds it."""
    hints = message_hints(body, history)
    tracking = SessionTracking.HISTORY
    return await unnamed_session(store, body, hints, owner=owner, tracking=tracking, now=clock())


class StoreConformance:
    @pytest.fixture
    def clock(self) -> FakeClock:
        return FakeClock()

    @pytest.fixture
    def store(self, make_store: StoreFactory, clock: FakeClock) -> SessionStore:
        return make_store(ttl_seconds=TTL, clock=clock)

    async def test_an_unknown_session_is_none(self, store: SessionStore) -> None:
        assert await store.get("nobody") is None

    async def test_a_new_session_starts_from_the_given_counts(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        got = await record(
            store, "s1", clock, errors=1, repairs=2, requests=1, channels={"unknown_tool": 3}
        )
        assert (got.session, got.errors, got.repairs, got.requests) == ("s1", 1, 2, 1)
        assert got.channels == {"unknown_tool": 3}
        assert got.created_at == got.updated_at == clock()
        assert await store.get("s1") == got

    async def test_record_adds_to_what_is_there_and_moves_updated_at(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        await record(store, "s1", clock, errors=1, requests=1)
        later = clock.advance(5)
        got = await record(store, "s1", clock, errors=2, repairs=1, requests=1)
        assert (got.errors, got.repairs, got.requests) == (3, 1, 2)
        assert got.created_at == T0
        assert got.updated_at == later

    async def test_the_latest_max_errors_is_the_sessions_budget(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        await record(store, "s1", clock, errors=2, max_errors=10)
        got = await record(store, "s1", clock, max_errors=2)
        assert got.max_errors == 2
        assert got.exhausted

    async def test_channels_accumulate_per_channel(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        await record(store, "s1", clock, channels={"unknown_tool": 1, "schema_violation": 2})
        await record(store, "s1", clock, channels={"unknown_tool": 4, "tool_error": 1})
        got = await record(store, "s1", clock, channels={"truncated": 0})
        assert got.channels == {"unknown_tool": 5, "schema_violation": 2, "tool_error": 1}

    async def test_sessions_do_not_share_counts(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        await record(store, "a", clock, errors=1, channels={"unknown_tool": 1})
        await record(store, "b", clock, errors=5)
        a = await store.get("a")
        assert a is not None
        assert (a.errors, a.channels) == (1, {"unknown_tool": 1})

    async def test_concurrent_records_give_exact_totals(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        n = 200
        await asyncio.gather(
            *(
                record(
                    store,
                    "busy",
                    clock,
                    errors=1,
                    repairs=i % 2,
                    requests=1,
                    channels={"unknown_tool": 1, "schema_violation": i % 3},
                )
                for i in range(n)
            )
        )
        got = await store.get("busy")
        assert got is not None
        assert (got.errors, got.requests, got.repairs) == (n, n, n // 2)
        assert got.channels == {
            "unknown_tool": n,
            "schema_violation": sum(i % 3 for i in range(n)),
        }

    async def test_negative_increments_are_refused(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        with pytest.raises(ValueError, match="negative"):
            await record(store, "s1", clock, errors=-1)
        with pytest.raises(ValueError, match="negative"):
            await record(store, "s1", clock, channels={"unknown_tool": -2})
        assert await store.get("s1") is None

    async def test_a_linked_response_names_its_session_until_the_ttl_passes(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        assert await store.session_of_response("resp_1") is None
        await store.link_response("resp_1", "s1", now=clock())
        await store.link_response("resp_2", "s2", now=clock())
        assert await store.session_of_response("resp_1") == "s1"
        assert await store.session_of_response("resp_2") == "s2"
        clock.advance(TTL - 1)
        await store.link_response("resp_2", "s2", now=clock())  # a link is refreshed when resent
        clock.advance(2)
        assert await store.session_of_response("resp_1") is None
        assert await store.session_of_response("resp_2") == "s2"

    async def test_a_call_id_is_claimed_once(self, store: SessionStore, clock: FakeClock) -> None:
        assert await store.claim_call_ids("s1", ["c1", "c2"], now=clock()) == ["c1", "c2"]
        clock.advance(1)
        assert await store.claim_call_ids("s1", ["c1", "c2", "c3"], now=clock()) == ["c3"]
        assert await store.claim_call_ids("s1", [], now=clock()) == []

    async def test_duplicate_ids_in_one_claim_come_back_once(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        assert await store.claim_call_ids("s1", ["c1", "c1", "c2"], now=clock()) == ["c1", "c2"]

    async def test_claims_belong_to_one_session(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        await store.claim_call_ids("s1", ["c1"], now=clock())
        assert await store.claim_call_ids("s2", ["c1"], now=clock()) == ["c1"]

    async def test_concurrent_claims_of_one_id_give_it_to_exactly_one(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        ids = [f"call_{i}" for i in range(20)]
        results = await asyncio.gather(
            *(store.claim_call_ids("s1", ids, now=clock()) for _ in range(50))
        )
        claimed = [call_id for result in results for call_id in result]
        assert sorted(claimed) == sorted(ids)

    async def test_delete_forgets_the_session_and_its_claims(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        await record(store, "s1", clock, errors=3, channels={"unknown_tool": 3})
        await store.claim_call_ids("s1", ["c1"], now=clock())
        assert await store.delete("s1") is True
        assert await store.get("s1") is None
        assert await store.delete("s1") is False
        assert await store.claim_call_ids("s1", ["c1"], now=clock()) == ["c1"]
        fresh = await record(store, "s1", clock, errors=1)
        assert (fresh.errors, fresh.channels) == (1, {})

    async def test_list_recent_puts_the_latest_update_first(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        for name in ("a", "b", "c"):
            await record(store, name, clock, requests=1)
            clock.advance(1)
        await record(store, "a", clock, requests=1)
        listed = await store.list(order="recent")
        assert [r.session for r in listed] == ["a", "c", "b"]
        assert [r.session for r in await store.list(limit=2)] == ["a", "c"]

    async def test_list_failing_puts_the_most_errors_first(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        await record(store, "calm", clock, errors=0, requests=3)
        clock.advance(1)
        await record(store, "bad", clock, errors=4, channels={"unknown_tool": 4})
        clock.advance(1)
        await record(store, "worse", clock, errors=7)
        clock.advance(1)
        await record(store, "also_bad", clock, errors=4)
        listed = await store.list(order="failing", limit=3)
        assert [r.session for r in listed] == ["worse", "also_bad", "bad"]
        assert listed[2].channels == {"unknown_tool": 4}

    async def test_list_failing_puts_sessions_without_errors_after_by_recency(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        await record(store, "calm", clock, requests=1)
        clock.advance(1)
        await record(store, "turned", clock, requests=1)
        clock.advance(1)
        await record(store, "bad", clock, errors=1)
        clock.advance(1)
        await record(store, "calmer", clock, requests=1)
        clock.advance(1)
        await record(store, "turned", clock, errors=2)
        listed = await store.list(order="failing")
        assert [r.session for r in listed] == ["turned", "bad", "calmer", "calm"]
        assert [r.session for r in await store.list(order="failing", limit=3)] == [
            "turned",
            "bad",
            "calmer",
        ]

    async def test_list_of_an_empty_store_is_empty(self, store: SessionStore) -> None:
        assert await store.list() == []
        assert await store.list(order="failing") == []

    async def test_a_session_expires_ttl_after_its_last_update(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        await record(store, "s1", clock, errors=2)
        clock.advance(TTL - 1)
        await record(store, "s1", clock, errors=1)
        clock.advance(TTL - 1)
        alive = await store.get("s1")
        assert alive is not None
        assert alive.errors == 3
        clock.advance(1)
        assert await store.get("s1") is None
        assert await store.list() == []
        assert await store.delete("s1") is False

    async def test_an_expired_session_starts_afresh(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        await record(store, "s1", clock, errors=9, channels={"unknown_tool": 9}, requests=9)
        clock.advance(TTL)
        got = await record(store, "s1", clock, errors=1, requests=1)
        assert (got.errors, got.requests, got.channels) == (1, 1, {})
        assert got.created_at == clock()

    async def test_expiry_of_writes_follows_the_now_they_are_given(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        await record(store, "s1", clock, errors=5)
        got = await store.record("s1", max_errors=10, errors=1, now=T0 + TTL + 1)
        assert got.errors == 1

    async def test_a_claim_expires_ttl_after_it_was_last_claimed(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        await store.claim_call_ids("s1", ["c1", "c2"], now=clock())
        clock.advance(TTL - 1)
        assert await store.claim_call_ids("s1", ["c1"], now=clock()) == []
        clock.advance(1)
        assert await store.claim_call_ids("s1", ["c1", "c2"], now=clock()) == ["c2"]

    async def test_expired_sessions_leave_the_list_but_live_ones_stay(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        await record(store, "old", clock, errors=5)
        clock.advance(TTL / 2)
        await record(store, "new", clock, errors=1)
        clock.advance(TTL / 2)
        assert [r.session for r in await store.list(order="failing")] == ["new"]

    async def test_to_dict_has_the_session_api_shape(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        got = await record(
            store,
            "s1",
            clock,
            errors=2,
            max_errors=2,
            repairs=1,
            requests=3,
            channels={"unknown_tool": 3},
        )
        body = got.to_dict()
        assert list(body) == [
            "session", "errors", "max_errors", "exhausted", "repairs",
            "channels", "requests", "created_at", "updated_at",
        ]  # fmt: skip
        assert body["exhausted"] is True
        assert body["channels"] == {"unknown_tool": 3}
        created = datetime.fromisoformat(body["created_at"])
        assert created.utcoffset() is not None
        assert created.timestamp() == T0

    async def test_records_handed_out_are_copies(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        got = await record(store, "s1", clock, channels={"unknown_tool": 1})
        got.channels["unknown_tool"] = 100
        got.errors = 100
        again = await store.get("s1")
        assert again is not None
        assert (again.errors, again.channels) == (0, {"unknown_tool": 1})

    async def test_counts_add_up_and_an_unknown_set_is_empty(self, store: SessionStore) -> None:
        assert await store.read_counts("shadow") == {}
        await store.add_counts("shadow", {"pairs": 1, "outcome|agree": 1})
        await store.add_counts("shadow", {"pairs": 2, "outcome|both": 1})
        assert await store.read_counts("shadow") == {
            "pairs": 3,
            "outcome|agree": 1,
            "outcome|both": 1,
        }
        assert await store.read_counts("other") == {}

    async def test_counts_beyond_the_field_cap_add_only_to_fields_already_there(
        self, store: SessionStore
    ) -> None:
        await store.add_counts("names", {"a": 1, "b": 1}, max_fields=3)
        await store.add_counts("names", {"c": 1, "d": 5, "a": 2}, max_fields=3)
        await store.add_counts("names", {"e": 1, "b": 1}, max_fields=3)
        assert await store.read_counts("names") == {"a": 3, "b": 2, "c": 1}

    async def test_counts_are_not_session_records(self, store: SessionStore) -> None:
        await store.add_counts("s1", {"pairs": 1})
        assert await store.get("s1") is None
        assert await store.list() == []

    async def test_concurrent_count_increments_all_land(self, store: SessionStore) -> None:
        await asyncio.gather(*(store.add_counts("k", {"n": 1, "m": 2}) for _ in range(50)))
        assert await store.read_counts("k") == {"n": 50, "m": 100}

    async def test_a_negative_count_is_refused(self, store: SessionStore) -> None:
        with pytest.raises(ValueError, match="only grow"):
            await store.add_counts("k", {"n": -1})

    # Sessions scoped to client keys (budget.scoped): one store, shared by replicas, keeps each
    # key's sessions apart by their stored ids, and lists one key's alone.

    async def test_the_same_id_from_two_keys_is_two_sessions(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        a, b = scoped("key-A", "victim"), scoped("key-B", "victim")
        await record(store, b, clock, errors=12, channels={"tool_error": 12})
        assert await store.claim_call_ids(b, ["c1"], now=clock()) == ["c1"]
        assert await store.get(a) is None
        assert await store.claim_call_ids(a, ["c1"], now=clock()) == ["c1"]
        assert (await record(store, a, clock, requests=1)).errors == 0
        assert await store.delete(a) is True
        got = await store.get(b)
        assert got is not None
        assert got.errors == 12

    @pytest.mark.parametrize("order", ["recent", "failing"])
    async def test_a_prefix_lists_one_keys_sessions_only(
        self, store: SessionStore, clock: FakeClock, order: str
    ) -> None:
        # key-1 is a prefix of key-10's name; % and _ are LIKE's wildcards, / is τ²-bench's.
        mine = [scoped("key-1", s) for s in ("a/1", "50%_off", "x:y")]
        theirs = [scoped("key-10", "a/1"), scoped("key-2", "50%_off"), "key-1", "unscoped"]
        for i, session in enumerate(mine + theirs):
            await record(store, session, clock, errors=i, requests=1)
            clock.advance(1)
        listed = await store.list(order=order, prefix=scoped("key-1", ""))  # type: ignore[arg-type]
        assert sorted(r.session for r in listed) == sorted(mine)
        two = await store.list(order=order, limit=2, prefix=scoped("key-1", ""))  # type: ignore[arg-type]
        assert [r.session for r in two] == [mine[2], mine[1]]
        assert len(await store.list(order=order, limit=100)) == len(mine + theirs)  # type: ignore[arg-type]

    async def test_apply_counts_fresh_claims_in_their_channel_and_links_responses(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        update = SessionUpdate(
            10, requests=1, claims=["c1", "c2", "c1"], claimed_channel="tool_error"
        )
        got, fresh = await store.apply("s1", update, now=clock())
        assert fresh == ["c1", "c2"]
        assert (got.errors, got.requests, got.channels) == (2, 1, {"tool_error": 2})
        clock.advance(1)
        update = SessionUpdate(
            10,
            repairs=1,
            channels={"unknown_tool": 1},
            requests=1,
            claims=["c2", "c3"],
            claimed_channel="tool_error",
            responses=["resp_1"],
        )
        got, fresh = await store.apply("s1", update, now=clock())
        assert fresh == ["c3"]
        assert (got.errors, got.repairs, got.requests) == (3, 1, 2)
        assert got.channels == {"tool_error": 3, "unknown_tool": 1}
        assert (got.created_at, got.updated_at) == (T0, clock())
        assert await store.get("s1") == got
        assert await store.session_of_response("resp_1") == "s1"

    async def test_apply_without_a_claimed_channel_marks_claims_but_counts_only_its_counts(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        got, fresh = await store.apply(
            "s1", SessionUpdate(10, errors=1, claims=["c1"]), now=clock()
        )
        assert (fresh, got.errors, got.channels) == (["c1"], 1, {})
        assert await store.claim_call_ids("s1", ["c1"], now=clock()) == []
        clock.advance(TTL)
        _, fresh = await store.apply("s1", SessionUpdate(10, claims=["c1"]), now=clock())
        assert fresh == ["c1"]  # the mark expired a TTL after it was made

    async def test_an_update_with_a_negative_count_writes_nothing(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        update = SessionUpdate(10, channels={"unknown_tool": -1}, claims=["c1"], responses=["r"])
        with pytest.raises(ValueError, match="negative"):
            await store.apply("s1", update, now=clock())
        assert await store.get("s1") is None
        assert await store.claim_call_ids("s1", ["c1"], now=clock()) == ["c1"]
        assert await store.session_of_response("r") is None

    async def test_concurrent_applies_count_each_claim_once_and_every_request(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        ids = [f"call_{i}" for i in range(20)]
        update = SessionUpdate(100, requests=1, claims=ids, claimed_channel="tool_error")
        results = await asyncio.gather(*(store.apply("s1", update, now=clock()) for _ in range(50)))
        claimed = [call_id for _, fresh in results for call_id in fresh]
        assert sorted(claimed) == sorted(ids)
        got = await store.get("s1")
        assert got is not None
        assert (got.errors, got.requests, got.channels) == (20, 50, {"tool_error": 20})
        assert max(r.errors for r, _ in results) == 20

    # --- conversations by history (proxy.session.history) ---------------------------------------

    async def test_a_conversation_keeps_its_session_while_its_history_grows(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        first = await session_of(store, conversation("return", 0), clock)
        assert first.startswith("conv-")
        for turns in (1, 2, 3):
            clock.advance(1)
            assert await session_of(store, conversation("return", turns), clock) == first

    async def test_a_retry_of_any_turn_stays_in_its_conversation(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        first = await session_of(store, conversation("return", 0), clock)
        assert await session_of(store, conversation("return", 0), clock) == first
        assert await session_of(store, conversation("return", 1), clock) == first
        assert await session_of(store, conversation("return", 1), clock) == first
        assert await session_of(store, conversation("return", 2), clock) == first

    async def test_the_same_opening_after_the_first_moved_on_is_a_new_conversation(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        first = await session_of(store, conversation("return", 0), clock)
        await session_of(store, conversation("return", 1), clock)
        second = await session_of(store, conversation("return", 0), clock)
        assert second != first
        assert await session_of(store, conversation("return", 1, trial="b"), clock) == second
        assert await session_of(store, conversation("return", 2), clock) == first

    async def test_a_shorter_or_diverging_history_starts_a_new_session(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        first = await session_of(store, conversation("return", 0), clock)
        await session_of(store, conversation("return", 1), clock)
        await session_of(store, conversation("return", 2), clock)
        shorter = await session_of(store, conversation("return", 1), clock)
        assert shorter != first
        rewritten = conversation("return", 3)
        rewritten["messages"][1]["content"] = "exchange"  # the opening rewritten
        assert await session_of(store, rewritten, clock) not in (first, shorter)
        assert await session_of(store, conversation("return", 3), clock) == first

    async def test_two_identical_conversations_become_two_sessions_once_they_differ(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        a0 = await session_of(store, conversation("return", 0), clock)
        b0 = await session_of(store, conversation("return", 0), clock)
        assert a0 == b0  # identical so far: they cannot be told apart
        a1 = await session_of(store, conversation("return", 1, trial="a"), clock)
        b1 = await session_of(store, conversation("return", 1, trial="b"), clock)
        assert a1 == a0
        assert b1 != a1
        for turns in (2, 3):  # interleaved, each stays in its own
            assert await session_of(store, conversation("return", turns, trial="a"), clock) == a1
            assert await session_of(store, conversation("return", turns, trial="b"), clock) == b1

    async def test_concurrent_continuations_of_two_identical_conversations_get_two_sessions(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        opened = await asyncio.gather(
            *(session_of(store, conversation("return", 0), clock) for _ in range(2))
        )
        assert opened[0] == opened[1]
        got = await asyncio.gather(
            session_of(store, conversation("return", 1, trial="x"), clock),
            session_of(store, conversation("return", 1, trial="y"), clock),
        )
        assert len(set(got)) == 2
        assert opened[0] in got

    async def test_a_conversation_idle_for_a_ttl_is_forgotten(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        first = await session_of(store, conversation("return", 0), clock)
        clock.advance(TTL - 1)
        assert await session_of(store, conversation("return", 1), clock) == first
        clock.advance(TTL)
        assert await session_of(store, conversation("return", 2), clock) != first

    async def test_a_conversation_is_never_joined_from_another_client_key(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        mine = await session_of(store, conversation("return", 0), clock, owner="key-1")
        assert mine.startswith(scoped("key-1", "conv-"))
        theirs = await session_of(store, conversation("return", 1), clock, owner="key-2")
        assert theirs.startswith(scoped("key-2", "conv-"))
        assert await session_of(store, conversation("return", 1), clock, owner="key-1") == mine
        assert await session_of(store, conversation("return", 0), clock) != mine

    async def test_a_history_remembers_its_newest_conversations_only(
        self, store: SessionStore, clock: FakeClock
    ) -> None:
        count = MAX_PER_TIP + 2
        opened = []
        for i in range(count):  # identical conversations, each opened once the last moved on
            opened.append(await store.track_conversation(History("t0", ()), f"s{i}", now=clock()))
            await store.track_conversation(History("t1", ("t0",)), "unused", now=clock())
        assert opened == [f"s{i}" for i in range(count)]
        continued = [
            await store.track_conversation(History(f"t2-{i}", ("t1",)), f"n{i}", now=clock())
            for i in range(count)
        ]
        assert continued == [*opened[2:], f"n{count - 2}", f"n{count - 1}"]
