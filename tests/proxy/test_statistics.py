"""The shared statistics (`proxy/statistics.py`) agree with scipy and with their textbook
formulas: the Wilson interval, Katz's interval of a relative risk, Spearman's correlation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats as scipy_stats
from scipy.stats.contingency import relative_risk as scipy_relative_risk

from proxy.statistics import Z_95, average_ranks, relative_risk, spearman, wilson, z_of

counts = st.integers(0, 500).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n)))


@given(st.integers(0, 60), st.integers(1, 60))
def test_wilson_matches_scipy(successes: int, extra: int) -> None:
    trials = successes + extra - 1 if successes else extra
    interval = wilson(successes, trials)
    expected = scipy_stats.binomtest(successes, trials).proportion_ci(method="wilson")
    assert interval is not None
    assert interval == pytest.approx((expected.low, expected.high), abs=1e-12)


def test_wilson_refuses_more_successes_than_trials_and_has_no_interval_without_trials() -> None:
    assert wilson(0, 0) is None
    with pytest.raises(ValueError, match="successes"):
        wilson(3, 2)
    with pytest.raises(ValueError, match="successes"):
        wilson(-1, 2)


@given(counts, st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_the_wilson_interval_holds_the_point_estimate_and_is_the_textbook_formula(
    count: tuple[int, int], confidence: float
) -> None:
    successes, trials = count
    if trials == 0:
        assert wilson(successes, trials) is None
        return
    z = z_of(confidence)
    interval = wilson(successes, trials, z)
    assert interval is not None
    low, high = interval
    p = successes / trials
    # Contains the point estimate, up to rounding (at p = 0 the low end is 0 give or take 1e-19).
    assert 0.0 <= low <= p + 1e-12
    assert p - 1e-12 <= high <= 1.0
    # (p + z²/2n ± z·sqrt(p(1−p)/n + z²/4n²)) / (1 + z²/n), written out directly.
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = (
        z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    )
    assert (low, high) == pytest.approx((max(0.0, centre - half), min(1.0, centre + half)))


def test_the_95_percent_quantile_is_the_normal_ones() -> None:
    assert z_of(0.95) == Z_95
    assert pytest.approx(1.959964, abs=1e-6) == Z_95


@given(counts, counts)
def test_relative_risk_matches_scipy(events: tuple[int, int], base: tuple[int, int]) -> None:
    (e, n), (b, m) = events, base
    got = relative_risk(e, n, b, m)
    if n == 0 or m == 0 or (e == 0 and b == 0):
        assert got is None
        return
    assert got is not None
    if e == 0 or b == 0:
        assert got.corrected
        e, n, b, m = e + 0.5, n + 1, b + 0.5, m + 1
        assert got.ratio == pytest.approx((e / n) / (b / m))
        return
    expected = scipy_relative_risk(e, n, b, m)
    low, high = expected.confidence_interval(0.95)
    assert not got.corrected
    assert (got.ratio, got.low, got.high) == pytest.approx(
        (expected.relative_risk, low, high), rel=1e-9
    )
    assert got.low <= got.ratio <= got.high


def test_average_ranks_share_ties() -> None:
    assert average_ranks([5, 1, 3, 3, 0]) == [5.0, 2.0, 3.5, 3.5, 1.0]
    assert average_ranks([]) == []


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), min_size=2, max_size=30))
def test_rank_correlation_matches_scipy(points: list[tuple[int, int]]) -> None:
    x = [float(a) for a, _ in points]
    y = [float(b) for _, b in points]
    got = spearman(x, y)
    if len(set(x)) == 1 or len(set(y)) == 1:
        assert got is None
        return
    assert got == pytest.approx(scipy_stats.spearmanr(x, y)[0], abs=1e-12)


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), min_size=2, max_size=30))
def test_spearman_is_symmetric_bounded_and_one_with_itself(points: list[tuple[int, int]]) -> None:
    x = [float(a) for a, _ in points]
    y = [float(b) for _, b in points]
    got = spearman(x, y)
    assert got == spearman(y, x)
    if got is not None:
        assert -1.0 - 1e-12 <= got <= 1.0 + 1e-12
        assert spearman(x, x) == pytest.approx(1.0)


def test_spearman_is_undefined_for_constant_or_single_samples_and_refuses_unequal_lengths() -> None:
    assert spearman([1, 1, 1], [1, 2, 3]) is None
    assert spearman([1], [2]) is None
    with pytest.raises(ValueError, match="length"):
        spearman([1, 2], [1, 2, 3])
