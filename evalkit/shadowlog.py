"""`evalkit shadow LOG`: the proxy's shadow log read back and analysed (DESIGN §11).

The proxy writes one JSONL line per shadow event (`proxy/shadow.py`): a pair (both sides'
tool decisions), a drop, a reference error, or a skip (a request the reference could not be
asked as is, with its reason). Here the lines become the proxy's own `Pair`s
(`proxy.shadowstats`, so a pair means the same thing online and offline), and the figures are
computed with evalkit's statistics: per-channel rates with Wilson intervals, the rate ratio with
Katz's interval, the Spearman rank correlation of failure signatures and the novel share — the
figures `GET /v1/stats/shadow` shows for the same pairs — and, beside them, what a live counter
cannot give: the per-channel rate difference with a bootstrap interval and a sign-flip test that
resample whole *sessions* (a session's turns are not independent), Holm-corrected across
channels, and a plot.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from evalkit.analysis.compare import _signatures as signature_agreement
from evalkit.analysis.stats import (
    DEFAULT_RESAMPLES,
    RateRatio,
    cluster_bootstrap_ci,
    holm,
    rate_ratio,
    sign_flip_test,
    wilson_interval,
)
from evalkit.analysis.table import Table, columns
from evalkit.errors import ResultsFileError, UsageError
from proxy.shadowstats import Outcome, Pair, Side, SkipReason


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
    rank_correlation: float | None
    novel_share: float | None
    primary_failures: int
    reference_failures: int
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
            "signatures": {
                "rank_correlation": self.rank_correlation,
                "novel_share": self.novel_share,
                "primary_failures": self.primary_failures,
                "reference_failures": self.reference_failures,
            },
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


def _signature_key(channel: str, tool: str) -> str:
    return f"{channel}|{tool}"


def _analyze(group: ModelPairLog, *, resamples: int, seed: int) -> ShadowAnalysis:
    pairs = [logged.pair for logged in group.pairs]
    sessions = [logged.session for logged in group.pairs]
    n = len(pairs)
    signatures: dict[Side, Counter[str]] = {side: Counter() for side in Side}
    for pair in pairs:
        for side in Side:
            signatures[side].update(_signature_key(c, t) for c, t in pair.side(side).failures)
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
    correlation, novel = signature_agreement(signatures[Side.REFERENCE], signatures[Side.PRIMARY])
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
        rank_correlation=correlation,
        novel_share=novel,
        primary_failures=sum(signatures[Side.PRIMARY].values()),
        reference_failures=sum(signatures[Side.REFERENCE].values()),
        args_compared=sum(a.compared for a in agreements),
        args_equal=sum(a.equal for a in agreements),
    )


def plot_shadow(analyses: Sequence[ShadowAnalysis], path: Path) -> None:
    """Per-channel failure rates of both sides (with their Wilson intervals), one panel per
    (model, reference), written to `path` (PNG, SVG or PDF by its suffix).

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
        ax.set_title(f"{analysis.model} against {analysis.reference} ({analysis.pairs} pairs)")
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
                "–" if ratio is None else f"{ratio.low:.2f}–{ratio.high:.2f}",
                _percent(c.difference),
                f"{_percent(c.difference_ci[0])}–{_percent(c.difference_ci[1])}",
                _number(c.p_holm, 4),
            ]
        )
    agreement = None if not analysis.args_compared else analysis.args_equal / analysis.args_compared
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
        "Holm-adjusted sign-flip p.",
        footnotes=(
            f"Failure signatures (channel, tool name as called): Spearman "
            f"{_number(analysis.rank_correlation)}, novel share "
            f"{'–' if analysis.novel_share is None else _percent(analysis.novel_share) + '%'} "
            f"({analysis.primary_failures} primary, {analysis.reference_failures} reference "
            "failures).",
            f"Arguments equal in {analysis.args_equal} of {analysis.args_compared} calls to the "
            "same tool" + ("." if agreement is None else f" ({_percent(agreement)}%)."),
        ),
    )
    return [summary, channels]
