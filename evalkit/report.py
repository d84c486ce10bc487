"""`evalkit report`: one self-contained HTML page, and a Markdown twin for pull requests.

The page holds, per cell (A against B) or per run: the verdict, the budget curves with their
confidence bands, the per-channel failure rates, the errors-per-episode histograms, and the
tables behind them; at the top, the comparison table of every cell. Figures are drawn with
matplotlib's Agg backend, embedded in the HTML as base64 PNG (the page needs no other file and
no script), and also written as PNG and SVG into `<name>_figures/` beside it, where the Markdown
links to them.

Building the page is pure (`render_html`, `render_markdown` over `Section`s); `write_report` is
the edge that draws and writes the files.
"""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from evalkit.analysis.channels import ErrorChannel
from evalkit.analysis.compare import CellComparison
from evalkit.analysis.run import RunAnalysis

COLOURS: Final = ("#1f5fa8", "#d1495b", "#2e8b57", "#8a5fbf")
_SLUG: Final = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True, slots=True)
class RenderedFigure:
    """One figure as PNG bytes and SVG text; `name` is its file name without extension."""

    name: str
    title: str
    png: bytes
    svg: str


@dataclass(frozen=True)
class Section:
    """One part of the report: a cell comparison (A and B), or a single run."""

    title: str
    runs: tuple[RunAnalysis, ...]
    comparison: CellComparison | None
    figures: tuple[RenderedFigure, ...]

    @property
    def slug(self) -> str:
        return _SLUG.sub("-", self.title.lower()).strip("-") or "section"


@dataclass(frozen=True, slots=True)
class ReportFiles:
    """What `write_report` wrote."""

    html: Path
    markdown: Path
    figures: tuple[Path, ...]


# -- figures -----------------------------------------------------------------------------------


def budget_figure(runs: Sequence[RunAnalysis]) -> Figure:
    """Mean reward at every error budget, one line per run, with its confidence band."""
    figure, axes = _new_figure()
    for colour, run in zip(COLOURS, runs, strict=False):
        ks = [p.k for p in run.budget_curve]
        axes.fill_between(
            ks,
            [100 * p.ci_low for p in run.budget_curve],
            [100 * p.ci_high for p in run.budget_curve],
            color=colour,
            alpha=0.18,
            linewidth=0,
        )
        axes.plot(
            ks,
            [100 * p.pass_rate for p in run.budget_curve],
            marker="o",
            markersize=4,
            color=colour,
            label=run.label,
        )
    axes.set_xlabel("error budget k (episode ends when its tool errors reach k)")
    axes.set_ylabel("pass rate (%)")
    axes.set_ylim(0, 100)
    axes.set_title("Budget curve (95% bootstrap CI)")
    top = max((r.max_errors for r in runs), default=0)
    axes.set_xticks(list(range(top + 1)))
    axes.legend(loc="lower right", fontsize=8)
    axes.grid(alpha=0.3)
    return figure


def channel_figure(runs: Sequence[RunAnalysis]) -> Figure:
    """Failures per 100 calls of each channel, one bar per run."""
    figure, axes = _new_figure()
    channels = list(ErrorChannel)
    width = 0.8 / max(1, len(runs))
    for position, (colour, run) in enumerate(zip(COLOURS, runs, strict=False)):
        rates = [100 * (run.rate(c) or 0.0) for c in channels]
        offsets = [i + (position - (len(runs) - 1) / 2) * width for i in range(len(channels))]
        axes.barh(offsets, rates, height=width, color=colour, label=run.label)
    axes.set_yticks(list(range(len(channels))), [c.label for c in channels], fontsize=8)
    axes.invert_yaxis()
    axes.set_xlabel("failures per 100 calls (user tool errors: per 100 user calls)")
    axes.set_title("Failures per channel")
    axes.legend(loc="lower right", fontsize=8)
    axes.grid(axis="x", alpha=0.3)
    return figure


def histogram_figure(runs: Sequence[RunAnalysis]) -> Figure:
    """How many episodes had 0, 1, 2, … tool errors, side by side per run."""
    figure, axes = _new_figure()
    top = max((max(r.errors_per_episode(), default=0) for r in runs), default=0)
    width = 0.8 / max(1, len(runs))
    for position, (colour, run) in enumerate(zip(COLOURS, runs, strict=False)):
        counts = run.errors_per_episode()
        xs = [n + (position - (len(runs) - 1) / 2) * width for n in range(top + 1)]
        heights = [counts.get(n, 0) for n in range(top + 1)]
        axes.bar(xs, heights, width=width, color=colour, label=run.label)
    axes.set_xticks(list(range(top + 1)))
    axes.set_xlabel("tool errors in the episode")
    axes.set_ylabel("episodes")
    axes.set_title("Errors per episode")
    axes.legend(loc="upper right", fontsize=8)
    axes.grid(axis="y", alpha=0.3)
    return figure


def _new_figure() -> tuple[Figure, Axes]:
    figure = Figure(figsize=(6.4, 3.8), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def render_figure(name: str, title: str, figure: Figure) -> RenderedFigure:
    """The figure as PNG and SVG; the SVG is the same bytes for the same figure (no date, fixed
    ids), so reports can be diffed."""
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=110, metadata={"Software": None})
    svg = io.StringIO()
    with rc_context({"svg.hashsalt": "evalkit", "svg.fonttype": "none"}):
        figure.savefig(svg, format="svg", metadata={"Date": None, "Creator": None})
    return RenderedFigure(name, title, png.getvalue(), svg.getvalue())


def build_sections(
    comparisons: Sequence[CellComparison] = (), runs: Sequence[RunAnalysis] = ()
) -> list[Section]:
    """One section per comparison (A and B), then one per run compared with nothing."""
    sections: list[Section] = []
    for comparison in comparisons:
        sections.append(
            _section(comparison.name, (comparison.a, comparison.b), comparison, len(sections))
        )
    for run in runs:
        sections.append(_section(f"{run.domain} · {run.label}", (run,), None, len(sections)))
    return sections


def _section(
    title: str, runs: tuple[RunAnalysis, ...], comparison: CellComparison | None, number: int
) -> Section:
    prefix = f"{number + 1:02d}-{_SLUG.sub('-', runs[0].domain.lower()).strip('-')}"
    figures = (
        render_figure(f"{prefix}-budget", "Budget curve", budget_figure(runs)),
        render_figure(f"{prefix}-channels", "Failures per channel", channel_figure(runs)),
        render_figure(f"{prefix}-errors", "Errors per episode", histogram_figure(runs)),
    )
    return Section(title, runs, comparison, figures)


# -- HTML and Markdown -------------------------------------------------------------------------


def _pct(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{100 * value:.{digits}f}"


def _num(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _p(value: float | None) -> str:
    if value is None:
        return "—"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def compare_rows(comparisons: Sequence[CellComparison]) -> tuple[list[str], list[list[str]]]:
    """The comparison table: one row per cell."""
    header = [
        "cell",
        "A",
        "B",
        "pairs",
        "A score",
        "B score",
        "B − A [95% CI]",
        "p (Holm)",
        "TOST p",
        "ρ wrong names",
        "ρ task×channel",
        "novel %",
        "largest gap",
    ]
    rows = []
    for c in comparisons:
        gap = c.largest_gap()
        rows.append(
            [
                c.name,
                c.a.label,
                c.b.label,
                str(c.pairs),
                _pct(c.a_score),
                _pct(c.b_score),
                f"{100 * c.difference:+.1f} [{100 * c.ci[0]:+.1f}, {100 * c.ci[1]:+.1f}]",
                _p(c.p_holm),
                "—" if c.tost is None else _p(c.tost.p),
                _num(c.tool_name_correlation),
                _num(c.signature_correlation),
                _pct(c.novel_share),
                "—" if gap is None else f"{100 * gap.gap:.1f} at k={gap.k}",
            ]
        )
    return header, rows


def summary_rows(runs: Sequence[RunAnalysis]) -> tuple[list[str], list[list[str]]]:
    """One row per run: what it is and its headline figures."""
    header = [
        "run",
        "model",
        "episodes",
        "mean reward",
        "tool errors",
        "errors / episode",
        "budget",
        "schemas",
    ]
    rows = [
        [
            r.label,
            r.model,
            str(len(r.episodes)),
            _pct(r.mean_reward),
            str(r.errors),
            _num(r.errors / len(r.episodes) if r.episodes else None),
            str(r.max_errors),
            r.schema_source or "none (classified from error texts)",
        ]
        for r in runs
    ]
    return header, rows


def channel_rows(
    runs: Sequence[RunAnalysis], comparison: CellComparison | None = None
) -> tuple[list[str], list[list[str]]]:
    """Per channel: counts and rates per 100 calls of each run, and B/A with its interval."""
    header = ["channel"]
    for run in runs:
        prefix = f"{run.label}: " if len(runs) > 1 else ""
        header += [f"{prefix}count", f"{prefix}per 100 calls"]
    if comparison is not None:
        header.append("B/A [95% CI]")
    rows = []
    for channel in ErrorChannel:
        row = [channel.label]
        for run in runs:
            row += [str(run.channels()[channel]), _pct(run.rate(channel), 2)]
        if comparison is not None:
            found = next(c for c in comparison.channels if c.channel is channel)
            r = found.ratio
            row.append(
                "—"
                if r is None
                else f"×{r.ratio:.2f} [{r.low:.2f}, {r.high:.2f}]{'*' if r.corrected else ''}"
            )
        rows.append(row)
    return header, rows


def budget_rows(
    runs: Sequence[RunAnalysis], comparison: CellComparison | None = None
) -> tuple[list[str], list[list[str]]]:
    """Per budget k: each run's pass rate with its interval, and the gap A − B."""
    header = ["k"] + [f"{r.label if len(runs) > 1 else 'pass rate'} [95% CI]" for r in runs]
    if comparison is not None:
        header.append("gap A − B [95% CI]")
    rows = []
    top = max(r.max_errors for r in runs)
    for k in range(top + 1):
        row = [str(k)]
        for run in runs:
            point = next((p for p in run.budget_curve if p.k == k), None)
            row.append(
                "—"
                if point is None
                else f"{_pct(point.pass_rate)} [{_pct(point.ci_low)}, {_pct(point.ci_high)}]"
            )
        if comparison is not None:
            gap = next((g for g in comparison.gaps if g.k == k), None)
            row.append(
                "—"
                if gap is None
                else f"{100 * gap.gap:+.1f} [{100 * gap.ci_low:+.1f}, {100 * gap.ci_high:+.1f}]"
            )
        rows.append(row)
    return header, rows


def detail_rows(runs: Sequence[RunAnalysis]) -> tuple[list[str], list[list[str]]]:
    """Termination reasons and the most frequent wrong tool names, per run."""
    header = ["run", "termination reasons", "most frequent wrong tool names"]
    rows = []
    for run in runs:
        reasons = ", ".join(f"{k} {v}" for k, v in run.termination_reasons().most_common())
        names = ", ".join(f"{k} {v}" for k, v in run.wrong_tool_names().most_common(8))
        rows.append([run.label, reasons or "—", names or "none"])
    return header, rows


_CSS: Final = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2430;
       margin: 2rem auto; max-width: 1180px; padding: 0 1.2rem; background: #fbfbfd; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; } h2 { margin-top: 2.4rem; border-bottom: 2px solid #dfe3ea; }
p.note { color: #5b6575; margin-top: 0; }
p.verdict { font-size: 1.05rem; background: #eef3fb; border-left: 4px solid #1f5fa8;
            padding: .6rem .9rem; }
table { border-collapse: collapse; margin: .8rem 0 1.2rem; font-size: 13px; background: #fff; }
th, td { border: 1px solid #dfe3ea; padding: .3rem .55rem; text-align: left; vertical-align: top; }
th { background: #f1f4f8; }
.figures { display: flex; flex-wrap: wrap; gap: .8rem; }
figure { margin: 0; background: #fff; border: 1px solid #dfe3ea; padding: .4rem; }
figure img { width: 560px; max-width: 100%; height: auto; display: block; }
figcaption { font-size: 12px; color: #5b6575; }
"""


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(title: str, sections: Sequence[Section]) -> str:
    """The whole page, with every figure embedded; no scripts and no external resources."""
    comparisons = [s.comparison for s in sections if s.comparison is not None]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        '<p class="note">Scores and rates in points (per 100). Budget k: the score had every '
        "episode been stopped when its tool errors reached k, from the recorded run."
        + (" A is the reference run, B the candidate." if comparisons else "")
        + "</p>",
    ]
    if comparisons:
        parts.append("<h2>Comparison</h2>")
        parts.append(_html_table(*compare_rows(comparisons)))
        parts.append(
            "<ul>"
            + "".join(
                f"<li><b>{html.escape(c.name)}</b>: {html.escape(c.verdict())}</li>"
                for c in comparisons
            )
            + "</ul>"
        )
    for section in sections:
        parts.append(f'<h2 id="{section.slug}">{html.escape(section.title)}</h2>')
        if section.comparison is not None:
            parts.append(f'<p class="verdict">{html.escape(section.comparison.verdict())}</p>')
        parts.append(_html_table(*summary_rows(section.runs)))
        parts.append('<div class="figures">')
        for figure in section.figures:
            data = base64.b64encode(figure.png).decode("ascii")
            parts.append(
                f'<figure><img alt="{html.escape(figure.title)}" '
                f'src="data:image/png;base64,{data}"><figcaption>{html.escape(figure.title)}'
                "</figcaption></figure>"
            )
        parts.append("</div>")
        parts.append("<h3>Channels</h3>")
        parts.append(_html_table(*channel_rows(section.runs, section.comparison)))
        parts.append("<h3>Budget curve</h3>")
        parts.append(_html_table(*budget_rows(section.runs, section.comparison)))
        parts.append("<h3>Episodes</h3>")
        parts.append(_html_table(*detail_rows(section.runs)))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = [
        "| " + " | ".join(_md_cell(h) for h in header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(title: str, sections: Sequence[Section], figures_dir: str) -> str:
    """The Markdown twin of the page; figures are linked from `figures_dir` (relative)."""
    comparisons = [s.comparison for s in sections if s.comparison is not None]
    parts = [f"# {title}", ""]
    if comparisons:
        parts += ["## Comparison", "", _md_table(*compare_rows(comparisons)), ""]
        parts += [f"- **{_md_cell(c.name)}**: {c.verdict()}" for c in comparisons]
        parts.append("")
    for section in sections:
        parts += [f"## {section.title}", ""]
        if section.comparison is not None:
            parts += [f"> {section.comparison.verdict()}", ""]
        parts += [_md_table(*summary_rows(section.runs)), ""]
        parts += [f"![{f.title}]({figures_dir}/{f.name}.png)" for f in section.figures]
        parts += [
            "",
            "### Channels",
            "",
            _md_table(*channel_rows(section.runs, section.comparison)),
            "",
        ]
        parts += [
            "### Budget curve",
            "",
            _md_table(*budget_rows(section.runs, section.comparison)),
            "",
        ]
        parts += ["### Episodes", "", _md_table(*detail_rows(section.runs)), ""]
    return "\n".join(parts)


def write_report(
    output: Path,
    *,
    comparisons: Sequence[CellComparison] = (),
    runs: Sequence[RunAnalysis] = (),
    title: str = "evalkit report",
) -> ReportFiles:
    """Write the HTML page to `output`, its Markdown twin beside it (same name, `.md`), and every
    figure as PNG and SVG into `<output stem>_figures/`.

    Returns the paths written. Raises `OSError` when a file cannot be written.
    """
    sections = build_sections(comparisons, runs)
    output = Path(output)
    figures_dir = output.parent / f"{output.stem}_figures"
    figures_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for section in sections:
        for figure in section.figures:
            png = figures_dir / f"{figure.name}.png"
            svg = figures_dir / f"{figure.name}.svg"
            png.write_bytes(figure.png)
            svg.write_text(figure.svg, encoding="utf-8")
            written += [png, svg]
    output.write_text(render_html(title, sections), encoding="utf-8")
    markdown = output.with_suffix(".md")
    markdown.write_text(render_markdown(title, sections, figures_dir.name), encoding="utf-8")
    return ReportFiles(output, markdown, tuple(written))
