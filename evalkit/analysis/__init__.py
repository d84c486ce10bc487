"""Analysis of recorded runs: failures per channel from the trajectories, the budget curve, and the
statistics that tell a flat score from no damage (DESIGN §10).

    channels.py   classify every recorded tool error into one channel (with `proxy.guard`)
    budget.py     the score at every error budget k = 0…B, from one run at budget B
    stats.py      bootstrap, sign-flip test, Holm, TOST, rate ratios, Spearman
    run.py        one run's figures
    compare.py    A against B, per cell, with a verdict in plain words
    load.py       results files → runs (the I/O edge)
    table.py      the one table type (`Table`), rendered to the terminal, Markdown and HTML
    figure_tables.py   the figures above as `Table`s: the one place a figure becomes a cell's text
"""

from evalkit.analysis.budget import BudgetPoint, budget_curve, reward_at_budget
from evalkit.analysis.channels import (
    DeclaredTools,
    EpisodeFailures,
    ErrorChannel,
    Failure,
    classify_simulation,
)
from evalkit.analysis.compare import CellComparison, compare_cells, compare_runs
from evalkit.analysis.load import ToolSource, default_tool_source, load_runs, pair_cells
from evalkit.analysis.run import RunAnalysis, analyze_episodes

__all__ = [
    "BudgetPoint",
    "CellComparison",
    "DeclaredTools",
    "EpisodeFailures",
    "ErrorChannel",
    "Failure",
    "RunAnalysis",
    "ToolSource",
    "analyze_episodes",
    "budget_curve",
    "classify_simulation",
    "compare_cells",
    "compare_runs",
    "default_tool_source",
    "load_runs",
    "pair_cells",
    "reward_at_budget",
]
