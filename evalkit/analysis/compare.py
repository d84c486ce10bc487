"""Compare two runs of the same domain — A the reference (e.g. BF16), B the candidate (e.g. INT4)
— and say in plain words whether a flat score hides damage (DESIGN §10).

Episodes are paired by task and trial (the n-th episode of a task in A with the n-th in B,
ordered by trial). Per cell: the score difference B − A with a paired bootstrap interval and a
sign-flip test (Holm-corrected across cells by `compare_cells`), TOST equivalence within ±margin,
per-channel rate ratios B/A, Spearman rank correlation of failure signatures (wrong tool names;
(task, channel) pairs), the share of B's failures whose signature never occurs in A, and the gap
A − B between the budget curves at every budget. Rewards and differences are fractions of 1;
reports show them as points (×100).

The bootstrap and the sign-flip test resample tasks (all of a task's pairs together); TOST takes
one mean difference per task as its unit. The rates behind the ratios are per call: the agent's
calls for the agent's channels, the user's calls for `user_tool_error`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from evalkit.analysis.budget import Budget, rewards_by_budget
from evalkit.analysis.channels import EpisodeFailures, ErrorChannel
from evalkit.analysis.run import RunAnalysis
from evalkit.analysis.stats import (
    BOOTSTRAP_METHOD,
    DEFAULT_RESAMPLES,
    RateRatio,
    Tost,
    basic_interval,
    cluster_bootstrap_ci,
    holm,
    rate_ratio,
    rate_ratio_missing,
    sign_flip_test,
    spearman,
    tost_paired,
)

DEFAULT_MARGIN = 0.075  # ±7.5 points
ALPHA = 0.05
MIN_SIGNATURE_FAILURES = 10  # per side: below, a rank correlation or novel share means nothing
SIGNATURE_RESAMPLES = 2_000  # each resample recomputes a correlation: fewer than the means'


@dataclass(frozen=True, slots=True)
class SignatureStatistics:
    """How alike A's and B's failures are over one kind of signature (wrong tool names; (task,
    channel) pairs): Spearman's ρ of the counts per signature, the share of B's failures whose
    signature A never shows, each with a basic bootstrap interval over tasks (`resamples` draws
    from `seed`; `stats.BOOTSTRAP_METHOD`); and the failures behind them. The figures are shown
    whenever they can be computed; with fewer than `MIN_SIGNATURE_FAILURES` on a side they come
    with a warning (`warning`)."""

    what: str
    a_failures: int
    b_failures: int
    correlation: float | None
    correlation_ci: tuple[float, float] | None
    novel: float | None
    novel_ci: tuple[float, float] | None
    resamples: int = 0
    seed: int = 0

    @property
    def enough(self) -> bool:
        """Whether both sides have enough failures for the statistics to mean something."""
        return min(self.a_failures, self.b_failures) >= MIN_SIGNATURE_FAILURES

    def too_few(self) -> str:
        """Why the statistics are not shown, or shown with a warning, in words."""
        return (
            f"too few {self.what} to compare (A {self.a_failures}, B {self.b_failures}; "
            f"{MIN_SIGNATURE_FAILURES} a side needed)"
        )

    def warning(self) -> str | None:
        """A plain warning when the figures rest on too few failures; None when they do not."""
        if self.enough:
            return None
        return (
            f"warning: only {self.a_failures} (A) and {self.b_failures} (B) {self.what}; with "
            f"fewer than {MIN_SIGNATURE_FAILURES} a side ρ and the novel share mean little"
        )

    def describe(self, name: str) -> str:
        """ρ and the novel share with their intervals in words, then what is missing and the
        warning, if any."""
        if self.correlation is None:
            return self.too_few() if not self.enough else str(self.missing())
        text = f"{name} ρ {self.correlation:.2f}"
        if self.correlation_ci is not None:
            text += f" [{self.correlation_ci[0]:.2f}, {self.correlation_ci[1]:.2f}]"
        if self.novel is not None:
            text += f", {100 * self.novel:.1f}% novel"
            if self.novel_ci is not None:
                text += f" [{100 * self.novel_ci[0]:.1f}, {100 * self.novel_ci[1]:.1f}]"
        notes = [n for n in (self.missing(), self.warning()) if n]
        return text + "".join(f" ({n})" for n in notes)

    def missing(self) -> str | None:
        """What keeps ρ or its interval from being shown, in words; None when both are."""
        if self.correlation is None:
            return (
                f"ρ over {self.what} undefined (A {self.a_failures}, B {self.b_failures}: it "
                "needs two signatures whose counts vary on both sides)"
            )
        if self.correlation_ci is None:
            return (
                "no interval for ρ: it needs two tasks or more, and resamples in which ρ "
                "varies without all falling on one side of the estimate"
            )
        return None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {
            "a_failures": self.a_failures,
            "b_failures": self.b_failures,
            "enough": self.enough,
            "spearman": self.correlation,
            "spearman_ci": None if self.correlation_ci is None else list(self.correlation_ci),
            "novel_share": self.novel,
            "novel_share_ci": None if self.novel_ci is None else list(self.novel_ci),
            "warning": self.warning(),
            "missing": self.missing(),
            "bootstrap": {
                "method": BOOTSTRAP_METHOD,
                "unit": "task",
                "resamples": self.resamples,
                "seed": self.seed,
            },
        }


@dataclass(frozen=True, slots=True)
class ChannelComparison:
    """One channel's failures per call in A and B, and the rate ratio B/A."""

    channel: ErrorChannel
    a_count: int
    a_calls: int
    b_count: int
    b_calls: int
    ratio: RateRatio | None

    @property
    def a_rate(self) -> float | None:
        return self.a_count / self.a_calls if self.a_calls else None

    @property
    def b_rate(self) -> float | None:
        return self.b_count / self.b_calls if self.b_calls else None

    @property
    def missing(self) -> str | None:
        """Why there is no rate ratio, in a few words (None: there is one)."""
        if self.ratio is not None:
            return None
        if self.a_count > self.a_calls or self.b_count > self.b_calls:
            return "more failures than calls"
        return rate_ratio_missing(self.a_count, self.a_calls, self.b_count, self.b_calls)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        r = self.ratio
        return {
            "channel": self.channel.value,
            "a_count": self.a_count,
            "a_calls": self.a_calls,
            "a_rate": self.a_rate,
            "b_count": self.b_count,
            "b_calls": self.b_calls,
            "b_rate": self.b_rate,
            "ratio": None if r is None else r.ratio,
            "ci_low": None if r is None else r.low,
            "ci_high": None if r is None else r.high,
            "corrected": None if r is None else r.corrected,
            "missing": self.missing,
        }


@dataclass(frozen=True, slots=True)
class BudgetGap:
    """How far B's budget curve lies below A's at budget `k` (A − B), with a paired interval."""

    k: int
    gap: float
    ci_low: float
    ci_high: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {"k": self.k, "gap": self.gap, "ci_low": self.ci_low, "ci_high": self.ci_high}


@dataclass(frozen=True)
class CellComparison:
    """A against B in one cell (a domain; a model pair). See the module docstring.

    `difference` is B − A over the paired episodes and `ci` its interval; `p_value` the sign-flip
    test's, `p_holm` after Holm's correction across the cells compared together; `tost` is None
    with fewer than two tasks paired.
    """

    a: RunAnalysis
    b: RunAnalysis
    pairs: int
    unmatched_a: int
    unmatched_b: int
    a_score: float
    b_score: float
    difference: float
    ci: tuple[float, float]
    p_value: float
    p_holm: float
    margin: float
    tost: Tost | None
    channels: tuple[ChannelComparison, ...]
    wrong_names: SignatureStatistics
    task_channels: SignatureStatistics
    gaps: tuple[BudgetGap, ...]
    budget: Budget = Budget.TAU2
    score_missing: str | None = None
    """Why the score difference has no interval and no equivalence test (zero variance, too
    few tasks), in words; None when it has both."""
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0

    def bootstrap(self) -> str:
        """How the intervals were drawn, in one sentence."""
        return (
            f"Intervals: {BOOTSTRAP_METHOD} bootstrap over tasks, seed {self.seed}, "
            f"{self.resamples} resamples ({self.wrong_names.resamples} for ρ and the novel "
            "shares), each resample computing the estimate's own estimator; rate ratios: "
            "Katz's log interval. None is drawn, and TOST is not run, where the paired "
            "differences do not vary or fewer than two tasks pair; then the verdict says what "
            "is missing."
        )

    @property
    def tool_name_correlation(self) -> float | None:
        """ρ over wrong tool names (the paper's)."""
        return self.wrong_names.correlation

    @property
    def novel_tool_name_share(self) -> float | None:
        """The share of B's wrong-name calls whose name A never calls (the paper's)."""
        return self.wrong_names.novel

    @property
    def signature_correlation(self) -> float | None:
        """ρ over (task, channel) signatures."""
        return self.task_channels.correlation

    @property
    def novel_share(self) -> float | None:
        """The share of B's tool errors whose (task, channel) A never shows."""
        return self.task_channels.novel

    @property
    def domain(self) -> str:
        return self.a.domain

    @property
    def name(self) -> str:
        """The cell's name: domain, the models, and the arms (labels) when the models alone do
        not tell A from B (a replay's arms with and without repair run one model)."""
        models = (
            self.a.model if self.a.model == self.b.model else f"{self.a.model} vs {self.b.model}"
        )
        labels = dict.fromkeys((self.a.label, self.b.label))
        same_model = self.a.model == self.b.model
        arms = f" ({' vs '.join(labels)})" if same_model and list(labels) != [models] else ""
        return f"{self.domain} · {models}{arms}"

    @property
    def equivalent(self) -> bool:
        return self.tost is not None and self.tost.equivalent

    @property
    def differs(self) -> bool:
        return self.p_holm < ALPHA

    def largest_gap(self) -> BudgetGap | None:
        """The budget (k ≥ 1) where B falls furthest behind A (the first one on ties)."""
        candidates = [g for g in self.gaps if g.k >= 1]
        return max(candidates, key=lambda g: g.gap) if candidates else None

    def verdict(self) -> str:
        """One line in plain words: the score, the channels that moved, the budget gap."""
        low, high = (100 * x for x in self.ci)
        diff = 100 * self.difference
        spread = f"B − A {diff:+.1f} [{low:+.1f}, {high:+.1f}]"
        if self.pairs == 0:
            return "no episodes could be paired by task and trial"
        if self.score_missing is not None:
            score = f"score B − A {diff:+.1f}, not tested: {self.score_missing}"
        elif self.equivalent:
            score = f"score equivalent within ±{100 * self.margin:g} ({spread})"
        elif self.differs:
            direction = "lower" if diff < 0 else "higher"
            score = f"score {direction} by {abs(diff):.1f} points ({spread}, Holm p = {self.p_holm:.2g})"
        else:
            score = f"score difference inconclusive ({spread})"
        parts = [score]
        parts.append(self.wrong_names.describe("wrong tool names"))
        # Channels whose rate moved, the largest increase first (the damage), then decreases.
        moved = sorted(
            (
                (c.channel, c.ratio)
                for c in self.channels
                if c.ratio is not None and c.ratio.significant
            ),
            key=lambda cr: -cr[1].ratio,
        )
        parts += [f"{ch.label} ×{r.ratio:.1f} [{r.low:.1f}, {r.high:.1f}]" for ch, r in moved]
        if not moved:
            parts.append("no channel's rate changed significantly")
        widest = self.largest_gap()
        if widest is not None and all(g.gap == 0.0 for g in self.gaps):
            parts.append("the same score at every budget")
        elif widest is not None:
            at_budget = next(g for g in self.gaps if g.k == self.gaps[-1].k)
            text = f"gap at budget {widest.k}: {100 * widest.gap:.1f} points"
            if widest.k != at_budget.k:
                text += f" ({100 * at_budget.gap:.1f} at {at_budget.k})"
            parts.append(text)
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The JSON of one cell in `evalkit compare --json`."""
        tost = self.tost
        return {
            "cell": self.name,
            "domain": self.domain,
            "a": {"label": self.a.label, "model": self.a.model, "episodes": len(self.a.episodes)},
            "b": {"label": self.b.label, "model": self.b.model, "episodes": len(self.b.episodes)},
            "pairs": self.pairs,
            "unmatched": {"a": self.unmatched_a, "b": self.unmatched_b},
            "a_score": self.a_score,
            "b_score": self.b_score,
            "difference": self.difference,
            "ci_low": None if self.score_missing else self.ci[0],
            "ci_high": None if self.score_missing else self.ci[1],
            "score_missing": self.score_missing,
            "bootstrap": {
                "method": BOOTSTRAP_METHOD,
                "unit": "task",
                "resamples": self.resamples,
                "seed": self.seed,
            },
            "p_value": self.p_value,
            "p_holm": self.p_holm,
            "tost": None
            if tost is None
            else {
                "margin": self.margin,
                "p": tost.p,
                "equivalent": tost.equivalent,
                "ci90_low": tost.ci[0],
                "ci90_high": tost.ci[1],
            },
            "channels": [c.to_dict() for c in self.channels],
            "spearman": {
                "wrong_tool_names": self.tool_name_correlation,
                "task_channel": self.signature_correlation,
            },
            "novel_share": {
                "task_channel": self.novel_share,
                "wrong_tool_names": self.novel_tool_name_share,
            },
            "signatures": {
                "wrong_tool_names": self.wrong_names.to_dict(),
                "task_channel": self.task_channels.to_dict(),
            },
            "budget": self.budget.value,
            "budget_gap": [g.to_dict() for g in self.gaps],
            "verdict": self.verdict(),
        }


def pair_episodes(
    a: Sequence[EpisodeFailures], b: Sequence[EpisodeFailures]
) -> list[tuple[EpisodeFailures, EpisodeFailures]]:
    """Pairs (A's, B's) of episodes of the same task and trial, in A's order.

    The n-th episode of a task on one side (ordered by trial, unnumbered trials last, then as
    recorded) pairs with the n-th on the other, so two one-trial runs of the same tasks pair up
    even when both number their trial 0.
    """
    keyed_b = _by_task_and_rank(b)
    return [(e, keyed_b[key]) for key, e in _by_task_and_rank(a).items() if key in keyed_b]


def _by_task_and_rank(
    episodes: Sequence[EpisodeFailures],
) -> dict[tuple[str, int], EpisodeFailures]:
    grouped: dict[str, list[tuple[int, EpisodeFailures]]] = {}
    for position, episode in enumerate(episodes):
        grouped.setdefault(episode.task_id, []).append((position, episode))
    keyed: list[tuple[int, tuple[str, int], EpisodeFailures]] = []
    for task_id, entries in grouped.items():
        entries.sort(key=lambda pe: (pe[1].trial is None, pe[1].trial or 0, pe[0]))
        keyed.extend((position, (task_id, rank), e) for rank, (position, e) in enumerate(entries))
    keyed.sort(key=lambda entry: entry[0])
    return {key: episode for _, key, episode in keyed}


@dataclass(frozen=True, slots=True)
class _Paired:
    """The statistics of the paired episodes."""

    a_score: float = 0.0
    b_score: float = 0.0
    difference: float = 0.0
    ci: tuple[float, float] = (0.0, 0.0)
    p_value: float = 1.0
    tost: Tost | None = None
    gaps: tuple[BudgetGap, ...] = ()
    missing: str | None = "no episodes paired"


def _paired_statistics(
    pairs: Sequence[tuple[EpisodeFailures, EpisodeFailures]],
    kind: Budget,
    budget: int,
    margin: float,
    confidence: float,
    resamples: int,
    seed: int,
) -> _Paired:
    if not pairs:
        return _Paired()
    ra = np.array([ea.reward for ea, _ in pairs])
    rb = np.array([eb.reward for _, eb in pairs])
    tasks: list[Hashable] = [ea.task_id for ea, _ in pairs]
    curve_a = rewards_by_budget(ra.tolist(), [ea.errors_for(kind) for ea, _ in pairs], budget)
    curve_b = rewards_by_budget(rb.tolist(), [eb.errors_for(kind) for _, eb in pairs], budget)
    differences = rb - ra
    # One bootstrap for the score difference and every budget's gap, so they agree.
    table = np.column_stack([differences, curve_a - curve_b])
    low, high = cluster_bootstrap_ci(
        table, tasks, confidence=confidence, resamples=resamples, seed=seed
    )
    per_task = _task_means(differences.tolist(), tasks)
    missing = _score_missing(per_task)
    n = len(pairs)
    return _Paired(
        a_score=math.fsum(ra.tolist()) / n,
        b_score=math.fsum(rb.tolist()) / n,
        difference=math.fsum(differences.tolist()) / n,
        ci=(float(low[0]), float(high[0])),
        p_value=sign_flip_test(differences, tasks, resamples=resamples, seed=seed),
        tost=tost_paired(per_task, margin, alpha=ALPHA) if missing is None else None,
        missing=missing,
        gaps=tuple(
            BudgetGap(
                k=k,
                gap=math.fsum((curve_a[:, k] - curve_b[:, k]).tolist()) / n,
                ci_low=float(low[k + 1]),
                ci_high=float(high[k + 1]),
            )
            for k in range(budget + 1)
        ),
    )


def _score_missing(per_task: Sequence[float]) -> str | None:
    """Why the paired differences (one mean per task) support no interval and no equivalence
    test, in words: fewer than two tasks, or no variance — every task moved alike, where a
    bootstrap interval collapses to a point and TOST "proves" equivalence from nothing."""
    tasks = len(per_task)
    if tasks < 2:
        return f"{tasks} task paired; an interval and the equivalence test need two or more"
    if max(per_task) == min(per_task):
        return (
            f"the paired differences do not vary (every one of {tasks} tasks "
            f"{100 * per_task[0]:+.1f}), so no interval or equivalence test can be drawn; one "
            f"task that flips moves the score by {100 / tasks:.1f} points — more tasks or "
            "trials (--trials) needed"
        )
    return None


def compare_runs(
    a: RunAnalysis,
    b: RunAnalysis,
    *,
    margin: float = DEFAULT_MARGIN,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> CellComparison:
    """Compare run B against the reference run A (one cell; `p_holm` is the raw p-value here).

    `margin` is the equivalence margin as a fraction of the reward (0.075 = ±7.5 points). The
    budget gap runs to the smaller of the two runs' budgets, on the proxy's budget when both runs
    were budgeted by it, else on τ²-bench's.

    Raises:
        ValueError: when `margin` is not positive.
    """
    if margin <= 0:
        raise ValueError(f"the equivalence margin must be positive, got {margin}")
    pairs = pair_episodes(a.episodes, b.episodes)
    kind = a.budget if a.budget is b.budget else Budget.TAU2
    paired = _paired_statistics(
        pairs, kind, min(a.max_errors, b.max_errors), margin, confidence, resamples, seed
    )
    resampled = min(resamples, SIGNATURE_RESAMPLES)
    wrong_names = signature_statistics(
        "wrong-name calls", a.episodes, b.episodes, _wrong_names, confidence, resampled, seed
    )
    task_channels = signature_statistics(
        "tool errors", a.episodes, b.episodes, _task_channel, confidence, resampled, seed
    )
    return CellComparison(
        a=a,
        b=b,
        pairs=len(pairs),
        unmatched_a=len(a.episodes) - len(pairs),
        unmatched_b=len(b.episodes) - len(pairs),
        a_score=paired.a_score,
        b_score=paired.b_score,
        difference=paired.difference,
        ci=paired.ci,
        p_value=paired.p_value,
        p_holm=paired.p_value,
        margin=margin,
        tost=paired.tost,
        score_missing=paired.missing if pairs else None,
        resamples=resamples,
        seed=seed,
        channels=tuple(_channel_comparison(c, a, b, confidence) for c in ErrorChannel),
        wrong_names=wrong_names,
        task_channels=task_channels,
        gaps=paired.gaps,
        budget=kind,
    )


def compare_cells(
    cells: Sequence[tuple[RunAnalysis, RunAnalysis]],
    *,
    margin: float = DEFAULT_MARGIN,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> list[CellComparison]:
    """Compare every (A, B) cell, with Holm's correction of the score tests across the cells."""
    compared = [
        compare_runs(a, b, margin=margin, confidence=confidence, resamples=resamples, seed=seed)
        for a, b in cells
    ]
    adjusted = holm([c.p_value for c in compared])
    return [replace(c, p_holm=p) for c, p in zip(compared, adjusted, strict=True)]


def _channel_comparison(
    channel: ErrorChannel, a: RunAnalysis, b: RunAnalysis, confidence: float
) -> ChannelComparison:
    a_count, b_count = a.channels()[channel], b.channels()[channel]
    a_calls, b_calls = a.calls_for(channel), b.calls_for(channel)
    # A rate ratio needs events within trials; a call can fail only once, but a tool message
    # that answers no recorded call could still push a count past the calls.
    ratio = (
        rate_ratio(a_count, a_calls, b_count, b_calls, confidence=confidence)
        if a_count <= a_calls and b_count <= b_calls
        else None
    )
    return ChannelComparison(channel, a_count, a_calls, b_count, b_calls, ratio)


def _task_channel(episodes: Sequence[EpisodeFailures]) -> Counter[str]:
    return Counter(f"{e.task_id}|{f.channel.value}" for e in episodes for f in e.failures)


def _wrong_names(episodes: Sequence[EpisodeFailures]) -> Counter[str]:
    total: Counter[str] = Counter()
    for episode in episodes:
        total.update(episode.wrong_tool_names())
    return total


def signature_statistics(
    what: str,
    a: Sequence[EpisodeFailures],
    b: Sequence[EpisodeFailures],
    signatures: Callable[[Sequence[EpisodeFailures]], Counter[str]],
    confidence: float,
    resamples: int,
    seed: int,
) -> SignatureStatistics:
    """ρ and the novel share of `signatures` (counts per signature over a run's episodes), with
    basic bootstrap intervals from resampling tasks with replacement on both sides at once. Each
    resample computes the point estimate's own estimator (`_signatures`: over the signatures
    that occur in it, a signature drawn on neither side being absent, as in the shadow's)."""
    a_counts, b_counts = signatures(a), signatures(b)
    correlation, novel = _signatures(a_counts, b_counts)
    a_total, b_total = sum(a_counts.values()), sum(b_counts.values())
    tasks = sorted({e.task_id for e in (*a, *b)})
    if (correlation is None and novel is None) or len(tasks) < 2:
        return SignatureStatistics(
            what, a_total, b_total, correlation, None, novel, None, resamples, seed
        )
    keys = sorted(set(a_counts) | set(b_counts))
    column = {k: i for i, k in enumerate(keys)}
    # One row of signature counts per task and side: a resample sums the rows it draws.
    per_task = np.zeros((2, len(tasks), len(keys)))
    row = {t: i for i, t in enumerate(tasks)}
    for side, episodes in enumerate((a, b)):
        for episode in episodes:
            for key, count in signatures([episode]).items():
                per_task[side, row[episode.task_id], column[key]] += count
    rng = np.random.default_rng(seed)
    rhos, novels = [], []
    for _ in range(resamples):
        weights = np.bincount(rng.integers(0, len(tasks), len(tasks)), minlength=len(tasks))
        drawn_a, drawn_b = weights @ per_task[0], weights @ per_task[1]
        rho, share = _drawn_signatures(drawn_a, drawn_b)
        rhos.append(rho)
        novels.append(share)
    return SignatureStatistics(
        what,
        a_total,
        b_total,
        correlation,
        basic_interval(correlation, rhos, confidence=confidence, bounds=(-1.0, 1.0)),
        novel,
        basic_interval(novel, novels, confidence=confidence, bounds=(0.0, 1.0)),
        resamples,
        seed,
    )


def _drawn_signatures(
    a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]
) -> tuple[float | None, float | None]:
    """`_signatures` of one resample's counts (a column per signature): ρ over the signatures
    that occur in it, and the novel share."""
    occurs = (a > 0) | (b > 0)
    correlation = spearman(a[occurs], b[occurs]) if occurs.any() else None
    total = float(b.sum())
    return correlation, (float(b[a == 0].sum()) / total if total else None)


def _signatures(a: Counter[str], b: Counter[str]) -> tuple[float | None, float | None]:
    """Spearman correlation of the counts over the union of signatures, and the share of B's
    failures whose signature A never shows (None when B has none)."""
    keys = sorted(set(a) | set(b))
    correlation = spearman([a[k] for k in keys], [b[k] for k in keys]) if keys else None
    total = sum(b.values())
    novel = sum(count for key, count in b.items() if a[key] == 0)
    return correlation, (novel / total if total else None)


def _task_means(values: Sequence[float], tasks: Sequence[Hashable]) -> list[float]:
    grouped: dict[Hashable, list[float]] = {}
    for value, task in zip(values, tasks, strict=True):
        grouped.setdefault(task, []).append(value)
    return [math.fsum(v) / len(v) for v in grouped.values()]
