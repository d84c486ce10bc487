"""A probe's figures as tables (terminal, Markdown, HTML through `evalkit.analysis.table`) and a
plot of the per-channel rates per target. Nothing is computed here: every number comes from
`figures.ProbeFigures`.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from evalkit.analysis.stats import rate_ratio_missing
from evalkit.analysis.table import Table, columns
from evalkit.probe.figures import ANSWER_CHANNELS, ANY, PairFigures, ProbeFigures, Rate
from evalkit.report import COLOURS, RenderedFigure, render_figure

AGREEMENT_LABELS: Final = {
    "trigger": "trigger",
    "name": "tool names",
    "arguments": "arguments",
}
CHANNEL_NAMES: Final = [*(c.value for c in ANSWER_CHANNELS), ANY]


def _pct(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{100 * value:.{digits}f}"


def rate_cell(rate: Rate) -> str:
    """`12.5 [8.1, 17.0] (5/40)`: a rate in percent with its interval and counts."""
    if not rate.n:
        return "—"
    return f"{_pct(rate.value)} [{_pct(rate.low)}, {_pct(rate.high)}] ({rate.count}/{rate.n})"


def tables(figures: ProbeFigures) -> list[Table]:
    """Every table of a probe, in reading order."""
    out = [_answers_table(figures), _violations_table(figures), _agreement_table(figures)]
    out += [_pair_table(pair) for pair in figures.pairs]
    if figures.repairs:
        out.append(_repair_table(figures))
    return out


def _answers_table(figures: ProbeFigures) -> Table:
    return Table(
        title="Answers per target",
        columns=columns(
            "target",
            "model",
            "asked",
            "answered",
            "with a tool call",
            "too long",
            "window",
            "rejected",
            text=2,
        ),
        rows=[
            [
                t.target.name,
                t.target.model,
                str(t.asked),
                str(t.answered),
                str(t.calling),
                str(t.too_long),
                "—" if t.window is None else str(t.window),
                str(t.rejected),
            ]
            for t in figures.targets
        ],
        note="Direct answers. With a tool call: answers the server parsed at least one call "
        "from (calls left in the text count as leaked_tool_call below). Too long: the prompt (with max_tokens) did not fit the model's "
        "window (its max_model_len), so the context was skipped and counted here.",
    )


def _violations_table(figures: ProbeFigures) -> Table:
    names = [t.target.name for t in figures.targets]
    return Table(
        title="Violations per channel",
        columns=columns("channel", *names, text=1),
        rows=[
            [name, *(rate_cell(t.channels[name]) for t in figures.targets)]
            for name in CHANNEL_NAMES
        ],
        note="Share of answers with a violation in the channel, classified by proxy.guard, in "
        "percent, with a 95% bootstrap interval that resamples trajectories.",
    )


def _agreement_table(figures: ProbeFigures) -> Table:
    names = [t.target.name for t in figures.targets]
    return Table(
        title="Agreement with the recorded turn",
        columns=columns("agreement", *names, text=1),
        rows=[
            [AGREEMENT_LABELS[k], *(rate_cell(t.agreement[k]) for t in figures.targets)]
            for k in AGREEMENT_LABELS
        ],
        note="Percent, 95% bootstrap interval over trajectories. Trigger: a tool called where "
        "the recording called one, text where it wrote text (of all answers); tool names: the "
        "same names in order (where both called); arguments: equal after canonical JSON "
        "(where the names agree).",
    )


def _pair_table(pair: PairFigures) -> Table:
    rows = []
    for name in CHANNEL_NAMES:
        a, na, b, nb, ratio = pair.ratios[name]
        shown = (
            f"— ({rate_ratio_missing(a, na, b, nb)})"
            if ratio is None
            else f"{ratio.ratio:.2f} [{ratio.low:.2f}, {ratio.high:.2f}]"
        )
        if ratio is not None and ratio.corrected:
            shown += " *"
        rows.append([name, f"{a}/{na}", f"{b}/{nb}", shown])
    return Table(
        title=f"{pair.other} against {pair.reference}",
        columns=columns("channel", pair.reference, pair.other, "rate ratio", text=1),
        rows=rows,
        note=f"Over the {pair.contexts} contexts both answered. Rate ratio "
        f"{pair.other}/{pair.reference} with a 95% Katz interval (* zero count: ½ added "
        "to every cell).",
        footnotes=(
            "Spearman correlation of failure signatures ((context, channel) counts): "
            f"{_num(pair.signature_correlation)}; novel share (of {pair.other}'s failures, "
            f"those whose signature {pair.reference} never shows): "
            f"{_share(pair.novel_share)}.",
            f"Wrong tool names: Spearman {_num(pair.tool_name_correlation)}, novel share "
            f"{_share(pair.novel_tool_name_share)}.",
        ),
    )


def _repair_table(figures: ProbeFigures) -> Table:
    repair_names = [r.target for r in figures.repairs]
    rows = []
    for channel in (c.value for c in ANSWER_CHANNELS):
        cells = []
        for r in figures.repairs:
            reported, repaired = r.channels[channel]
            cells.append(
                "—" if not reported else f"{repaired}/{reported} ({_pct(repaired / reported, 0)}%)"
            )
        rows.append([channel, *cells])
    rows.append(
        [
            "delivered still failing",
            *(f"{r.delivered_failing}/{r.answered}" for r in figures.repairs),
        ]
    )
    return Table(
        title="Repair through the proxy",
        columns=columns("channel", *repair_names, text=1),
        rows=rows,
        note="Answers through the toolsentry proxy in which it reported the channel "
        "(x-toolsentry-violations), and how many of them it delivered with no violation.",
    )


def _share(value: float | None) -> str:
    return "— (no failures)" if value is None else f"{_pct(value)}%"


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def channel_plot(figures: ProbeFigures) -> Figure:
    """Per-channel violation rates per target, with their intervals."""
    figure = Figure(figsize=(7.5, 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    count = max(1, len(figures.targets))
    width = 0.8 / count
    for position, target in enumerate(figures.targets):
        colour = COLOURS[position % len(COLOURS)]
        rates = [target.channels[c] for c in CHANNEL_NAMES]
        values = [100 * (r.value or 0.0) for r in rates]
        low = [
            v - 100 * (r.low if r.low is not None else 0.0)
            for v, r in zip(values, rates, strict=True)
        ]
        high = [
            100 * (r.high if r.high is not None else 0.0) - v
            for v, r in zip(values, rates, strict=True)
        ]
        offsets = [i + (position - (count - 1) / 2) * width for i in range(len(CHANNEL_NAMES))]
        axes.barh(
            offsets,
            values,
            height=width,
            color=colour,
            label=target.target.name,
            xerr=[low, high],
            error_kw={"elinewidth": 0.8, "capsize": 2},
        )
    axes.set_yticks(list(range(len(CHANNEL_NAMES))), CHANNEL_NAMES, fontsize=8)
    axes.invert_yaxis()
    axes.set_xlabel("answers with a violation (%), 95% CI over trajectories")
    axes.set_title("Violations per channel")
    axes.legend(loc="lower right", fontsize=8)
    axes.grid(axis="x", alpha=0.3)
    return figure


def render_terminal(figures: ProbeFigures) -> list[object]:
    """Rich renderables for the console."""
    return [t.rich() for t in tables(figures)]


def render_markdown(
    title: str, preamble: Sequence[str], figures: ProbeFigures, plot_path: str
) -> str:
    """The Markdown page: preamble lines, the tables, the plot linked from `plot_path`."""
    parts = [f"# {title}", "", *preamble, ""]
    for table in tables(figures):
        parts += [table.markdown(level=2), ""]
    parts += [f"![Violations per channel]({plot_path})", ""]
    return "\n".join(parts)


def render_html(
    title: str, preamble: Sequence[str], figures: ProbeFigures, plot: RenderedFigure
) -> str:
    """A self-contained HTML page (the plot embedded as PNG)."""
    data = base64.b64encode(plot.png).decode("ascii")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        *(f"<p>{html.escape(line)}</p>" for line in preamble),
        *(t.html(level=2) for t in tables(figures)),
        f'<figure><img alt="{html.escape(plot.title)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{html.escape(plot.title)}</figcaption></figure>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def write_pages(
    out: Path, title: str, preamble: Sequence[str], figures: ProbeFigures
) -> list[Path]:
    """Write `probe.md`, `probe.html` and the plot (PNG, SVG) under `out`; return the paths."""
    plot = render_figure("probe-channels", "Violations per channel", channel_plot(figures))
    figures_dir = out / "probe_figures"
    figures_dir.mkdir(parents=True, exist_ok=True)
    png = figures_dir / f"{plot.name}.png"
    svg = figures_dir / f"{plot.name}.svg"
    png.write_bytes(plot.png)
    svg.write_text(plot.svg, encoding="utf-8")
    markdown = out / "probe.md"
    markdown.write_text(
        render_markdown(title, preamble, figures, f"probe_figures/{plot.name}.png"),
        encoding="utf-8",
    )
    page = out / "probe.html"
    page.write_text(render_html(title, preamble, figures, plot), encoding="utf-8")
    return [markdown, page, png, svg]
