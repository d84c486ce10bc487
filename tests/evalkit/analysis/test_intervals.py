"""Property tests: every bootstrap interval evalkit draws contains its own point estimate, over
generated runs, because each resample computes the point estimate's own estimator (the basic
interval, as the shadow's figures) and an interval that could not contain it is not drawn."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from evalkit.analysis.compare import signature_statistics
from evalkit.analysis.stats import basic_interval, basic_interval_refusal, cluster_bootstrap_ci


@dataclass(frozen=True)
class _Episode:
    """What `signature_statistics` reads of an episode: its task and its failures' signatures."""

    task_id: str
    counts: tuple[int, ...]


def _signatures(episodes: Sequence[Any]) -> Counter[str]:
    total: Counter[str] = Counter()
    for episode in episodes:
        total.update({f"s{i}": n for i, n in enumerate(episode.counts) if n})
    return total


@st.composite
def _runs(draw: st.DrawFn) -> tuple[list[_Episode], list[_Episode]]:
    """Two runs over the same tasks, each episode failing with a few signatures a few times —
    sparsely, as (task, channel) signatures do: most signatures absent from most episodes."""
    tasks = draw(st.integers(2, 25))
    keys = draw(st.integers(2, 12))
    counts = st.tuples(*[st.sampled_from([0, 0, 0, 0, 1, 2, 3])] * keys)
    return (
        [_Episode(str(t), draw(counts)) for t in range(tasks)],
        [_Episode(str(t), draw(counts)) for t in range(tasks)],
    )


def _contains(interval: tuple[float, float] | None, estimate: float | None) -> bool:
    return interval is None or (estimate is not None and interval[0] <= estimate <= interval[1])


@settings(max_examples=100, deadline=None)
@given(runs=_runs(), seed=st.integers(0, 50))
def test_signature_intervals_contain_their_estimates(
    runs: tuple[list[_Episode], list[_Episode]], seed: int
) -> None:
    a, b = (cast(Any, side) for side in runs)
    stats = signature_statistics("calls", a, b, _signatures, 0.95, 200, seed)
    assert _contains(stats.correlation_ci, stats.correlation)
    assert _contains(stats.novel_ci, stats.novel)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.sampled_from([-1.0, 0.0, 0.5, 1.0]), min_size=1, max_size=30),
    seed=st.integers(0, 50),
)
def test_mean_intervals_contain_the_mean(values: list[float], seed: int) -> None:
    low, high = cluster_bootstrap_ci(values, resamples=300, seed=seed)
    mean = float(np.mean(values))
    assert low[0] - 1e-12 <= mean <= high[0] + 1e-12


@given(
    estimate=st.floats(-1, 1),
    replicates=st.lists(st.one_of(st.none(), st.floats(-1, 1)), max_size=40),
    bounds=st.sampled_from([(-1.0, 1.0), (0.0, 1.0)]),
)
def test_a_basic_interval_is_drawn_only_around_its_estimate_and_within_its_range(
    estimate: float, replicates: list[float | None], bounds: tuple[float, float]
) -> None:
    estimate = max(bounds[0], estimate)
    interval = basic_interval(estimate, replicates, bounds=bounds)
    assert _contains(interval, estimate)
    refusal = basic_interval_refusal(estimate, replicates, bounds=bounds)
    assert (interval is None) == (refusal is not None)
    if interval is not None:
        assert bounds[0] <= interval[0] < interval[1] <= bounds[1]  # clipped, never a point


def test_a_share_at_its_edge_whose_interval_clips_to_a_point_gets_none_and_a_reason() -> None:
    # 2·0 − q: the basic interval of a share of 0 whose resamples read higher lies below 0.
    replicates = [0.0] * 90 + [0.05] * 10
    assert basic_interval(0.0, replicates, bounds=(0.0, 1.0)) is None
    assert basic_interval_refusal(0.0, replicates, bounds=(0.0, 1.0)) == (
        "clipped to the figure's range, the interval is a single point"
    )
    assert basic_interval_refusal(0.5, [0.5] * 5) == "the resamples do not vary"
