"""`evalkit analyze`, `compare` and `report` on real and hand-built results files: output, JSON,
and bad input turned into a message and an exit code."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evalkit.cli import app
from tests.evalkit.analysis.builders import OK, UNKNOWN, Call, episode, results, write
from tests.evalkit.test_report import console_lines, needs_chromium, run_chromium

REPO = Path(__file__).resolve().parents[1].parent
runner = CliRunner()


def _pair(tmp_path: Path) -> tuple[Path, Path]:
    """Twenty tasks: A calls a made-up tool on tasks 0-1 once, B on tasks 0-7 twice and fails
    task 1; every episode also makes two good calls."""
    tasks = [str(i) for i in range(20)]
    good = [Call(OK), Call(OK)]
    a = [episode(t, [Call(UNKNOWN, "get_weather")] * (int(t) < 2) + good) for t in tasks]
    b = [
        episode(t, [Call(UNKNOWN, "get_weather")] * 2 * (int(t) < 8) + good, reward=float(t != "1"))
        for t in tasks
    ]
    return (
        write(tmp_path / "bf16.json", results(a, model="m")),
        write(tmp_path / "int4.json", results(b, model="m")),
    )


def test_analyze_json_of_taus_retail_run(tau2_results_file: Path, tau2_dir: Path) -> None:
    result = runner.invoke(
        app,
        [
            "analyze",
            str(tau2_results_file),
            "--data-dir",
            str(tau2_dir),
            "--json",
            "--resamples",
            "500",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["episodes"] == 40
    assert data["mean_reward"] == 0.85
    assert data["channels"]["environment_error"] == 12
    assert sum(data["channels"].values()) == 12
    assert data["budget_curve"][-1] == {
        "k": 10,
        "pass_rate": 0.85,
        "ci_low": data["budget_curve"][-1]["ci_low"],
        "ci_high": data["budget_curve"][-1]["ci_high"],
    }
    assert data["termination_reasons"] == {"user_stop": 40}


def test_analyze_prints_tables_of_channels_errors_and_budget(tmp_path: Path) -> None:
    a, _ = _pair(tmp_path)
    result = runner.invoke(app, ["analyze", str(a), "--resamples", "200"])
    assert result.exit_code == 0, result.output
    for heading in (
        "Tool errors per channel",
        "Episodes by tool errors",
        "Budget curve",
        "get_weather",
    ):
        assert heading in result.output


def test_analyze_refuses_files_of_two_runs_and_names_them(tmp_path: Path) -> None:
    retail = write(tmp_path / "r.json", results([episode("1")]))
    telecom = write(tmp_path / "t.json", results([episode("1")], domain="telecom"))
    result = runner.invoke(app, ["analyze", str(retail), str(telecom)])
    assert result.exit_code == 2
    assert "2 runs (retail · test-model; telecom · test-model)" in result.output


def test_compare_json_has_one_cell_with_a_verdict(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    result = runner.invoke(app, ["compare", str(a), str(b), "--json", "--resamples", "500"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["margin_points"] == 7.5
    (cell,) = data["cells"]
    assert cell["pairs"] == 20
    assert cell["difference"] == -0.05
    # 16 of 56 calls against 2 of 42: ×6.0.
    assert "tool-name hallucination ×6.0 [" in cell["verdict"]


def test_compare_with_repeated_sides_groups_cells_and_prints_verdicts(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    ta = write(tmp_path / "ta.json", results([episode("1"), episode("2")], domain="telecom"))
    tb = write(tmp_path / "tb.json", results([episode("1"), episode("2")], domain="telecom"))
    result = runner.invoke(
        app,
        [
            *("compare", "--a", str(a), "--a", str(ta), "--b", str(b), "--b", str(tb)),
            *("--delta", "5", "--label-a", "bf16", "--label-b", "int4", "--resamples", "200"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "retail · m (bf16 vs int4): " in result.output
    # Two identical telecom episodes a side: zero variance, so no equivalence is claimed.
    assert "telecom · test-model (bf16 vs int4): score B − A +0.0, not tested" in result.output


def test_compare_refuses_ambiguous_sides(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    three = runner.invoke(app, ["compare", str(a), str(b), str(a)])
    assert three.exit_code == 2
    assert "--a FILE and --b FILE" in three.output
    mixed = runner.invoke(app, ["compare", str(a), str(b), "--a", str(a)])
    assert mixed.exit_code == 2
    assert "not both" in mixed.output
    one_side = runner.invoke(app, ["compare", "--a", str(a)])
    assert one_side.exit_code == 2
    assert "--b FILE" in one_side.output


def test_compare_of_a_missing_file_exits_4(tmp_path: Path) -> None:
    a, _ = _pair(tmp_path)
    result = runner.invoke(app, ["compare", str(a), str(tmp_path / "nope.json")])
    assert result.exit_code == 4
    assert "no such results file" in result.output


def test_report_runs_as_a_program_and_writes_page_markdown_and_figures(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    out = tmp_path / "out" / "report.html"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "evalkit.cli", "report", str(a), str(b), "-o", str(out)),
            *("--resamples", "200", "--title", "bf16 vs int4"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "6 figures" in proc.stdout
    assert "<h1>bf16 vs int4</h1>" in out.read_text(encoding="utf-8")
    assert out.with_suffix(".md").is_file()
    assert len(list((out.parent / "report_figures").iterdir())) == 6


def test_report_of_one_run_needs_no_second_side(tmp_path: Path) -> None:
    a, _ = _pair(tmp_path)
    result = runner.invoke(
        app, ["report", str(a), "-o", str(tmp_path / "one.html"), "--resamples", "200"]
    )
    assert result.exit_code == 0, result.output
    assert "Comparison" not in (tmp_path / "one.html").read_text(encoding="utf-8")


# -- a run directory, as `make demo` writes it -------------------------------------------------


def _evalkit(*args: str) -> subprocess.CompletedProcess[str]:
    """The real `evalkit` program, run from the repository."""
    return subprocess.run(
        [sys.executable, "-m", "evalkit.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `make demo` writes (`evalkit replay --domain retail --out DIR`: its four arms), on
    the first twelve tasks."""
    out = tmp_path_factory.mktemp("demo") / "demo"
    tasks = ",".join(str(i) for i in range(12))
    proc = _evalkit("replay", "--domain", "retail", "--out", str(out), "--tasks", tasks)
    assert proc.returncode == 0, proc.stderr
    return out


def test_compare_of_a_run_directory_compares_its_arms_as_the_headline_does(
    demo_dir: Path,
) -> None:
    proc = _evalkit("compare", str(demo_dir), "--resamples", "200")
    assert proc.returncode == 0, proc.stderr
    verdicts = [line.split(":")[0] for line in proc.stdout.splitlines() if ": score " in line]
    assert verdicts == [
        "retail · sim-bf16 vs sim-int4",
        "retail · sim-bf16 (bf16 vs bf16+repair)",
        "retail · sim-int4 (int4 vs int4+repair)",
    ]


def test_analyze_of_a_run_directory_shows_every_arm(demo_dir: Path) -> None:
    proc = _evalkit("analyze", str(demo_dir), "--json", "--resamples", "200")
    assert proc.returncode == 0, proc.stderr
    arms = json.loads(proc.stdout)
    assert list(arms) == ["bf16", "bf16+repair", "int4", "int4+repair"]
    assert {arm["label"] for arm in arms.values()} == set(arms)


def test_report_of_a_run_directory_names_the_arms(demo_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    proc = _evalkit("report", str(demo_dir), "-o", str(out), "--resamples", "200")
    assert proc.returncode == 0, proc.stderr
    page = out.read_text(encoding="utf-8")
    assert "int4 vs int4+repair" in page
    assert "sim-bf16 vs sim-int4" in page
    # The header's words are the budgets' own, the one these episodes ran under first; the
    # intervals' method, seed and resamples are stated.
    assert "Budget curve: proxy experienced-failure budget" in page
    assert "the first curve is the budget the runs ran under" in page
    assert "when its tool errors reached k" not in page
    assert "basic bootstrap over tasks, seed 0, 200 resamples" in page


def test_two_run_directories_pair_their_arms_by_name(demo_dir: Path) -> None:
    proc = _evalkit("compare", str(demo_dir), str(demo_dir), "--resamples", "200")
    assert proc.returncode == 0, proc.stderr
    assert "retail · sim-int4 (int4+repair): score " in proc.stdout


def test_arms_of_different_configurations_are_never_pooled(demo_dir: Path) -> None:
    proc = _evalkit(
        *("compare", "--a", str(demo_dir / "int4" / "results.json")),
        *("--a", str(demo_dir / "int4+repair" / "results.json")),
        *("--b", str(demo_dir / "bf16" / "results.json")),
    )
    assert proc.returncode == 2
    assert "not trials of one configuration" in proc.stderr
    assert "repair off vs reask" in proc.stderr


def test_identical_paired_rewards_give_no_interval_and_no_equivalence(tmp_path: Path) -> None:
    """Eight tasks, the same reward on both sides: zero variance proves nothing."""
    sims = [episode(str(t), [Call(OK)], reward=float(t % 2)) for t in range(8)]
    a = write(tmp_path / "a.json", results(sims, model="m"))
    b = write(tmp_path / "b.json", results(sims, model="m"))
    result = runner.invoke(app, ["compare", str(a), str(b), "--resamples", "200"])
    assert result.exit_code == 0, result.output
    assert "equivalent" not in result.output
    assert "not tested: the paired differences do not vary (every one of 8 tasks +0.0)" in (
        " ".join(result.output.split())
    )
    assert "12.5 points" in result.output


def test_wrong_name_correlation_is_shown_under_the_threshold_with_a_warning(
    tmp_path: Path,
) -> None:
    """Six wrong-name calls in A, nine in B, over three names: ρ with its interval and a warning."""
    good = [Call(OK), Call(OK)]
    a_names = {0: "get_weather", 1: "get_weather", 2: "get_weather", 3: "lookup", 4: "lookup"}
    a_names |= {5: "find_user"}
    b_names = {0: "get_weather", 1: "lookup", 2: "get_weather", 3: "lookup", 4: "get_weather"}
    b_names |= {5: "find_user", 6: "get_weather", 7: "lookup", 8: "get_weather"}
    tasks = range(12)
    a = [
        episode(str(t), [*[Call(UNKNOWN, a_names.get(t, ""))] * (t in a_names), *good])
        for t in tasks
    ]
    b = [
        episode(str(t), [*[Call(UNKNOWN, b_names.get(t, ""))] * (t in b_names), *good])
        for t in tasks
    ]
    a_file = write(tmp_path / "a.json", results(a, model="m"))
    b_file = write(tmp_path / "b.json", results(b, model="m"))
    result = runner.invoke(app, ["compare", str(a_file), str(b_file), "--json"])
    assert result.exit_code == 0, result.output
    (cell,) = json.loads(result.stdout)["cells"]
    assert cell["spearman"]["wrong_tool_names"] is not None
    assert "wrong tool names ρ" in cell["verdict"]
    assert "warning: only 6 (A) and 9 (B) wrong-name calls" in cell["verdict"]


class _PageText(HTMLParser):
    """The text a reader sees of a page, block by block (no style sheet)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._style = tag == "style"
        self.parts.append("\n" if tag in {"h1", "h2", "h3", "p", "li", "tr", "figcaption"} else " ")

    def handle_endtag(self, tag: str) -> None:
        self._style = False

    def handle_data(self, data: str) -> None:
        if not self._style:
            self.parts.append(data)

    @classmethod
    def of(cls, dom: str) -> str:
        parser = cls()
        parser.feed(dom)
        return "".join(parser.parts)


@needs_chromium
def test_the_rendered_report_of_a_run_directory_shows_the_papers_statistics_first(
    demo_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report.html"
    proc = _evalkit("report", str(demo_dir), "-o", str(out), "--resamples", "200")
    assert proc.returncode == 0, proc.stderr
    rendered = run_chromium(tmp_path, "--dump-dom", out.as_uri())
    assert rendered.returncode == 0, rendered.stderr[-2000:]
    assert console_lines(rendered.stderr) == []
    text = _PageText.of(rendered.stdout)
    # The comparison of every arm comes first: the wrong-name rank correlation, and the
    # equivalence test with its assumptions.
    head, first, *_ = text.split("\nretail · sim-bf16 vs sim-int4\n")
    assert "ρ wrong names" in head
    assert "TOST p: the equivalence test" in head
    assert "It assumes the tasks independent" in head
    # In the first arm's section, before its runs table: both budgets' curves, each labelled,
    # then the per-channel rate ratios with their intervals.
    before_runs = first.split("\nRuns\n")[0]
    assert "Budget curve: proxy experienced-failure budget" in before_runs
    assert "Budget curve: τ²-bench tool-error budget" in before_runs
    assert "B/A [95% CI]" in before_runs
    assert re.search(r"×\d+\.\d\d \[\d+\.\d\d, \d+\.\d\d\]", before_runs)
    assert before_runs.index("Budget curve: τ²-bench") < before_runs.index("B/A [95% CI]")
