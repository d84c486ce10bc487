"""The analysis's figures as tables (`evalkit/analysis/figure_tables.py`): how a figure becomes a
cell's text, and the tables of one small run."""

from __future__ import annotations

from pathlib import Path

from evalkit.analysis.budget import Budget
from evalkit.analysis.compare import compare_runs
from evalkit.analysis.figure_tables import (
    NONE,
    budget_ci_table,
    budget_order,
    budget_table,
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
