"""The analysis's figures as tables (`evalkit/analysis/figure_tables.py`): how a figure becomes a
cell's text, and the tables of one small run."""

from __future__ import annotations

from pathlib import Path

from evalkit.analysis.budget import Budget
from evalkit.analysis.channels import ErrorChannel
from evalkit.analysis.compare import compare_runs
from evalkit.analysis.figure_tables import (
    NONE,
    budget_ci_table,
    budget_order,
    budget_table,
    channel_table,
    interval,
    num,
    p_value,
    pct,
    runs_table,
)
from evalkit.analysis.load import load_runs
from evalkit.analysis.run import RunAnalysis
from tests.evalkit.analysis.builders import OK, UNKNOWN, Call, episode, errors, results, write


def _run(tmp_path: Path) -> RunAnalysis:
    sims = [
        episode("1", [Call(OK), Call(UNKNOWN, "get_weather")]),
        episode("2", errors(2), reward=0.0, termination="too_many_errors"),
    ]
    path = write(tmp_path / "run.json", results(sims, domain="airline", max_errors=2))
    (run,) = load_runs([path], resamples=200)
    return run


def test_a_figure_becomes_points_numbers_or_a_dash() -> None:
    assert (pct(0.609), pct(0.5, 0), pct(None)) == ("60.9", "50", NONE)
    assert (num(1.234), num(None)) == ("1.23", NONE)
    assert (p_value(0.0004), p_value(0.0123), p_value(None)) == ("<0.001", "0.012", NONE)
    assert interval(0.743, 0.939) == "74.3–93.9"


def test_the_runs_budget_comes_first_and_the_runs_table_has_one_row_per_run(
    tmp_path: Path,
) -> None:
    run = _run(tmp_path)
    order = budget_order([run])
    assert order[0] is run.budget
    assert set(order) == set(Budget)
    table = runs_table([run])
    assert len(table.rows) == 1
    row = dict(zip([c.header for c in table.columns], table.rows[0], strict=True))
    assert (row["run"], row["n"], row["reward"]) == (run.label, "2", "50.0")


def test_a_budget_table_has_a_cell_for_every_budget_up_to_the_runs_own(tmp_path: Path) -> None:
    run = _run(tmp_path)
    table = budget_table([run], run.budget)
    assert [c.header for c in table.columns] == ["run", "k=0", "k=1", "k=2"]
    assert table.rows[0][0] == run.label
    assert table.rows[0][1] == "0.0"  # no episode passes with no budget at all


def test_a_figure_whose_values_do_not_vary_shows_no_interval(tmp_path: Path) -> None:
    """At k = 0 every episode scores 0, and a run against itself differs by 0 everywhere: a point
    is shown as such, never as an interval [x, x]."""
    run = _run(tmp_path)
    cell = compare_runs(run, run, resamples=200)
    table = budget_ci_table((run, run), cell.budget, cell)
    assert table.rows[0][1:] == ["0.0 (no spread)", "0.0 (no spread)", "+0.0 (no spread)"]
    assert all(row[-1] == "+0.0 (no spread)" for row in table.rows)


def _run_of(tmp_path: Path, sims: list[dict[str, object]], name: str = "run.json") -> RunAnalysis:
    path = write(tmp_path / name, results(sims, domain="airline", max_errors=2))
    (run,) = load_runs([path], resamples=200)
    return run


def test_a_mean_reward_without_spread_or_of_one_task_shows_what_is_missing(tmp_path: Path) -> None:
    alike = _run_of(tmp_path, [episode("1"), episode("2")], "alike.json")
    one = _run_of(tmp_path, [episode("1"), episode("1", reward=0.0, trial=1)], "one.json")
    spread = _run_of(tmp_path, [episode("1"), episode("2", reward=0.0)], "spread.json")
    cells = {r.label: r for r in (alike, one, spread)}
    table = runs_table(list(cells.values()))
    shown = dict(zip(cells, table.column("95% CI"), strict=True))
    assert shown[alike.label] == "(no spread)"
    assert shown[one.label] == "(1 task)"
    assert spread.reward_ci is not None
    assert shown[spread.label] == interval(*spread.reward_ci)
    assert alike.reward_ci is None
    assert one.reward_ci is None
    assert alike.to_dict()["reward_ci_missing"] == (
        "every task's mean reward is 100.0: no spread to resample"
    )
    assert one.to_dict()["reward_ci_missing"] == "1 task; an interval needs two or more"
    assert spread.to_dict()["reward_ci_missing"] is None


def test_a_channel_without_a_rate_ratio_says_what_is_missing(tmp_path: Path) -> None:
    a = _run_of(tmp_path, [episode("1", [Call(OK)]), episode("2", [Call(OK)])], "a.json")
    b = _run_of(tmp_path, [episode("1", [Call(OK)]), episode("2", [Call(UNKNOWN, "x")])], "b.json")
    cell = compare_runs(a, b, resamples=200)
    rows = {row[0]: row[-1] for row in channel_table((a, b), cell).rows}
    assert rows[ErrorChannel.UNKNOWN_TOOL.label].startswith("×")
    assert rows[ErrorChannel.SCHEMA_VIOLATION.label] == f"{NONE} (no failures on either side)"
