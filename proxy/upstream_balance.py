"""Choosing a replica of a deployment for a request's next try (DESIGN §8): the one with the
fewest outstanding requests, ties taken in turn, a replica that failed passed over while it
cools down. Pure: no I/O and no clock (the caller says what time it is); `proxy.upstream_replicas`
sends the tries.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


class ReplicaState:
    """What the balancer knows of one replica: the tries under way on it (`outstanding`), until
    when it cools down (`cool_until`, on the caller's clock) and how often it did."""

    __slots__ = ("cool_until", "cooldowns", "outstanding")

    def __init__(self) -> None:
        self.outstanding = 0
        self.cool_until = float("-inf")
        self.cooldowns = 0

    def cooling(self, now: float) -> bool:
        """Whether the replica is passed over at `now` (while another one is not)."""
        return now < self.cool_until

    def cool(self, now: float, seconds: float) -> None:
        """A try failed before its answer's first byte at `now`: pass the replica over for
        `seconds` from now (a failure while it cools starts its cool-down again)."""
        self.cool_until = now + seconds
        self.cooldowns += 1


class Balancer:
    """Picks among a fixed list of replicas (`pick`); keeps the turn that breaks ties."""

    __slots__ = ("_next", "states")

    def __init__(self, states: Sequence[ReplicaState]) -> None:
        if not states:
            raise ValueError("a balancer needs a replica")
        self.states = states
        self._next = 0  # where the search for the next tie's winner starts

    def pick(self, now: float, tried: Collection[int] = ()) -> int:
        """The index of the replica for a request's next try at `now`, `tried` holding the
        indices its earlier tries went to.

        Of the replicas not cooling, one this request has not tried yet if there is one, the
        fewest outstanding requests first; with every replica cooling, the one whose cool-down
        ends first (a request is never refused for want of a replica). Among equals, the first
        from where the last pick left off, so equal replicas take turns.
        """
        states = self.states
        count = len(states)
        start = self._next
        best = start % count
        best_key = _rank(states[best], best in tried, now)
        for step in range(1, count):
            index = (start + step) % count
            key = _rank(states[index], index in tried, now)
            if key < best_key:
                best, best_key = index, key
        self._next = best + 1
        return best


def _rank(state: ReplicaState, tried: bool, now: float) -> tuple[int, float]:
    """A replica's place in the order `Balancer.pick` takes them in, lowest first: not cooling
    and untried by fewest outstanding, then not cooling, then cooling by the end of it."""
    if state.cooling(now):
        return 2, state.cool_until
    return (1 if tried else 0), state.outstanding
