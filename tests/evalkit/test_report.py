"""The HTML report is self-contained, has a Markdown twin and figures in PNG and SVG, and renders
in headless Chromium without console errors and not blank."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from evalkit.analysis.compare import CellComparison, compare_cells
from evalkit.analysis.load import load_runs, pair_cells
from evalkit.analysis.run import RunAnalysis
from evalkit.report import (
    COLOURS,
    ReportFiles,
    budget_figure,
    render_figure,
    write_report,
)
from tests.evalkit.analysis.builders import (
    OK,
    UNKNOWN,
    USER_ERROR,
    Call,
    episode,
    errors,
    results,
    write,
)
from tests.require import needs

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = needs(
    "chromium",
    None
    if CHROMIUM
    else "chromium not found: install Debian's 'chromium' package (apt-get install chromium, "
    "or run scripts/system-deps) to run the report rendering tests",
)
_CONSOLE = re.compile(r":CONSOLE[:(]")


def _side(tmp_path: Path, name: str, damage: int) -> list[Path]:
    """A retail and a telecom file; `damage` more made-up tool calls on the first tasks."""
    retail = [
        episode(
            str(t),
            [*errors(damage if t < 4 else 0, UNKNOWN, "get_weather"), Call(OK)],
            reward=0.0 if t < damage else 1.0,
        )
        for t in range(16)
    ]
    telecom = [
        episode(
            str(t), [Call(USER_ERROR, "toggle_data")] * (t % 3) + errors(damage if t < 3 else 0)
        )
        for t in range(12)
    ]
    return [
        write(tmp_path / f"{name}-retail.json", results(retail, model=f"m-{name}")),
        write(
            tmp_path / f"{name}-telecom.json",
            results(telecom, domain="telecom", model=f"m-{name}", max_errors=6),
        ),
    ]


def _comparisons(tmp_path: Path) -> list[CellComparison]:
    a = load_runs(_side(tmp_path, "bf16", 1), label="bf16", resamples=500)
    b = load_runs(_side(tmp_path, "int4", 3), label="int4", resamples=500)
    return compare_cells(pair_cells(a, b), resamples=500)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> ReportFiles:
    directory = tmp_path_factory.mktemp("report")
    return write_report(
        directory / "report.html", comparisons=_comparisons(directory), title="bf16 vs int4"
    )


def test_the_page_embeds_every_figure_and_loads_nothing_else(report: ReportFiles) -> None:
    page = report.html.read_text(encoding="utf-8")
    images = re.findall(r'<img alt="[^"]*" src="([^"]+)"', page)
    assert len(images) == 6  # two cells, three figures each
    for source in images:
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n")
    assert "<script" not in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "<h2>Comparison</h2>" in page
    assert page.count('<p class="verdict">') == 2


def test_figures_are_written_as_png_and_svg_beside_the_page(report: ReportFiles) -> None:
    assert len(report.figures) == 12
    assert {p.parent for p in report.figures} == {report.html.parent / "report_figures"}
    assert {p.suffix for p in report.figures} == {".png", ".svg"}
    for path in report.figures:
        if path.suffix == ".svg":
            assert path.read_text(encoding="utf-8").lstrip().startswith("<?xml")
        else:
            assert path.read_bytes().startswith(b"\x89PNG")


def test_the_markdown_twin_has_the_tables_verdicts_and_links_to_the_figures(
    report: ReportFiles,
) -> None:
    markdown = report.markdown.read_text(encoding="utf-8")
    assert report.markdown == report.html.with_suffix(".md")
    assert markdown.startswith("# bf16 vs int4\n")
    assert "| cell | A | B | pairs |" in markdown
    assert markdown.count("\n> score ") == 2
    links = re.findall(r"!\[[^]]*\]\(([^)]+)\)", markdown)
    assert len(links) == 6
    for link in links:
        assert (report.markdown.parent / link).is_file()


def test_svg_output_is_byte_for_byte_reproducible(tmp_path: Path) -> None:
    (run,) = load_runs([_side(tmp_path, "x", 1)[0]], resamples=200)
    first = render_figure("b", "Budget curve", budget_figure([run]))
    second = render_figure("b", "Budget curve", budget_figure([run]))
    assert first.svg == second.svg


def test_a_report_of_single_runs_has_no_comparison(tmp_path: Path) -> None:
    runs: list[RunAnalysis] = load_runs(_side(tmp_path, "solo", 2), resamples=200)
    files = write_report(tmp_path / "solo.html", runs=runs)
    page = files.html.read_text(encoding="utf-8")
    assert "Comparison" not in page
    assert page.count("<h2 ") == 2
    assert len(files.figures) == 12


# -- rendering in a real browser -------------------------------------------------------------


def run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--enable-logging=stderr",
        "--v=0",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)


def console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if _CONSOLE.search(line)]


@needs_chromium
def test_the_console_check_catches_a_page_that_logs_an_error(tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><p>x</p><script>missingFunction()</script>")
    run = run_chromium(tmp_path, "--dump-dom", page.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    assert any("missingFunction" in line for line in console_lines(run.stderr))


@needs_chromium
def test_the_report_renders_in_chromium_without_console_errors(
    report: ReportFiles, tmp_path: Path
) -> None:
    run = run_chromium(tmp_path, "--dump-dom", report.html.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    assert console_lines(run.stderr) == []
    dom = run.stdout
    assert "<title>bf16 vs int4</title>" in dom
    assert dom.count("<img ") == 6
    assert dom.count("<table>") >= 9


@needs_chromium
def test_the_screenshot_of_the_report_shows_the_figures(
    report: ReportFiles, tmp_path: Path
) -> None:
    shot = tmp_path / "shot.png"
    run = run_chromium(
        tmp_path, f"--screenshot={shot}", "--window-size=1280,2000", report.html.as_uri()
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert console_lines(run.stderr) == []
    pixels = imread(shot)[:, :, :3]
    assert pixels.shape[:2] == (2000, 1280)
    flat = (pixels.reshape(-1, 3) * 255).round().astype(int)
    assert len(np.unique(flat, axis=0)) > 200  # text, tables and anti-aliased plots
    non_white = np.mean(np.any(flat < 240, axis=1))
    assert non_white > 0.03
    # The plots' line and bar colours of A and B appear only inside the embedded images.
    for colour in COLOURS[:2]:
        rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
        assert np.sum(np.all(np.abs(flat - rgb) <= 6, axis=1)) > 300, colour
