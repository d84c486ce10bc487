"""`evalkit shadow LOG`: the proxy's shadow log read back and analysed (DESIGN §11).

The proxy writes one JSONL line per shadow event (`proxy/shadow.py`): a pair (both sides'
tool decisions), a drop, a reference error, or a skip (a request the reference could not be
asked as is, with its reason). Here the lines become the proxy's own `Pair`s
(`proxy.shadowstats`, so a pair means the same thing online and offline), and the figures are
computed with evalkit's statistics: per-channel rates with Wilson intervals, the rate ratio with
Katz's interval, the Spearman rank correlation of failure signatures and the novel share (the
proxy's own `signature_agreement`) — the figures `GET /v1/stats/shadow` shows for the same pairs
— and, beside them, what a live counter cannot give, from resampling whole *sessions* (a sampled
session is shadowed on every turn, and its turns are not independent): the per-channel rate
difference with a bootstrap interval and a sign-flip test, Holm-corrected across channels; the
rank correlation's and the novel share's intervals, each resample's figures computed by that same
proxy function; and a plot.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from evalkit.analysis.stats import (
    BOOTSTRAP_METHOD,
    DEFAULT_RESAMPLES,
    RateRatio,
    basic_interval,
    basic_interval_refusal,
    cluster_bootstrap_ci,
    holm,
    rate_ratio,
    rate_ratio_missing,
    sign_flip_test,
    wilson_interval,
)
from evalkit.analysis.table import Table, columns
from evalkit.errors import ResultsFileError, UsageError
from proxy.shadowstats import Outcome, Pair, Side, Signature, SkipReason, signature_agreement


@dataclass(frozen=True, slots=True)
class LoggedPair:
    """One pair line: where it came from, and the pair."""

    session: str
    pair: Pair


@dataclass
class ModelPairLog:
    """Every line of one (model, reference) in the log."""

    model: str
    reference: str
    pairs: list[LoggedPair] = field(default_factory=list)
    dropped: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)


def read_shadow_log(paths: Sequence[Path]) -> list[ModelPairLog]:
    """The lines of the shadow logs at `paths` (a log and its rotated files, or several workers'
    logs), grouped by (model, reference), in order of first appearance.

    Raises:
        UsageError: no path given, or a path cannot be read.
        ResultsFileError: a line is not a shadow log line (the file and line are named), or the
            files hold no line at all.
    """
    if not paths:
        raise UsageError("give at least one shadow log file")
    groups: dict[tuple[str, str], ModelPairLog] = {}
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read shadow log {path}: {exc.strerror or exc}") from exc
        for number, line in enumerate(data.splitlines(), start=1):
            try:
                raw = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ResultsFileError(
                    f"{path}:{number} is not a shadow log line (not UTF-8 text: {exc.reason} "
                    f"at byte {exc.start})"
                ) from exc
            if not raw.strip():
                continue
            try:
                _add_line(groups, json.loads(raw))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ResultsFileError(f"{path}:{number} is not a shadow log line ({exc})") from exc
    if not groups:
        names = ", ".join(str(p) for p in paths)
        raise ResultsFileError(f"no shadow log line in {names} (empty, or blank lines only)")
    return list(groups.values())


def _add_line(groups: dict[tuple[str, str], ModelPairLog], line: dict[str, Any]) -> None:
    models = line["models"]
    key = (str(models["primary"]), str(models["reference"]))
    group = groups.get(key)
    if group is None:
        group = groups[key] = ModelPairLog(*key)
    event = line["event"]
    if event == "pair":
        group.pairs.append(LoggedPair(str(line["session"]), Pair.from_log(line)))
    elif event == "dropped":
        group.dropped += 1
    elif event == "error":
        group.errors[str(line["kind"])] += 1
    elif event == "skipped":
        group.skipped[SkipReason(line["reason"]).value] += 1
    else:
        raise ValueError(f"unknown event {event!r}")


# -- the signature figures and their session bootstrap ------------------------------------------

CONFIDENCE = 0.95
# Below about this many reference failures the signature figures' bias outgrows what the
# bootstrap corrects (measured on the simulated upstream: README, "Is my quantized model worse
# than it looks?"); the report says so.
FEW_REFERENCE_FAILURES = 100


@dataclass(frozen=True, slots=True)
class SessionCounts:
    """Each session's failure signatures, counted: `counts[side][i, j]` is how often side's
    answers in session i failed with signature `keys[j]`. Sessions in order of first appearance."""

    keys: tuple[Signature, ...]
    sessions: tuple[str, ...]
    counts: dict[Side, npt.NDArray[np.float64]]

    @classmethod
    def of(cls, pairs: Sequence[LoggedPair]) -> SessionCounts:
        keys = tuple(
            sorted({s for p in pairs for side in Side for s in p.pair.side(side).failures})
        )
        column = {k: j for j, k in enumerate(keys)}
        row: dict[str, int] = {}
        for logged in pairs:
            row.setdefault(logged.session, len(row))
        counts = {side: np.zeros((len(row), len(keys))) for side in Side}
        for logged in pairs:
            i = row[logged.session]
            for side in Side:
                for signature in logged.pair.side(side).failures:
                    counts[side][i, column[signature]] += 1
        return cls(keys, tuple(row), counts)

    def agreement(self, weights: npt.ArrayLike) -> tuple[float | None, float | None]:
        """(rank correlation, novel share) of the log that holds session i `weights[i]` times —
        the proxy's own `signature_agreement` over that log's signature counts (a signature
        drawn on neither side is absent from it, as from a tally)."""
        w = np.asarray(weights, dtype=np.float64)
        primary, reference = w @ self.counts[Side.PRIMARY], w @ self.counts[Side.REFERENCE]
        return signature_agreement(
            {k: int(n) for k, n in zip(self.keys, primary, strict=True) if n},
            {k: int(n) for k, n in zip(self.keys, reference, strict=True) if n},
        )


@dataclass(frozen=True, slots=True)
class BootstrapInterval:
    """A figure's session-bootstrap interval: the basic (bias-corrected) bootstrap interval,
    2·estimate less the resamples' upper and lower quantiles, clipped to the figure's range.
    `bias` is the resamples' mean less the estimate (the bootstrap's estimate of the figure's
    bias); `defined`: resamples in which the figure was defined (a resample without primary
    failures has no novel share, one with a constant side no correlation)."""

    low: float
    high: float
    bias: float
    defined: int


@dataclass(frozen=True, slots=True)
class SignatureFigures:
    """How alike the two sides' failures are: the rank correlation of their signature counts
    and the novel share — the proxy's figures (`signature_agreement`), as `GET /v1/stats/shadow`
    shows them — with their session-bootstrap intervals (None where the figure is undefined,
    or the log holds a single session),
    the failures behind them and how the intervals were drawn: `resamples` logs of as many
    sessions as this one's (`sessions`), drawn from its sessions with replacement, from `seed`."""

    rank_correlation: float | None
    novel_share: float | None
    primary_failures: int
    reference_failures: int
    rank_correlation_ci: BootstrapInterval | None
    novel_share_ci: BootstrapInterval | None
    sessions: int
    resamples: int
    seed: int
    confidence: float
    refusals: dict[str, str] = field(default_factory=dict)
    """Why a figure that is defined has no interval ("ρ", "novel share": the reason)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the keys `GET /v1/stats/shadow` has under `signatures` mean the same."""

        def interval(ci: BootstrapInterval | None) -> list[float] | None:
            return None if ci is None else [ci.low, ci.high]

        def detail(ci: BootstrapInterval | None) -> dict[str, Any] | None:
            return None if ci is None else {"bias": ci.bias, "defined_resamples": ci.defined}

        return {
            "rank_correlation": self.rank_correlation,
            "rank_correlation_ci": interval(self.rank_correlation_ci),
            "novel_share": self.novel_share,
            "novel_share_ci": interval(self.novel_share_ci),
            "primary_failures": self.primary_failures,
            "reference_failures": self.reference_failures,
            "bootstrap": {
                "unit": "session",
                "sessions": self.sessions,
                "resamples": self.resamples,
                "seed": self.seed,
                "confidence": self.confidence,
                "method": BOOTSTRAP_METHOD,
                "rank_correlation": detail(self.rank_correlation_ci),
                "novel_share": detail(self.novel_share_ci),
                "no_interval": {
                    key: self.refusals[name]
                    for key, name in (("rank_correlation", "ρ"), ("novel_share", "novel share"))
                    if name in self.refusals
                },
            },
        }


def signature_figures(
    pairs: Sequence[LoggedPair],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> SignatureFigures:
    """The rank correlation and the novel share of `pairs` with their session-bootstrap
    intervals (see `SignatureFigures`, `BootstrapInterval`). Each resample's figures are the
    proxy's `signature_agreement` of the resampled log, what `GET /v1/stats/shadow` would show
    for it.

    Why the basic interval: both figures are biased on a log of this size — a signature one side
    shows once or twice is often missing on the other by chance, which lowers ρ and raises the
    novel share — and a resample, holding fewer distinct sessions, is more so. Percentiles of the
    resamples would carry that bias a second time, away from the truth; the basic interval
    subtracts it (README, "Is my quantized model worse than it looks?", has the measurement).
    """
    counts = SessionCounts.of(pairs)
    n = len(counts.sessions)
    correlation, novel = counts.agreement(np.ones(n))
    replicates: list[tuple[float | None, float | None]] = []
    if n >= 2:  # one session resampled is always itself: no interval to draw
        rng = np.random.default_rng(seed)
        uniform = np.full(n, 1.0 / n)
        for start in range(0, resamples, _CHUNK):
            draws = rng.multinomial(n, uniform, size=min(_CHUNK, resamples - start))
            replicates += [counts.agreement(w) for w in draws]
    rhos, novels = [r for r, _ in replicates], [s for _, s in replicates]
    refusals: dict[str, str] = {}
    for name, estimate, values, bounds in (
        ("ρ", correlation, rhos, (-1.0, 1.0)),
        ("novel share", novel, novels, (0.0, 1.0)),
    ):
        reason = basic_interval_refusal(estimate, values, confidence=confidence, bounds=bounds)
        if n >= 2 and estimate is not None and reason is not None:
            defined = [v for v in values if v is not None]
            bias = f" (their mean less the estimate: {np.mean(defined) - estimate:+.3f})"
            refusals[name] = reason + (bias if defined else "")
    return SignatureFigures(
        rank_correlation=correlation,
        novel_share=novel,
        primary_failures=int(counts.counts[Side.PRIMARY].sum()),
        reference_failures=int(counts.counts[Side.REFERENCE].sum()),
        rank_correlation_ci=_session_interval(correlation, rhos, confidence, (-1.0, 1.0)),
        novel_share_ci=_session_interval(novel, novels, confidence, (0.0, 1.0)),
        sessions=n,
        resamples=resamples,
        seed=seed,
        confidence=confidence,
        refusals=refusals,
    )


_CHUNK = 2_000


def _session_interval(
    estimate: float | None,
    replicates: Sequence[float | None],
    confidence: float,
    bounds: tuple[float, float],
) -> BootstrapInterval | None:
    """evalkit's one bootstrap interval (`basic_interval`) of a figure, with the resamples'
    bias and how many of them defined the figure; None where `basic_interval` draws none."""
    interval = basic_interval(estimate, replicates, confidence=confidence, bounds=bounds)
    if interval is None or estimate is None:
        return None
    values = [r for r in replicates if r is not None]
    return BootstrapInterval(
        low=interval[0],
        high=interval[1],
        bias=float(np.mean(values)) - estimate,
        defined=len(values),
    )


@dataclass(frozen=True, slots=True)
class ChannelFigures:
    """One channel: answers failing in it on each side out of `pairs`, their Wilson intervals,
    the ratio primary/reference, and the difference primary − reference with its
    session-bootstrap interval and sign-flip p-value (Holm-adjusted across channels)."""

    channel: str
    pairs: int
    primary: int
    reference: int
    primary_ci: tuple[float, float]
    reference_ci: tuple[float, float]
    ratio: RateRatio | None
    difference: float
    difference_ci: tuple[float, float]
    p_value: float
    p_holm: float

    def to_dict(self) -> dict[str, Any]:
        ratio = self.ratio
        return {
            "primary": {
                "answers": self.primary,
                "rate": self.primary / self.pairs,
                "ci": list(self.primary_ci),
            },
            "reference": {
                "answers": self.reference,
                "rate": self.reference / self.pairs,
                "ci": list(self.reference_ci),
            },
            "ratio": None
            if ratio is None
            else {
                "value": ratio.ratio,
                "ci": [ratio.low, ratio.high],
                "excludes_one": ratio.low > 1.0 or ratio.high < 1.0,
                "corrected": ratio.corrected,
            },
            "difference": {
                "value": self.difference,
                "ci": list(self.difference_ci),
                "p_value": self.p_value,
                "p_holm": self.p_holm,
            },
        }


@dataclass(frozen=True, slots=True)
class ShadowAnalysis:
    """The figures of one (model, reference)."""

    model: str
    reference: str
    pairs: int
    sessions: int
    dropped: int
    errors: dict[str, int]
    skipped: dict[str, int]
    outcomes: dict[str, int]
    channels: list[ChannelFigures]
    signatures: SignatureFigures
    args_compared: int
    args_equal: int

    def to_dict(self) -> dict[str, Any]:
        """The figures as JSON; the keys `GET /v1/stats/shadow` has mean the same there."""
        return {
            "model": self.model,
            "reference": self.reference,
            "pairs": self.pairs,
            "sessions": self.sessions,
            "dropped": self.dropped,
            "errors": dict(sorted(self.errors.items())),
            "skipped": self.skipped,
            "outcomes": self.outcomes,
            "channels": {c.channel: c.to_dict() for c in self.channels},
            "signatures": self.signatures.to_dict(),
            "arguments": {
                "compared": self.args_compared,
                "equal": self.args_equal,
                "agreement": self.args_equal / self.args_compared if self.args_compared else None,
            },
        }


def analyze_shadow_log(
    groups: Iterable[ModelPairLog], *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> list[ShadowAnalysis]:
    """The figures of every (model, reference) in the log."""
    return [_analyze(group, resamples=resamples, seed=seed) for group in groups]


def _analyze(group: ModelPairLog, *, resamples: int, seed: int) -> ShadowAnalysis:
    pairs = [logged.pair for logged in group.pairs]
    sessions = [logged.session for logged in group.pairs]
    n = len(pairs)
    channels = sorted({c for pair in pairs for side in Side for c in pair.side(side).channels})
    # One row per pair, one column per channel: did the primary (reference) answer fail in it?
    failed = {
        side: np.array(
            [[c in pair.side(side).channels for c in channels] for pair in pairs], dtype=float
        ).reshape(n, len(channels))
        for side in Side
    }
    figures: list[ChannelFigures] = []
    if channels:
        difference = failed[Side.PRIMARY] - failed[Side.REFERENCE]
        low, high = cluster_bootstrap_ci(difference, sessions, resamples=resamples, seed=seed)
        p_values = [
            sign_flip_test(difference[:, j], sessions, resamples=resamples, seed=seed)
            for j in range(len(channels))
        ]
        adjusted = holm(p_values)
        for j, channel in enumerate(channels):
            primary = int(failed[Side.PRIMARY][:, j].sum())
            reference = int(failed[Side.REFERENCE][:, j].sum())
            figures.append(
                ChannelFigures(
                    channel=channel,
                    pairs=n,
                    primary=primary,
                    reference=reference,
                    primary_ci=wilson_interval(primary, n),
                    reference_ci=wilson_interval(reference, n),
                    # A is the reference, B the candidate: B/A is primary over reference.
                    ratio=rate_ratio(reference, n, primary, n),
                    difference=float(difference[:, j].mean()),
                    difference_ci=(float(low[j]), float(high[j])),
                    p_value=p_values[j],
                    p_holm=adjusted[j],
                )
            )
    outcomes = Counter(pair.outcome.value for pair in pairs)
    agreements = [pair.arguments for pair in pairs if pair.arguments is not None]
    return ShadowAnalysis(
        model=group.model,
        reference=group.reference,
        pairs=n,
        sessions=len(set(sessions)),
        dropped=group.dropped,
        errors=dict(group.errors),
        skipped={r.value: group.skipped.get(r.value, 0) for r in SkipReason},
        outcomes={o.value: outcomes.get(o.value, 0) for o in Outcome},
        channels=figures,
        signatures=signature_figures(group.pairs, resamples=resamples, seed=seed),
        args_compared=sum(a.compared for a in agreements),
        args_equal=sum(a.equal for a in agreements),
    )


def plot_shadow(analyses: Sequence[ShadowAnalysis], path: Path) -> None:
    """Per-channel failure rates of both sides (with their Wilson intervals), one panel per
    (model, reference) titled with the signature figures and their intervals, written to `path`
    (PNG, SVG or PDF by its suffix).

    Raises:
        UsageError: the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(analyses), 1, figsize=(8, 3 * max(1, len(analyses))), squeeze=False
    )
    for ax, analysis in zip(axes[:, 0], analyses, strict=True):
        names = [c.channel for c in analysis.channels]
        x = np.arange(len(names))
        for offset, side, colour in (
            (-0.2, Side.REFERENCE, "#4c72b0"),
            (0.2, Side.PRIMARY, "#dd8452"),
        ):
            rates, errors = [], []
            for c in analysis.channels:
                count, ci = (
                    (c.primary, c.primary_ci)
                    if side is Side.PRIMARY
                    else (c.reference, c.reference_ci)
                )
                rate = count / c.pairs
                rates.append(rate)
                errors.append((rate - ci[0], ci[1] - rate))
            ax.bar(
                x + offset,
                rates,
                0.4,
                yerr=np.array(errors).T if errors else None,
                label=f"{side.value}: {analysis.model if side is Side.PRIMARY else analysis.reference}",
                color=colour,
            )
        ax.set_xticks(x, names, rotation=20, ha="right")
        ax.set_ylabel("answers failing")
        ax.set_title(
            f"{analysis.model} against {analysis.reference} ({analysis.pairs} pairs)\n"
            f"failure signatures: {signature_summary(analysis.signatures)}",
            fontsize="medium",
        )
        ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as exc:
        raise UsageError(f"cannot write the plot {path}: {exc.strerror or exc}") from exc
    finally:
        plt.close(fig)


def _percent(value: float) -> str:
    return f"{100 * value:.1f}"


def _number(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def shadow_tables(analysis: ShadowAnalysis) -> list[Table]:
    """The tables of one (model, reference) — outcomes (with drops, skips and reference errors),
    and the channels — in evalkit's one table model (rich, Markdown, HTML)."""
    title = f"{analysis.model} against {analysis.reference}"
    rows = [[outcome, str(count)] for outcome, count in analysis.outcomes.items()]
    rows.append(["dropped", str(analysis.dropped)])
    rows += [[f"skipped: {reason}", str(n)] for reason, n in analysis.skipped.items() if n]
    rows += [[f"reference error: {kind}", str(n)] for kind, n in sorted(analysis.errors.items())]
    summary = Table(
        f"{title}: {analysis.pairs} pairs in {analysis.sessions} sessions",
        columns("outcome", "pairs"),
        rows,
        note="Skipped: sampled requests the reference could not be asked as is (they continue "
        "context stored at the primary's upstream); not pairs, not errors.",
    )
    channel_rows = []
    for c in analysis.channels:
        ratio = c.ratio
        channel_rows.append(
            [
                c.channel,
                f"{_percent(c.primary / c.pairs)} [{_percent(c.primary_ci[0])}–"
                f"{_percent(c.primary_ci[1])}]",
                f"{_percent(c.reference / c.pairs)} [{_percent(c.reference_ci[0])}–"
                f"{_percent(c.reference_ci[1])}]",
                _number(None if ratio is None else ratio.ratio),
                f"– ({rate_ratio_missing(c.reference, c.pairs, c.primary, c.pairs)})"
                if ratio is None
                else f"{ratio.low:.2f}–{ratio.high:.2f}",
                _percent(c.difference),
                "(no spread)"
                if c.difference_ci[0] == c.difference_ci[1]
                else f"{_percent(c.difference_ci[0])}–{_percent(c.difference_ci[1])}",
                _number(c.p_holm, 4),
            ]
        )
    agreement = None if not analysis.args_compared else analysis.args_equal / analysis.args_compared
    arguments = (
        f"Arguments equal in {analysis.args_equal} of {analysis.args_compared} calls to the same "
        "tool" + ("." if agreement is None else f" ({_percent(agreement)}%).")
    )
    sig = analysis.signatures
    channels = Table(
        f"{title}: answers failing per channel",
        columns(
            "channel",
            "primary %",
            "reference %",
            "ratio",
            "ratio 95% CI",
            "diff pts",
            "diff 95% CI",
            "p (Holm)",
        ),
        channel_rows,
        note="Share of pairs whose answer failed in the channel (%, 95% Wilson CI); ratio "
        "primary/reference with Katz's CI; difference with a session-bootstrap CI and a "
        f"Holm-adjusted sign-flip p ({sig.resamples:,} resamples, seed {sig.seed}).",
        footnotes=(*signature_lines(sig), arguments),
    )
    return [summary, channels]


def signature_summary(figures: SignatureFigures) -> str:
    """ρ and the novel share with their 95% intervals, in a few words."""
    rho, novel = figures.rank_correlation_ci, figures.novel_share_ci
    missing = " (no interval)"
    return (
        f"Spearman {_number(figures.rank_correlation)}"
        + (
            f" (95% CI {rho.low:.2f}–{rho.high:.2f})"
            if rho is not None
            else missing
            if figures.rank_correlation is not None
            else ""
        )
        + ", novel share "
        + ("–" if figures.novel_share is None else f"{_percent(figures.novel_share)}%")
        + (
            f" (95% CI {_percent(novel.low)}–{_percent(novel.high)}%)"
            if novel is not None
            else missing
            if figures.novel_share is not None
            else ""
        )
    )


def signature_lines(figures: SignatureFigures) -> tuple[str, str]:
    """The signature figures in words: ρ and the novel share with their intervals, and how the
    intervals were drawn."""
    rho, novel = figures.rank_correlation_ci, figures.novel_share_ci
    head = (
        f"Failure signatures (channel, tool name as called; {figures.primary_failures} primary, "
        f"{figures.reference_failures} reference failures): {signature_summary(figures)}."
    )
    refused = [
        f"{name}: {figures.refusals[name]}"
        for name in ("ρ", "novel share")
        if name in figures.refusals
    ]
    if rho is None and novel is None and not refused:
        return head, (
            f"No intervals: the figures are undefined or the log holds {figures.sessions} "
            "session(s), too few to resample."
        )
    biases = [
        *([] if rho is None else [f"of ρ at {rho.bias:+.2f}"]),
        *([] if novel is None else [f"of the novel share at {100 * novel.bias:+.1f} pts"]),
    ]
    return (
        head,
        ("No interval for " + "; ".join(refused) + ". " if refused else "")
        + f"Their intervals: basic bootstrap over the log's {figures.sessions} sessions (a "
        f"session's pairs drawn together), {figures.resamples:,} resamples, seed {figures.seed}, "
        "each clipped to its figure's range (ρ from −1 to 1, the share from 0 to 100%)"
        + (
            f"; the resamples put the bias {' and '.join(biases)}, which the "
            f"{'intervals correct' if len(biases) > 1 else 'interval corrects'} (on a small log "
            "ρ reads low and the novel share high)"
            if biases
            else ""
        )
        + "."
        + (
            ""
            if figures.reference_failures >= FEW_REFERENCE_FAILURES
            or figures.rank_correlation is None
            else f" With {figures.reference_failures} reference failures (under "
            f"{FEW_REFERENCE_FAILURES}) both figures and their intervals can sit far from the "
            "truth: the correction is partial."
        ),
    )
