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
from evalkit.analysis.figure_tables import (
    budget_ci_table,
    budget_order,
    channel_table,
    compare_table,
    experienced_tables,
    runs_table,
    termination_table,
    wrong_names_table,
)
from evalkit.analysis.run import RunAnalysis
from evalkit.analysis.table import Table

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
    """Mean reward at every error budget, one line per run, with its confidence band, on the
    budget the (first) run was budgeted with."""
    figure, axes = _new_figure()
    budget = budget_order(runs)[0]
    for colour, run in zip(COLOURS, runs, strict=False):
        curve = run.curve(budget)
        ks = [p.k for p in curve]
        axes.fill_between(
            ks,
            [100 * p.ci_low for p in curve],
            [100 * p.ci_high for p in curve],
            color=colour,
            alpha=0.18,
            linewidth=0,
        )
        axes.plot(
            ks,
            [100 * p.pass_rate for p in curve],
            marker="o",
            markersize=4,
            color=colour,
            label=run.label,
        )
    axes.set_xlabel(f"error budget k ({budget.label})")
    axes.set_ylabel("mean reward (points)")
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
        render_figure(
            f"{prefix}-budget",
            f"Budget curve: {budget_order(list(runs))[0].label}",
            budget_figure(runs),
        ),
        render_figure(f"{prefix}-channels", "Failures per channel", channel_figure(runs)),
        render_figure(f"{prefix}-errors", "Errors per episode", histogram_figure(runs)),
    )
    return Section(title, runs, comparison, figures)


# -- HTML and Markdown -------------------------------------------------------------------------


def section_tables(section: Section) -> list[Table]:
    """The tables of one section, in reading order (the same builders `analyze` prints with):
    the paper's statistics first — both budgets' curves, each titled with its budget, then the
    per-channel rate ratios with their intervals — then the runs and the breakdowns."""
    runs, comparison = section.runs, section.comparison
    shown = [budget_ci_table(runs, budget, comparison) for budget in budget_order(runs)]
    shown += [channel_table(runs, comparison), runs_table(runs), *experienced_tables(runs)]
    shown += [termination_table(runs), wrong_names_table(runs, top=8)]
    return shown


STATISTICS: Final = (
    "ρ wrong names: Spearman rank correlation of how often each wrong tool name is called in A "
    "and in B (the paper's statistic: the same mistakes, louder, when close to 1).",
    "novel wrong names %: the share of B's wrong-name calls whose name A never calls.",
    "ρ task×channel: the same correlation over (task, channel) signatures of every tool error.",
    "novel task×channel %: the share of B's tool errors whose (task, channel) never fails in A.",
    "largest gap: where B's budget curve falls furthest below A's (k ≥ 1).",
    "TOST p: the equivalence test of the score within ±margin points — two one-sided paired "
    "t-tests on the per-task mean differences (n − 1 degrees of freedom), equivalent when "
    "p < 0.05. It assumes the tasks independent and their mean difference close to normal (a "
    "t-test on few tasks with skewed differences can mislead); not run where the differences "
    "do not vary or fewer than two tasks pair.",
)


_CSS: Final = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d2430;
       margin: 2rem auto; max-width: 1180px; padding: 0 1.2rem; background: #fbfbfd; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; } h2 { margin-top: 2.4rem; border-bottom: 2px solid #dfe3ea; }
p.note { color: #5b6575; margin-top: 0; }
p.verdict { font-size: 1.05rem; background: #eef3fb; border-left: 4px solid #1f5fa8;
            padding: .6rem .9rem; }
table { border-collapse: collapse; margin: .8rem 0 1.2rem; font-size: 13px; background: #fff; }
th, td { border: 1px solid #dfe3ea; padding: .3rem .55rem; text-align: left; vertical-align: top; }
th { background: #f1f4f8; } td.num { text-align: right; }
.figures { display: flex; flex-wrap: wrap; gap: .8rem; }
figure { margin: 0; background: #fff; border: 1px solid #dfe3ea; padding: .4rem; }
figure img { width: 560px; max-width: 100%; height: auto; display: block; }
figcaption { font-size: 12px; color: #5b6575; }
"""


def header_note(sections: Sequence[Section]) -> str:
    """What the page's numbers are, in the words of the budgets its figures use: each budget
    curve is titled with its budget, the one the runs ran under first."""
    runs = [run for section in sections for run in section.runs]
    budgets = "; ".join(f"{b.label}: {b.definition}" for b in budget_order(runs))
    compared = (
        " A is the reference run, B the candidate."
        if any(s.comparison is not None for s in sections)
        else ""
    )
    return (
        "Scores and rates in points (per 100). Budget k: the score had every episode been "
        f"stopped when its failures reached k, from the recorded run, on two budgets, each "
        f"curve and figure titled with its own ({budgets}); the first curve is the budget the "
        f"runs ran under.{compared}"
    )


def render_html(title: str, sections: Sequence[Section]) -> str:
    """The whole page, with every figure embedded; no scripts and no external resources."""
    comparisons = [s.comparison for s in sections if s.comparison is not None]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="note">{html.escape(header_note(sections))}</p>',
    ]
    if comparisons:
        parts.append("<h2>Comparison</h2>")
        parts.append(compare_table(comparisons).html(level=0))
        described = [*STATISTICS, comparisons[0].bootstrap()]
        parts.append("<ul>" + "".join(f"<li>{html.escape(d)}</li>" for d in described) + "</ul>")
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
        tables = section_tables(section)
        parts.append(tables[0].html())
        parts.append('<div class="figures">')
        for figure in section.figures:
            data = base64.b64encode(figure.png).decode("ascii")
            parts.append(
                f'<figure><img alt="{html.escape(figure.title)}" '
                f'src="data:image/png;base64,{data}"><figcaption>{html.escape(figure.title)}'
                "</figcaption></figure>"
            )
        parts.append("</div>")
        parts += [table.html() for table in tables[1:]]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def render_markdown(title: str, sections: Sequence[Section], figures_dir: str) -> str:
    """The Markdown twin of the page; figures are linked from `figures_dir` (relative)."""
    comparisons = [s.comparison for s in sections if s.comparison is not None]
    parts = [f"# {title}", "", header_note(sections), ""]
    if comparisons:
        parts += ["## Comparison", "", compare_table(comparisons).markdown(level=0)]
        parts += [f"- {d}" for d in (*STATISTICS, comparisons[0].bootstrap())]
        parts.append("")
        parts += [f"- **{c.name}**: {c.verdict()}" for c in comparisons]
        parts.append("")
    for section in sections:
        parts += [f"## {section.title}", ""]
        if section.comparison is not None:
            parts += [f"> {section.comparison.verdict()}", ""]
        tables = section_tables(section)
        parts += [tables[0].markdown(level=3)]
        parts += [f"![{f.title}]({figures_dir}/{f.name}.png)" for f in section.figures]
        parts.append("")
        parts += [table.markdown(level=3) for table in tables[1:]]
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
