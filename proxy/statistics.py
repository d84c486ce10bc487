"""The statistics the proxy's live shadow figures (`proxy/shadowstats.py`) and evalkit's analysis
(`evalkit/analysis/stats.py`) share, written once: the Wilson interval of a proportion, the rate
ratio with Katz's log interval, and Spearman's rank correlation.

Plain functions of numbers, pure Python (the proxy does not depend on numpy); the tests hold each
against scipy. Each caller keeps its own conventions at its call site: the proxy shows no
interval without trials (None), evalkit's tables show (0, 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Final, NamedTuple

Z_95: Final = NormalDist().inv_cdf(0.975)
"""The standard normal quantile of a two-sided 95% interval (1.95996…)."""


def z_of(confidence: float) -> float:
    """The standard normal quantile of a two-sided interval at `confidence` (0.95 → `Z_95`)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def wilson(successes: int, trials: int, z: float = Z_95) -> tuple[float, float] | None:
    """The Wilson score interval `(low, high)` of the proportion `successes / trials`; None
    without trials.

    Raises:
        ValueError: when successes exceed trials or a count is negative.
    """
    if successes < 0 or trials < 0 or successes > trials:
        raise ValueError(f"need 0 ≤ successes ≤ trials, got {successes} of {trials}")
    if trials == 0:
        return None
    p = successes / trials
    spread = z * z / trials
    centre = (p + spread / 2) / (1 + spread)
    half = z * math.sqrt(p * (1 - p) / trials + spread / (4 * trials)) / (1 + spread)
    return max(0.0, centre - half), min(1.0, centre + half)


class RelativeRisk(NamedTuple):
    """A ratio of two rates and its interval. `corrected`: a side had no events, so half an
    event was added to each side and one trial to each (Haldane–Anscombe), to keep it finite."""

    ratio: float
    low: float
    high: float
    corrected: bool


def relative_risk(
    events: int, trials: int, base_events: int, base_trials: int, z: float = Z_95
) -> RelativeRisk | None:
    """The relative risk `(events / trials) / (base_events / base_trials)` with Katz's log
    interval, exp(log r ± z·se), se² = 1/e − 1/n + 1/b − 1/m (scipy's `relative_risk`).

    Returns None when there is nothing to compare: a side without trials, or no events on
    either side. Counts are not checked: a caller that takes them from outside checks them.
    """
    if trials <= 0 or base_trials <= 0 or (events == 0 and base_events == 0):
        return None
    e, n, b, m = float(events), float(trials), float(base_events), float(base_trials)
    corrected = events == 0 or base_events == 0
    if corrected:
        e, n, b, m = e + 0.5, n + 1.0, b + 0.5, m + 1.0
    ratio = (e / n) / (b / m)
    se = math.sqrt(1.0 / e - 1.0 / n + 1.0 / b - 1.0 / m)
    return RelativeRisk(ratio, ratio * math.exp(-z * se), ratio * math.exp(z * se), corrected)


def average_ranks(values: Sequence[float]) -> list[float]:
    """Ranks from 1, ties sharing their average rank (scipy's `rankdata(method="average")`)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in order[i : j + 1]:
            ranks[k] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation of paired samples; None when undefined (fewer than two pairs,
    or a constant sample).

    Raises:
        ValueError: when the samples differ in length.
    """
    if len(x) != len(y):
        raise ValueError(f"samples differ in length: {len(x)} and {len(y)}")
    if len(x) < 2:
        return None
    rx, ry = average_ranks(x), average_ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)
