"""The statistics behind `evalkit analyze` and `compare`: bootstrap intervals, paired tests,
multiple-testing correction, equivalence, rate ratios and rank correlation. The Wilson interval,
the rate ratio's interval and Spearman's correlation are `proxy/statistics.py`'s, which the proxy's
live shadow figures use too; this module gives them evalkit's arrays and conventions.

Everything is a plain function of numbers (numpy, no scipy at run time; the tests hold each one
against scipy's reference). Randomised procedures take a `seed` and give the same answer for the
same seed.

Episodes of one task are not independent (same scenario, same user), so the bootstrap and the
sign-flip test resample *tasks* — clusters — and keep all of a task's episodes together. With one
trial per task this is the ordinary (paired) bootstrap.

Every bootstrap interval here is the *basic* bootstrap interval (`BOOTSTRAP_METHOD`), the one
`evalkit shadow`'s signature figures use: 2·estimate less the resamples' upper and lower
quantiles, each resample computing the same estimator as the point estimate, clipped to the
figure's range. It is drawn from `seed` with `resamples` draws (default `DEFAULT_RESAMPLES`; the
signature figures at most 2,000), and every report states both.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from proxy.statistics import Z_95, average_ranks, relative_risk, wilson, z_of
from proxy.statistics import spearman as shared_spearman

DEFAULT_RESAMPLES: Final = 10_000
BOOTSTRAP_METHOD: Final = "basic"
"""The one bootstrap interval of evalkit and the shadow's figures (see the module docstring)."""
EXACT_SIGN_FLIP_LIMIT: Final = 16  # 2**16 sign vectors: exact enumeration is cheaper than sampling
_CHUNK: Final = 2_000

FloatArray = npt.NDArray[np.float64]


# -- bootstrap ---------------------------------------------------------------------------------


def cluster_bootstrap_ci(
    values: npt.ArrayLike,
    clusters: Sequence[Hashable] | None = None,
    *,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[FloatArray, FloatArray]:
    """Basic bootstrap interval of the mean of each column of `values` (`BOOTSTRAP_METHOD`).

    `values` is one row per unit (episode, or paired difference) and one column per statistic
    (a 1-d array is one column). Resampling draws whole clusters with replacement (`clusters[i]`
    is the cluster of row i; None: every row is its own cluster) and takes the mean over the rows
    drawn — the estimator of the point estimate, the mean over all rows. The interval is
    2·mean less the resamples' upper and lower quantiles, clipped to the column's range (a mean
    cannot leave it). Returns `(low, high)`, arrays with one entry per column.

    Raises:
        ValueError: on no rows, a cluster list of the wrong length, or a confidence outside (0, 1).
    """
    matrix = _as_matrix(values)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    sums, sizes = _cluster_sums(matrix, clusters)
    rng = np.random.default_rng(seed)
    n_clusters = len(sizes)
    means = np.empty((resamples, matrix.shape[1]))
    uniform = np.full(n_clusters, 1.0 / n_clusters)
    for start in range(0, resamples, _CHUNK):
        stop = min(start + _CHUNK, resamples)
        weights = rng.multinomial(n_clusters, uniform, size=stop - start).astype(np.float64)
        means[start:stop] = (weights @ sums) / (weights @ sizes)[:, None]
    alpha = 1.0 - confidence
    estimate = sums.sum(axis=0) / sizes.sum()
    upper = np.quantile(means, 1 - alpha / 2, axis=0)
    lower = np.quantile(means, alpha / 2, axis=0)
    low = np.maximum(matrix.min(axis=0), 2 * estimate - upper)
    high = np.minimum(matrix.max(axis=0), 2 * estimate - lower)
    return np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)


def basic_interval(
    estimate: float | None,
    replicates: Sequence[float | None],
    *,
    confidence: float = 0.95,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> tuple[float, float] | None:
    """The basic bootstrap interval of `estimate` from its resampled `replicates` (each the same
    estimator on one resample; None where it is undefined there), clipped to `bounds` — the
    estimator's range, which the basic interval (2·estimate less a quantile) can leave near its
    edges, as a share near 100%.

    None — no interval — where `basic_interval_refusal` gives a reason: the estimate or every
    replicate is undefined, the replicates do not vary (a point is no interval: the data hold
    too little to resample), or they lie on one side of the estimate beyond the interval's
    quantiles (a bias the bootstrap cannot correct, where an interval would not contain its own
    estimate).
    """
    if basic_interval_refusal(estimate, replicates, confidence=confidence, bounds=bounds):
        return None
    assert estimate is not None  # refused otherwise
    return _clipped(estimate, _quantiles(replicates, confidence), bounds)


def basic_interval_refusal(
    estimate: float | None,
    replicates: Sequence[float | None],
    *,
    confidence: float = 0.95,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> str | None:
    """Why `basic_interval` draws no interval for `estimate` and its `replicates`, in a few
    words; None when it draws one."""
    values = [r for r in replicates if r is not None]
    if estimate is None:
        return "the figure is undefined"
    if not values:
        return "no resample defines the figure"
    if min(values) == max(values):
        return "the resamples do not vary"
    quantiles = _quantiles(values, confidence)
    if not quantiles[0] <= estimate <= quantiles[1]:
        return "the resamples lie to one side of the estimate"
    low, high = _clipped(estimate, quantiles, bounds)
    if low == high:
        return "clipped to the figure's range, the interval is a single point"
    return None


def _clipped(
    estimate: float, quantiles: tuple[float, float], bounds: tuple[float, float]
) -> tuple[float, float]:
    lower, upper = quantiles
    return max(bounds[0], 2 * estimate - upper), min(bounds[1], 2 * estimate - lower)


def _quantiles(replicates: Sequence[float | None], confidence: float) -> tuple[float, float]:
    values = np.array([r for r in replicates if r is not None], dtype=np.float64)
    alpha = (1.0 - confidence) / 2
    lower, upper = (float(q) for q in np.quantile(values, [alpha, 1.0 - alpha]))
    return lower, upper


def _as_matrix(values: npt.ArrayLike) -> FloatArray:
    matrix = np.asarray(values, dtype=np.float64)
    if matrix.ndim == 1:
        matrix = matrix[:, None]
    if matrix.ndim != 2 or matrix.shape[0] == 0:
        raise ValueError("values must be a non-empty 1-d or 2-d array")
    return matrix


def _cluster_sums(
    matrix: FloatArray, clusters: Sequence[Hashable] | None
) -> tuple[FloatArray, FloatArray]:
    """Per-cluster column sums and row counts, clusters in order of first appearance."""
    if clusters is None:
        return matrix, np.ones(matrix.shape[0])
    if len(clusters) != matrix.shape[0]:
        raise ValueError(f"{len(clusters)} cluster labels for {matrix.shape[0]} rows")
    index: dict[Hashable, int] = {}
    codes = np.array([index.setdefault(c, len(index)) for c in clusters])
    sums = np.zeros((len(index), matrix.shape[1]))
    np.add.at(sums, codes, matrix)
    sizes = np.bincount(codes, minlength=len(index)).astype(np.float64)
    return sums, sizes


# -- paired tests ------------------------------------------------------------------------------


def sign_flip_test(
    differences: npt.ArrayLike,
    clusters: Sequence[Hashable] | None = None,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> float:
    """Two-sided p-value of a paired sign-flip (permutation) test that the mean difference is 0.

    Under the null hypothesis the two runs are exchangeable within a cluster, so the sign of
    each cluster's summed difference is a fair coin. The statistic is the total difference.
    Exact (every sign vector) when at most `EXACT_SIGN_FLIP_LIMIT` clusters have a non-zero sum;
    otherwise `resamples` random sign vectors and the (count + 1) / (resamples + 1) estimate.

    Raises:
        ValueError: on an empty input or a cluster list of the wrong length.
    """
    sums, _ = _cluster_sums(_as_matrix(differences), clusters)
    d = sums[:, 0]
    d = d[d != 0.0]
    if d.size == 0:
        return 1.0
    observed = abs(float(d.sum()))
    # Floating sums of the same numbers in another order differ in the last bits.
    tolerance = 1e-9 * max(1.0, observed)
    if d.size <= EXACT_SIGN_FLIP_LIMIT:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
        totals = np.abs(signs @ d)
        return float(np.mean(totals >= observed - tolerance))
    rng = np.random.default_rng(seed)
    extreme = 0
    for start in range(0, resamples, _CHUNK):
        size = min(_CHUNK, resamples - start)
        signs = rng.choice((1.0, -1.0), size=(size, d.size))
        extreme += int(np.sum(np.abs(signs @ d) >= observed - tolerance))
    return (extreme + 1) / (resamples + 1)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values, in the order given.

    Reject hypothesis i at level α when its adjusted p-value is ≤ α; this controls the
    family-wise error rate over all the hypotheses.
    """
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True, slots=True)
class Tost:
    """Two one-sided t-tests for equivalence of a mean difference to 0 within ±`delta`.

    `p` is the larger of the two one-sided p-values: the difference is equivalent at level α
    when `p < α` — the same as the (1 − 2α) t interval `ci` lying inside (−delta, delta).
    """

    delta: float
    mean: float
    p_lower: float
    p_upper: float
    ci: tuple[float, float]
    alpha: float

    @property
    def p(self) -> float:
        return max(self.p_lower, self.p_upper)

    @property
    def equivalent(self) -> bool:
        return self.p < self.alpha


def tost_paired(differences: npt.ArrayLike, delta: float, *, alpha: float = 0.05) -> Tost:
    """TOST on paired differences (one per unit): H0 |mean| ≥ delta against |mean| < delta.

    Lower test: t = (mean + delta) / se, p = P(T > t); upper: t = (mean − delta) / se,
    p = P(T < t); T has n − 1 degrees of freedom. Zero spread decides by the mean alone.

    Raises:
        ValueError: on fewer than two differences or a non-positive delta.
    """
    d = np.asarray(differences, dtype=np.float64).ravel()
    if d.size < 2:
        raise ValueError("TOST needs at least two paired differences")
    if delta <= 0:
        raise ValueError(f"delta must be positive, got {delta}")
    n = d.size
    mean = float(d.mean())
    se = float(d.std(ddof=1)) / math.sqrt(n)
    df = n - 1
    if se == 0.0:
        p_lower = 0.0 if mean > -delta else 1.0
        p_upper = 0.0 if mean < delta else 1.0
        return Tost(delta, mean, p_lower, p_upper, (mean, mean), alpha)
    p_lower = 1.0 - t_cdf((mean + delta) / se, df)
    p_upper = t_cdf((mean - delta) / se, df)
    half = t_ppf(1.0 - alpha, df) * se
    return Tost(delta, mean, p_lower, p_upper, (mean - half, mean + half), alpha)


# -- the t distribution (what TOST needs, without scipy) ----------------------------------------


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with `df` degrees of freedom."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    # The tail P(T > |t|) is ½·I_x(df/2, ½) with x = df / (df + t²); near t = 0, x rounds to 1,
    # so take it there from the central mass I_y(½, df/2), y = t² / (df + t²), instead.
    t2 = t * t
    if t2 < df:
        tail = 0.5 * (1.0 - _betainc(0.5, df / 2.0, t2 / (df + t2)))
    else:
        tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t2))
    return 1.0 - tail if t > 0 else tail


def t_ppf(q: float, df: float) -> float:
    """The `q` quantile of Student's t with `df` degrees of freedom (bisection on `t_cdf`)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q}")
    low, high = -1.0, 1.0
    while t_cdf(low, df) > q:
        low *= 2.0
    while t_cdf(high, df) < q:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if t_cdf(mid, df) < q:
            low = mid
        else:
            high = mid
        if high - low < 1e-13 * max(1.0, abs(mid)):
            break
    return (low + high) / 2.0


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) (continued fraction, Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    # The continued fraction converges fast for x < (a + 1) / (a + b + 2); use the symmetry
    # I_x(a, b) = 1 − I_{1−x}(b, a) on the other side.
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 1000):
        m2 = 2 * m
        for numerator in (
            m * (b - m) * x / ((a + m2 - 1.0) * (a + m2)),
            -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return result


# -- rates -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RateRatio:
    """The ratio of two per-call rates, B's over A's, with a confidence interval.

    `corrected` says that a zero count was replaced by adding ½ to every cell of the 2×2 table
    (Haldane–Anscombe), so that the ratio and its interval are finite.
    """

    ratio: float
    low: float
    high: float
    corrected: bool = False

    @property
    def significant(self) -> bool:
        """Whether the interval excludes 1 (the rates differ)."""
        return self.low > 1.0 or self.high < 1.0


def rate_ratio(
    a_events: int, a_trials: int, b_events: int, b_trials: int, *, confidence: float = 0.95
) -> RateRatio | None:
    """Relative risk (b_events / b_trials) / (a_events / a_trials) with Katz's log interval.

    Returns None where `rate_ratio_missing` gives a reason: nothing to compare (a side with no
    trials, or no events on either side) or no spread (every trial an event on both sides,
    where Katz's interval is a point). The interval is exp(log r ± z·se), se² = 1/a − 1/n_a +
    1/b − 1/n_b — the same as scipy's `relative_risk(...).confidence_interval()`.

    Raises:
        ValueError: when events exceed trials or a count is negative.
    """
    for events, trials in ((a_events, a_trials), (b_events, b_trials)):
        if events < 0 or trials < 0 or events > trials:
            raise ValueError(f"need 0 ≤ events ≤ trials, got {events} of {trials}")
    if rate_ratio_missing(a_events, a_trials, b_events, b_trials) is not None:
        return None
    found = relative_risk(b_events, b_trials, a_events, a_trials, z_of(confidence))
    return None if found is None else RateRatio(*found)


def rate_ratio_missing(a_events: int, a_trials: int, b_events: int, b_trials: int) -> str | None:
    """Why `rate_ratio` gives no ratio for these counts, in a few words (A the base, B the
    compared side); None when it gives one."""
    if a_trials <= 0 or b_trials <= 0:
        return f"no calls in {'A' if a_trials <= 0 else 'B'}"
    if a_events == 0 and b_events == 0:
        return "no failures on either side"
    if a_events == a_trials and b_events == b_trials:
        return "every call failed on both sides: no spread"
    return None


# -- rank correlation --------------------------------------------------------------------------


def rankdata(values: npt.ArrayLike) -> FloatArray:
    """Ranks from 1, ties sharing their average rank (scipy's `rankdata(method="average")`)."""
    return np.asarray(average_ranks(_sample(values)), dtype=np.float64)


def spearman(x: npt.ArrayLike, y: npt.ArrayLike) -> float | None:
    """Spearman's rank correlation of paired samples (`proxy.statistics.spearman`); None when
    undefined (fewer than two pairs, or a constant sample).

    Raises:
        ValueError: when the samples differ in length.
    """
    return shared_spearman(_sample(x), _sample(y))


def _sample(values: npt.ArrayLike) -> list[float]:
    floats: list[float] = np.asarray(values, dtype=np.float64).ravel().tolist()
    return floats


# -- proportions -------------------------------------------------------------------------------


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of the proportion `successes / n` (95% by default;
    `proxy.statistics.wilson`); (0, 0) for n = 0, as evalkit's tables show an empty cell.

    Raises:
        ValueError: when successes is outside 0…n.
    """
    if n == 0:
        return 0.0, 0.0
    interval = wilson(successes, n, z)
    assert interval is not None  # n > 0
    return interval
