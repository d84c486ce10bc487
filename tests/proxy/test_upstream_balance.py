"""Tests for proxy/upstream_balance.py: which replica a request's next try goes to."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from proxy.upstream_balance import Balancer, ReplicaState


def states(*outstanding: int) -> list[ReplicaState]:
    """Replicas with the outstanding requests given, none cooling."""
    made = []
    for count in outstanding:
        state = ReplicaState()
        state.outstanding = count
        made.append(state)
    return made


def test_the_replica_with_the_fewest_outstanding_requests_is_picked() -> None:
    assert Balancer(states(3, 1, 2)).pick(now=0.0) == 1


def test_equal_replicas_take_turns() -> None:
    balancer = Balancer(states(0, 0, 0))
    assert [balancer.pick(now=0.0) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_a_tie_goes_to_the_next_one_in_turn_among_the_least_loaded() -> None:
    balancer = Balancer(states(0, 5, 0, 0))
    assert [balancer.pick(now=0.0) for _ in range(4)] == [0, 2, 3, 0]


def test_a_cooling_replica_is_passed_over_until_its_cool_down_ends() -> None:
    replicas = states(0, 9)
    replicas[0].cool(now=100.0, seconds=5.0)
    balancer = Balancer(replicas)
    assert balancer.pick(now=101.0) == 1
    assert balancer.pick(now=104.9) == 1
    assert balancer.pick(now=105.0) == 0
    assert replicas[0].cooldowns == 1


def test_with_every_replica_cooling_the_one_whose_cool_down_ends_first_is_tried() -> None:
    replicas = states(0, 0, 0)
    replicas[0].cool(now=10.0, seconds=5.0)
    replicas[1].cool(now=8.0, seconds=5.0)
    replicas[2].cool(now=9.0, seconds=5.0)
    assert Balancer(replicas).pick(now=11.0) == 1


def test_a_failure_while_cooling_starts_the_cool_down_again() -> None:
    state = ReplicaState()
    state.cool(now=0.0, seconds=5.0)
    state.cool(now=4.0, seconds=5.0)
    assert state.cooling(8.0)
    assert not state.cooling(9.0)
    assert state.cooldowns == 2


def test_a_retry_prefers_a_replica_the_request_has_not_tried() -> None:
    # The first try got a 503 from replica 0 (an answer: no cool-down); replica 1 is busier, but
    # the retry goes there rather than back.
    assert Balancer(states(0, 4, 6)).pick(now=0.0, tried=[0]) == 1


def test_a_retry_goes_back_to_a_tried_replica_rather_than_to_a_cooling_one() -> None:
    replicas = states(0, 0)
    replicas[1].cool(now=0.0, seconds=5.0)
    assert Balancer(replicas).pick(now=1.0, tried=[0]) == 0


@given(
    outstanding=st.lists(st.integers(0, 5), min_size=1, max_size=6),
    cool_ends=st.lists(st.none() | st.floats(2.0, 9.0), min_size=6, max_size=6),
    picks=st.integers(1, 20),
)
def test_a_pick_is_the_least_loaded_replica_not_cooling_else_the_first_to_cool_off(
    outstanding: list[int], cool_ends: list[float | None], picks: int
) -> None:
    replicas = states(*outstanding)
    for state, end in zip(replicas, cool_ends, strict=False):
        if end is not None:
            state.cool(now=end - 10.0, seconds=10.0)
    balancer = Balancer(replicas)
    for _ in range(picks):
        chosen = replicas[balancer.pick(now=1.0)]
        available = [s for s in replicas if not s.cooling(1.0)]
        if available:
            assert chosen in available
            assert chosen.outstanding == min(s.outstanding for s in available)
        else:
            assert chosen.cool_until == min(s.cool_until for s in replicas)
        chosen.outstanding += 1  # the try is under way


def test_equal_replicas_share_picks_evenly() -> None:
    balancer = Balancer(states(0, 0, 0, 0))
    assert Counter(balancer.pick(now=0.0) for _ in range(40)) == {0: 10, 1: 10, 2: 10, 3: 10}
