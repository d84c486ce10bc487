"""The statistics agree with scipy's reference implementations and with textbook cases, and the
bootstrap interval covers a known effect about 95% of the time."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sp

from evalkit.analysis.stats import (
    cluster_bootstrap_ci,
    holm,
    rankdata,
    rate_ratio,
    rate_ratio_missing,
    sign_flip_test,
    spearman,
    t_cdf,
    t_ppf,
    tost_paired,
)

PAIRED_A = np.array([0.61, 0.72, 0.55, 0.80, 0.47, 0.66, 0.59, 0.70, 0.52, 0.63])
PAIRED_B = np.array([0.58, 0.69, 0.57, 0.71, 0.40, 0.66, 0.50, 0.72, 0.45, 0.60])


# -- the t distribution ------------------------------------------------------------------------


@pytest.mark.parametrize("df", [1, 2, 3, 7.5, 30, 1000])
def test_t_cdf_and_quantile_match_scipy(df: float) -> None:
    for t in (-40.0, -3.2, -1.0, -0.1, 0.0, 0.4, 1.96, 2.7, 12.0):
        assert t_cdf(t, df) == pytest.approx(sp.t.cdf(t, df), rel=1e-10, abs=1e-14)
    for q in (0.001, 0.05, 0.5, 0.9, 0.975):
        assert t_ppf(q, df) == pytest.approx(sp.t.ppf(q, df), rel=1e-9, abs=1e-10)


# -- sign-flip test ----------------------------------------------------------------------------


def _scipy_paired_p(a: np.ndarray, b: np.ndarray, resamples: int) -> float:
    result = sp.permutation_test(
        (b, a),
        lambda x, y, axis: np.mean(x - y, axis=axis),
        permutation_type="samples",
        alternative="two-sided",
        n_resamples=resamples,
        random_state=0,
    )
    return float(result.pvalue)


def test_the_exact_sign_flip_test_equals_scipys_exact_paired_permutation_test() -> None:
    p = sign_flip_test(PAIRED_B - PAIRED_A)
    assert p == pytest.approx(_scipy_paired_p(PAIRED_A, PAIRED_B, 100_000), rel=1e-12)


def test_the_sampled_sign_flip_test_agrees_with_scipy_within_sampling_error() -> None:
    rng = np.random.default_rng(5)
    a = rng.normal(0.6, 0.1, 40)
    b = a - 0.03 + rng.normal(0, 0.08, 40)
    ours = sign_flip_test(b - a, resamples=20_000, seed=1)
    reference = _scipy_paired_p(a, b, 20_000)
    assert ours == pytest.approx(reference, abs=0.015)
    assert 0.0 < ours < 1.0


def test_sign_flips_keep_a_tasks_trials_together() -> None:
    # Three trials of each task, the same difference within a task: as clusters this is a
    # four-unit test (smallest possible p = 2/16); as independent pairs it would be far smaller.
    diffs = np.repeat([0.2, 0.3, 0.1, 0.25], 3)
    tasks = [t for t in "abcd" for _ in range(3)]
    assert sign_flip_test(diffs, tasks) == pytest.approx(2 / 16)
    assert sign_flip_test(diffs) == pytest.approx(2 / 2**12)


def test_no_difference_gives_p_one() -> None:
    assert sign_flip_test(np.zeros(8)) == 1.0


# -- Holm --------------------------------------------------------------------------------------


def test_holm_on_a_textbook_case() -> None:
    # Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 → 0.02, 0.03, 0.06, 0.04 → monotone: 0.06.
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([0.02]) == [0.02]
    assert holm([]) == []


def test_holm_rejects_what_the_step_down_procedure_rejects() -> None:
    p = [0.001, 0.011, 0.02, 0.04, 0.3]
    alpha = 0.05
    # Step down by hand: 0.001 ≤ .05/5, 0.011 ≤ .05/4, 0.02 > .05/3 → stop: reject the first two.
    assert [q <= alpha for q in holm(p)] == [True, True, False, False, False]


# -- TOST --------------------------------------------------------------------------------------


def _reference_tost(d: np.ndarray, delta: float) -> tuple[float, float]:
    lower = sp.ttest_1samp(d, -delta, alternative="greater").pvalue
    upper = sp.ttest_1samp(d, delta, alternative="less").pvalue
    return float(lower), float(upper)


@pytest.mark.parametrize("delta", [0.02, 0.05, 0.1])
def test_tost_p_values_equal_two_one_sided_t_tests_from_scipy(delta: float) -> None:
    d = PAIRED_B - PAIRED_A
    result = tost_paired(d, delta)
    lower, upper = _reference_tost(d, delta)
    assert result.p_lower == pytest.approx(lower, rel=1e-9)
    assert result.p_upper == pytest.approx(upper, rel=1e-9)
    low, high = sp.t.interval(0.90, d.size - 1, loc=d.mean(), scale=sp.sem(d))
    assert result.ci == pytest.approx((low, high), rel=1e-9)
    # Equivalence at 5% is the 90% interval inside the margins.
    assert result.equivalent == (-delta < low and high < delta)


def test_tost_on_textbook_cases() -> None:
    tight = np.array([0.01, -0.02, 0.0, 0.015, -0.01, 0.005, 0.0, -0.005])
    assert tost_paired(tight, 0.075).equivalent
    noisy = np.array([0.4, -0.5, 0.3, -0.2, 0.6, -0.4])
    assert not tost_paired(noisy, 0.075).equivalent
    shifted = tight + 0.2  # precise, but far outside ±7.5 points
    assert not tost_paired(shifted, 0.075).equivalent
    assert tost_paired(np.full(5, 0.01), 0.075).equivalent  # no spread, inside
    assert not tost_paired(np.full(5, -0.1), 0.075).equivalent  # no spread, outside
    with pytest.raises(ValueError, match="at least two"):
        tost_paired([0.1], 0.075)


# -- rate ratios -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "na", "b", "nb"), [(649, 3328, 1646, 4298), (12, 299, 30, 310), (1, 50, 3, 40)]
)
def test_rate_ratio_and_interval_equal_scipys_relative_risk(
    a: int, na: int, b: int, nb: int
) -> None:
    ours = rate_ratio(a, na, b, nb)
    reference = sp.contingency.relative_risk(b, nb, a, na)
    interval = reference.confidence_interval(confidence_level=0.95)
    assert ours is not None
    assert ours.ratio == pytest.approx(reference.relative_risk, rel=1e-12)
    assert (ours.low, ours.high) == pytest.approx((interval.low, interval.high), rel=1e-9)
    assert not ours.corrected


def test_rate_ratio_corrects_zero_counts_and_declines_when_there_is_nothing() -> None:
    corrected = rate_ratio(0, 100, 5, 100)
    assert corrected is not None
    assert corrected.corrected
    assert corrected.ratio == pytest.approx((5.5 / 101) / (0.5 / 101))
    assert math.isfinite(corrected.high)
    assert rate_ratio(0, 100, 0, 100) is None
    assert rate_ratio(0, 0, 1, 10) is None
    with pytest.raises(ValueError, match="events"):
        rate_ratio(5, 3, 1, 10)


# -- Spearman ----------------------------------------------------------------------------------


def test_rankdata_and_spearman_match_scipy_with_ties() -> None:
    x = [5, 1, 3, 3, 0, 8, 2, 2, 2, 7]
    y = [4, 0, 3, 5, 0, 9, 1, 2, 3, 6]
    assert rankdata(x).tolist() == sp.rankdata(x).tolist()
    assert spearman(x, y) == pytest.approx(sp.spearmanr(x, y).statistic, rel=1e-12)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_spearman_is_undefined_for_constant_or_single_samples() -> None:
    assert spearman([1, 1, 1], [1, 2, 3]) is None
    assert spearman([1], [2]) is None
    with pytest.raises(ValueError, match="length"):
        spearman([1, 2], [1, 2, 3])


# -- bootstrap ---------------------------------------------------------------------------------


def test_bootstrap_interval_agrees_with_scipys_basic_bootstrap() -> None:
    rng = np.random.default_rng(11)
    values = rng.normal(0.3, 1.0, 200)
    low, high = cluster_bootstrap_ci(values, resamples=20_000, seed=3)
    reference = sp.bootstrap(
        (values,), np.mean, method="basic", n_resamples=20_000, random_state=4
    ).confidence_interval
    # Two independent Monte Carlo estimates of the same quantiles: equal to sampling error.
    assert low[0] == pytest.approx(reference.low, abs=0.02)
    assert high[0] == pytest.approx(reference.high, abs=0.02)


def test_bootstrap_of_several_columns_bootstraps_each_from_the_same_resamples() -> None:
    column = np.array([0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    low, high = cluster_bootstrap_ci(np.column_stack([column, column, 1 - column]), seed=2)
    assert (low[0], high[0]) == (low[1], high[1])
    assert (low[2], high[2]) == pytest.approx((1 - high[0], 1 - low[0]))


def test_bootstrap_refuses_bad_inputs() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        cluster_bootstrap_ci([])
    with pytest.raises(ValueError, match="cluster labels"):
        cluster_bootstrap_ci([1.0, 2.0], ["a"])
    with pytest.raises(ValueError, match="confidence"):
        cluster_bootstrap_ci([1.0, 2.0], confidence=1.5)


def _coverage(repetitions: int, *, tasks: int, trials: int, resamples: int) -> float:
    """How often the paired, task-clustered bootstrap interval holds the true difference.

    Each task has its own difficulty shared by its trials and by both runs; B passes less often
    than A by a known margin on every task, so the true difference of mean rewards is known.
    """
    rng = np.random.default_rng(2024)
    effect = -0.1
    covered = 0
    labels = [t for t in range(tasks) for _ in range(trials)]
    for repetition in range(repetitions):
        difficulty = np.repeat(rng.uniform(0.3, 0.9, tasks), trials)
        a = rng.random(tasks * trials) < difficulty
        b = rng.random(tasks * trials) < difficulty + effect
        low, high = cluster_bootstrap_ci(
            b.astype(float) - a.astype(float), labels, resamples=resamples, seed=repetition
        )
        covered += int(low[0] <= effect <= high[0])
    return covered / repetitions


def test_bootstrap_interval_covers_a_known_difference_about_95_percent_of_the_time() -> None:
    coverage = _coverage(150, tasks=60, trials=1, resamples=1000)
    # 150 repetitions: a binomial standard error of about 1.8 points around 95%.
    assert 0.89 <= coverage <= 0.99


@pytest.mark.slow
def test_clustered_bootstrap_covers_a_known_difference_95_percent_of_the_time_over_1000_runs() -> (
    None
):
    coverage = _coverage(1000, tasks=50, trials=4, resamples=2000)
    # 1000 repetitions: standard error 0.7 points; the bootstrap runs a little narrow.
    assert 0.925 <= coverage <= 0.97


def test_a_rate_ratio_is_refused_with_its_reason_where_katz_interval_says_nothing() -> None:
    assert rate_ratio(3, 3, 2, 2) is None  # every call failed on both sides: se = 0, a point
    assert rate_ratio_missing(3, 3, 2, 2) == "every call failed on both sides: no spread"
    assert rate_ratio_missing(0, 10, 0, 12) == "no failures on either side"
    assert rate_ratio_missing(0, 0, 1, 12) == "no calls in A"
    assert rate_ratio_missing(1, 10, 0, 0) == "no calls in B"
    assert rate_ratio_missing(3, 3, 1, 2) is None
    found = rate_ratio(3, 3, 1, 2)
    assert found is not None
    assert found.low < found.ratio < found.high
