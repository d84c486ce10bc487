"""The figures of a probe, computed once here and shown from here by every renderer.

Per target (its direct answers): for each guard channel, the share of answers with a violation
in that channel, with a 95% percentile-bootstrap interval that resamples trajectories (the turns
of one episode are not independent; `stats.cluster_bootstrap_ci`); the same for any violation;
agreement with the recorded turn (tool-call trigger; tool names where both called; canonical
arguments where the names agree). Between the reference target (the first) and each other, over
the contexts both answered: per-channel rate ratios with Katz intervals (`stats.rate_ratio`), the
Spearman correlation of failure signatures — (context, channel) pairs, and wrong tool names —
and the share of the other's failures whose signature the reference never shows
(`analysis.compare`'s signature figures). Through the proxy: per channel, the answers in which
the proxy reported the channel, and how many of them it delivered valid (repair success).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from evalkit.analysis.compare import _signatures as signature_agreement
from evalkit.analysis.stats import DEFAULT_RESAMPLES, RateRatio, cluster_bootstrap_ci, rate_ratio
from evalkit.probe.asking import Answer, Target
from evalkit.probe.contexts import Context
from proxy.guard import Channel
from proxy.headers import VIOLATIONS_HEADER

ANSWER_CHANNELS: Final = tuple(
    c for c in Channel if c not in (Channel.TOOL_ERROR, Channel.UPSTREAM_ERROR)
)
"""The channels one answer can show: a tool error happens only in a later turn of an episode,
an upstream error is no answer."""
ANY: Final = "any"
AGREEMENTS: Final = ("trigger", "name", "arguments")


@dataclass(frozen=True, slots=True)
class Rate:
    """`count` of `n`, with its interval (None when n is 0)."""

    count: int
    n: int
    low: float | None
    high: float | None

    @property
    def value(self) -> float | None:
        return self.count / self.n if self.n else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "n": self.n,
            "rate": self.value,
            "ci_low": self.low,
            "ci_high": self.high,
        }


@dataclass(frozen=True)
class TargetFigures:
    """One target's direct answers."""

    target: Target
    asked: int
    answered: int
    too_long: int
    rejected: int
    window: int | None
    calling: int  # answers with at least one parsed tool call
    channels: dict[str, Rate]  # ANSWER_CHANNELS and ANY
    agreement: dict[str, Rate]

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.target.to_dict(),
            "asked": self.asked,
            "answered": self.answered,
            "too_long": self.too_long,
            "rejected": self.rejected,
            "window": self.window,
            "with_tool_calls": self.calling,
            "channels": {k: v.to_dict() for k, v in self.channels.items()},
            "agreement": {k: v.to_dict() for k, v in self.agreement.items()},
        }


@dataclass(frozen=True)
class PairFigures:
    """The other target against the reference, over the contexts both answered."""

    reference: str
    other: str
    contexts: int
    ratios: dict[str, tuple[int, int, int, int, RateRatio | None]]
    signature_correlation: float | None
    novel_share: float | None
    tool_name_correlation: float | None
    novel_tool_name_share: float | None

    def to_dict(self) -> dict[str, Any]:
        ratios = {}
        for channel, (a, na, b, nb, r) in self.ratios.items():
            ratios[channel] = {
                "reference_count": a,
                "reference_n": na,
                "other_count": b,
                "other_n": nb,
                "ratio": None if r is None else r.ratio,
                "ci_low": None if r is None else r.low,
                "ci_high": None if r is None else r.high,
                "corrected": None if r is None else r.corrected,
            }
        return {
            "reference": self.reference,
            "other": self.other,
            "contexts": self.contexts,
            "ratios": ratios,
            "signature_correlation": self.signature_correlation,
            "novel_share": self.novel_share,
            "tool_name_correlation": self.tool_name_correlation,
            "novel_tool_name_share": self.novel_tool_name_share,
        }


@dataclass(frozen=True)
class RepairFigures:
    """One target through the proxy: per channel, answers the proxy reported it in, and how many
    of those it delivered without any violation."""

    target: str
    answered: int
    channels: dict[str, tuple[int, int]]  # channel → (reported, delivered valid)
    delivered_failing: int  # proxied answers that still failed as delivered

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "answered": self.answered,
            "channels": {
                k: {"reported": n, "repaired": ok, "success": ok / n if n else None}
                for k, (n, ok) in self.channels.items()
            },
            "delivered_failing": self.delivered_failing,
        }


@dataclass(frozen=True)
class ProbeFigures:
    targets: tuple[TargetFigures, ...]
    pairs: tuple[PairFigures, ...]
    repairs: tuple[RepairFigures, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "targets": [t.to_dict() for t in self.targets],
            "pairs": [p.to_dict() for p in self.pairs],
            "repairs": [r.to_dict() for r in self.repairs],
        }


def _rates(
    indicators: Sequence[Sequence[float | None]],
    clusters: Sequence[str],
    names: Sequence[str],
    resamples: int,
    seed: int,
) -> dict[str, Rate]:
    """Per column, the count of ones over the rows where it is not None, with the clustered
    bootstrap interval of its mean."""
    out: dict[str, Rate] = {}
    for j, name in enumerate(names):
        rows = [
            (row[j], c) for row, c in zip(indicators, clusters, strict=True) if row[j] is not None
        ]
        if not rows:
            out[name] = Rate(0, 0, None, None)
            continue
        values = np.array([float(v) for v, _ in rows if v is not None])
        low, high = cluster_bootstrap_ci(
            values, [c for _, c in rows], resamples=resamples, seed=seed
        )
        out[name] = Rate(int(values.sum()), len(rows), float(low[0]), float(high[0]))
    return out


def target_figures(
    target: Target,
    contexts: Sequence[Context],
    answers: Sequence[Answer],
    window: int | None,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> TargetFigures:
    """The figures of `target`'s direct answers among `answers`."""
    trajectory = {c.id: c.trajectory for c in contexts}
    mine = [a for a in answers if a.key.target == target.name and a.key.route == "direct"]
    answered = [a for a in mine if a.status == "answered"]
    clusters = [trajectory[a.key.context] for a in answered]
    channel_names = [c.value for c in ANSWER_CHANNELS]
    indicators = [
        [float(c in a.channels) for c in channel_names] + [float(bool(a.violations))]
        for a in answered
    ]
    agreement_rows: list[list[float | None]] = [
        [None if a.agreement.get(k) is None else float(bool(a.agreement[k])) for k in AGREEMENTS]
        for a in answered
    ]
    limits = [a.limit for a in mine if a.status == "too_long" and a.limit is not None]
    return TargetFigures(
        target=target,
        asked=len(mine),
        answered=len(answered),
        too_long=sum(1 for a in mine if a.status == "too_long"),
        rejected=sum(1 for a in mine if a.status == "rejected"),
        window=window if window is not None else (max(limits) if limits else None),
        calling=sum(1 for a in answered if (a.message or {}).get("tool_calls")),
        channels=_rates(indicators, clusters, [*channel_names, ANY], resamples, seed),
        agreement=_rates(agreement_rows, clusters, AGREEMENTS, resamples, seed),
    )


def _signatures_of(answers: Sequence[Answer]) -> tuple[Counter[str], Counter[str]]:
    """(context, channel) failure signatures, and the wrong tool names called."""
    by_context: Counter[str] = Counter()
    names: Counter[str] = Counter()
    for a in answers:
        for v in a.violations:
            by_context[f"{a.key.context}|{v['channel']}"] += 1
            if v["channel"] == Channel.UNKNOWN_TOOL.value and v.get("tool_name"):
                names[str(v["tool_name"])] += 1
    return by_context, names


def pair_figures(reference: str, other: str, answers: Sequence[Answer]) -> PairFigures:
    """`other` against `reference` over the contexts both answered directly (every sample)."""

    def direct(name: str) -> list[Answer]:
        return [
            a
            for a in answers
            if a.key.target == name and a.key.route == "direct" and a.status == "answered"
        ]

    a_all, b_all = direct(reference), direct(other)
    shared = {a.key.context for a in a_all} & {b.key.context for b in b_all}
    a_side = [a for a in a_all if a.key.context in shared]
    b_side = [b for b in b_all if b.key.context in shared]
    ratios: dict[str, tuple[int, int, int, int, RateRatio | None]] = {}
    for channel in [*(c.value for c in ANSWER_CHANNELS), ANY]:

        def hit(answer: Answer, channel: str = channel) -> bool:
            return bool(answer.violations) if channel == ANY else channel in answer.channels

        a_count = sum(1 for a in a_side if hit(a))
        b_count = sum(1 for b in b_side if hit(b))
        ratio = rate_ratio(a_count, len(a_side), b_count, len(b_side))
        ratios[channel] = (a_count, len(a_side), b_count, len(b_side), ratio)
    a_sig, a_names = _signatures_of(a_side)
    b_sig, b_names = _signatures_of(b_side)
    correlation, novel = signature_agreement(a_sig, b_sig)
    name_correlation, novel_names = signature_agreement(a_names, b_names)
    return PairFigures(
        reference, other, len(shared), ratios, correlation, novel, name_correlation, novel_names
    )


def repair_figures(target: str, answers: Sequence[Answer]) -> RepairFigures:
    """`target`'s answers through the proxy: reported channels and the valid deliveries."""
    proxied = [
        a
        for a in answers
        if a.key.target == target and a.key.route == "proxy" and a.status == "answered"
    ]
    channels: dict[str, tuple[int, int]] = {}
    for channel in ANSWER_CHANNELS:
        reported = [a for a in proxied if channel.value in _reported(a)]
        channels[channel.value] = (len(reported), sum(1 for a in reported if not a.violations))
    return RepairFigures(target, len(proxied), channels, sum(1 for a in proxied if a.violations))


def _reported(answer: Answer) -> set[str]:
    header = answer.proxy.get(VIOLATIONS_HEADER, "")
    return {c.strip() for c in header.split(",") if c.strip()}


def probe_figures(
    targets: Sequence[Target],
    contexts: Sequence[Context],
    answers: Sequence[Answer],
    windows: dict[str, int | None],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> ProbeFigures:
    """Every figure of a probe (see the module docstring); the first target is the reference."""
    per_target = tuple(
        target_figures(t, contexts, answers, windows.get(t.name), resamples=resamples, seed=seed)
        for t in targets
    )
    pairs = tuple(pair_figures(targets[0].name, t.name, answers) for t in targets[1:])
    proxied = {a.key.target for a in answers if a.key.route == "proxy"}
    repairs = tuple(repair_figures(t.name, answers) for t in targets if t.name in proxied)
    return ProbeFigures(per_target, pairs, repairs)
