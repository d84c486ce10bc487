"""`evalkit analyze`, `compare` and `report`: the command line of the analysis of recorded runs
(registered in `evalkit.cli`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from evalkit.analysis.compare import CellComparison, compare_cells
from evalkit.analysis.figure_tables import (
    budget_ci_table,
    budget_order,
    budget_table,
    channel_table,
    errors_table,
    experienced_tables,
    figures_table,
    pct,
    reward_interval,
    runs_table,
    silent_table,
    tasks_table,
    termination_table,
    wrong_names_table,
)
from evalkit.analysis.load import (
    Arm,
    DomainData,
    arm_pairs,
    finding_pairs,
    load_arms,
    load_runs,
    pair_cells,
)
from evalkit.analysis.run import RunAnalysis
from evalkit.analysis.stats import DEFAULT_RESAMPLES
from evalkit.errors import UsageError
from evalkit.exits import exit_on_error
from evalkit.report import write_report

DataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="τ²-bench data directory (DIR/domains/<name> or DIR/<name>) or one domain directory, "
        "for the agent's tool schemas; default: the shipped domains. Domains that are not built "
        "in are classified from the recorded error texts.",
    ),
]
ResamplesOption = Annotated[
    int, typer.Option("--resamples", min=100, help="Bootstrap and permutation resamples.")
]
SeedOption = Annotated[int, typer.Option("--seed", help="Seed of the resampling.")]
SideOption = Annotated[
    list[Path] | None,
    typer.Option(help="A results file of this side (repeatable; trials and shards are pooled)."),
]
DeltaOption = Annotated[
    float, typer.Option("--delta", min=0.01, help="TOST equivalence margin, in points.")
]
LabelAOption = Annotated[str | None, typer.Option(help="Name of run A.")]
LabelBOption = Annotated[str | None, typer.Option(help="Name of run B.")]


def analyze_command(
    results: Annotated[
        list[Path],
        typer.Argument(help="Results files of one run, or a run directory (every arm in turn)."),
    ],
    data_dir: DataDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the analysis as JSON.")] = False,
    label: Annotated[str | None, typer.Option(help="Name of the run in the output.")] = None,
    resamples: ResamplesOption = DEFAULT_RESAMPLES,
    seed: SeedOption = 0,
) -> None:
    """Failures per channel, errors per episode and both budget curves of one run.

    Every tool message with error: true is classified into one channel. The budget curves give
    the mean reward at every error budget k = 0…max_errors from this one run, on τ²-bench's
    tool-error budget and on the proxy's experienced-failure budget (leaked calls and empty
    answers included); the run's own budget is shown first.
    """
    with exit_on_error():
        directory = _run_directory(results)
        if directory is not None:
            arms = load_arms(directory, data=DomainData(data_dir), resamples=resamples, seed=seed)
            if as_json:
                typer.echo(json.dumps({a.name: a.run.to_dict() for a in arms}, indent=2))
            for arm in [] if as_json else arms:
                _print_analysis(arm.run)
            return
        runs = load_runs(
            results, data=DomainData(data_dir), label=label, resamples=resamples, seed=seed
        )
        if len(runs) != 1:
            names = "; ".join(f"{r.domain} · {r.model}" for r in runs)
            raise UsageError(
                f"these files hold {len(runs)} runs ({names}); analyze one domain and model at "
                "a time, or use `evalkit report --a FILE ...` for several"
            )
    run = runs[0]
    if as_json:
        typer.echo(json.dumps(run.to_dict(), indent=2))
    else:
        _print_analysis(run)


def compare_command(
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            help="A.json B.json: the reference run, then the candidate; or a run directory "
            "(its arms compared as the replay's headline compares them); or two run "
            "directories (their arms paired by name)."
        ),
    ] = None,
    a: SideOption = None,
    b: SideOption = None,
    delta: DeltaOption = 7.5,
    data_dir: DataDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
    label_a: LabelAOption = None,
    label_b: LabelBOption = None,
    resamples: ResamplesOption = DEFAULT_RESAMPLES,
    seed: SeedOption = 0,
) -> None:
    """Compare run B against the reference run A, per cell (domain and model).

    Give one file per side as `A.json B.json`, or several with `--a FILE --a FILE --b FILE ...`.
    Files are grouped into cells by domain and agent model; within a domain, A's models pair
    with B's in the order given. Files of one side that ran under different configurations
    (a replay's arms) are refused, never pooled.

    A run directory as `evalkit replay --out DIR` (and `make demo`) writes it: each arm without
    repair against the first one, and each arm against itself with repair.
    """
    with exit_on_error():
        cells = _directory_cells(files, a, b, data_dir, resamples, seed, need_pairs=True)
        if cells is not None:
            comparisons = _compare_arms(cells, delta, resamples, seed)
        else:
            a_files, b_files = _sides(files, a, b, single=False)
            comparisons = _compare(
                a_files, b_files, data_dir, label_a, label_b, delta, resamples, seed
            )
    if as_json:
        document = {"margin_points": delta, "cells": [c.to_dict() for c in comparisons]}
        typer.echo(json.dumps(document, indent=2))
    else:
        _print_comparisons(comparisons)


def report_command(
    runs: Annotated[
        list[Path] | None,
        typer.Argument(
            help="RUN, or A.json B.json (more files: --a/--b), or a run directory (its arms "
            "compared as the replay's headline compares them), or two run directories."
        ),
    ] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML file to write.")] = Path(
        "report.html"
    ),
    a: SideOption = None,
    b: SideOption = None,
    delta: DeltaOption = 7.5,
    data_dir: DataDirOption = None,
    label_a: LabelAOption = None,
    label_b: LabelBOption = None,
    title: Annotated[str, typer.Option(help="Title of the page.")] = "evalkit report",
    resamples: ResamplesOption = DEFAULT_RESAMPLES,
    seed: SeedOption = 0,
) -> None:
    """Write a self-contained HTML report, its Markdown twin and the figures (PNG, SVG).

    With one side only (one RUN, or --a alone) the report shows each run; with two, it compares
    B against A per cell; a run directory is compared arm by arm as `evalkit compare DIR` does.
    """
    with exit_on_error():
        cells = _directory_cells(runs, a, b, data_dir, resamples, seed, need_pairs=False)
        a_files, b_files = ([], []) if cells is not None else _sides(runs, a, b, single=True)
        if cells is not None:
            comparisons = _compare_arms(cells, delta, resamples, seed)
            single: list[RunAnalysis] = [] if comparisons else [c.run for c, _ in cells]
        elif b_files:
            comparisons = _compare(
                a_files, b_files, data_dir, label_a, label_b, delta, resamples, seed
            )
            single = []
        else:
            comparisons = []
            single = load_runs(
                a_files, data=DomainData(data_dir), label=label_a, resamples=resamples, seed=seed
            )
        try:
            written = write_report(output, comparisons=comparisons, runs=single, title=title)
        except OSError as exc:
            raise UsageError(f"{output}: cannot write the report: {exc}") from exc
    typer.echo(f"wrote {written.html}, {written.markdown} and {len(written.figures)} figures")


def _run_directory(paths: list[Path] | None) -> Path | None:
    """The one run directory given, else None.

    Raises:
        UsageError: when a directory comes with other paths.
    """
    directories = [p for p in paths or [] if p.is_dir()]
    if not directories:
        return None
    if len(paths or []) != 1:
        raise UsageError(
            f"{directories[0]} is a run directory: give it alone (its arms are analysed in "
            "turn), or give results files"
        )
    return directories[0]


def _directory_cells(
    files: list[Path] | None,
    a: list[Path] | None,
    b: list[Path] | None,
    data_dir: Path | None,
    resamples: int,
    seed: int,
    *,
    need_pairs: bool,
) -> list[tuple[Arm, Arm | None]] | None:
    """The (A, B) arms to compare when the runs are given as run directories, else None: one
    directory's arms as its replay's headline pairs them, or two directories' paired by name.
    With `need_pairs` false, a directory of one arm gives (arm, None).

    Raises:
        UsageError: when directories are mixed with files or `--a`/`--b`, or when a directory
            holds nothing to compare.
    """
    given = [*(files or []), *(a or []), *(b or [])]
    directories = [p for p in given if p.is_dir()]
    if not directories:
        return None
    if a or b or len(directories) != len(files or []):
        raise UsageError(
            f"{directories[0]} is a run directory: give one run directory (its arms compared) "
            "or two (their arms paired by name), without results files or --a/--b"
        )
    if len(directories) > 2:
        raise UsageError(f"{len(directories)} run directories given: expected one or two")
    data = DomainData(data_dir)
    loaded = [load_arms(d, data=data, resamples=resamples, seed=seed) for d in directories]
    if len(loaded) == 2:
        return list(arm_pairs(loaded[0], loaded[1]))
    pairs: list[tuple[Arm, Arm | None]] = list(finding_pairs(loaded[0]))
    if pairs:
        return pairs
    if need_pairs:
        names = ", ".join(arm.name for arm in loaded[0])
        raise UsageError(
            f"{directories[0]}: nothing to compare in this run directory (arms: {names}); "
            "compare it with another run directory, or analyse it: evalkit analyze DIR"
        )
    return [(arm, None) for arm in loaded[0]]


def _compare_arms(
    cells: list[tuple[Arm, Arm | None]], delta: float, resamples: int, seed: int
) -> list[CellComparison]:
    pairs = [(a.run, b.run) for a, b in cells if b is not None]
    return compare_cells(pairs, margin=delta / 100, resamples=resamples, seed=seed)


def _sides(
    files: list[Path] | None, a: list[Path] | None, b: list[Path] | None, *, single: bool
) -> tuple[list[Path], list[Path]]:
    files, a, b = files or [], a or [], b or []
    if files and (a or b):
        raise UsageError("give the runs either as A.json B.json or with --a/--b, not both")
    if files:
        if len(files) == 2:
            return [files[0]], [files[1]]
        if len(files) == 1 and single:
            return files, []
        wanted = "one or two files" if single else "two files"
        raise UsageError(
            f"{len(files)} files given: expected {wanted} (A.json B.json); for more, name each "
            "side with --a FILE and --b FILE"
        )
    if not a:
        raise UsageError("no runs given: pass A.json B.json, or --a FILE ... --b FILE ...")
    if not b and not single:
        raise UsageError("no run B to compare with: pass --b FILE")
    return a, b


def _compare(
    a_files: list[Path],
    b_files: list[Path],
    data_dir: Path | None,
    label_a: str | None,
    label_b: str | None,
    delta: float,
    resamples: int,
    seed: int,
) -> list[CellComparison]:
    data = DomainData(data_dir)
    a_runs = load_runs(a_files, data=data, label=label_a, resamples=resamples, seed=seed)
    b_runs = load_runs(b_files, data=data, label=label_b, resamples=resamples, seed=seed)
    return compare_cells(
        pair_cells(a_runs, b_runs), margin=delta / 100, resamples=resamples, seed=seed
    )


def _print_analysis(run: RunAnalysis) -> None:
    console = Console()
    console.print(
        f"[bold]{run.domain} · {run.model}[/] ({run.label}): {len(run.episodes)} episodes, "
        f"mean reward {pct(run.mean_reward)} [{reward_interval(run)}], {run.errors} tool "
        f"errors, budget {run.max_errors} ({run.budget.label})",
        highlight=False,
        soft_wrap=True,
    )
    console.print(
        f"schemas: {run.schema_source or 'none (classified from the recorded error texts)'}",
        highlight=False,
        soft_wrap=True,
    )
    for warning in run.warnings:
        Console(stderr=True).print(
            f"[yellow]warning:[/] {warning} (evalkit rescore says which simulations and why)",
            highlight=False,
            soft_wrap=True,
        )
    shown = [runs_table([run])]
    shown += [budget_table([run], budget) for budget in budget_order([run])]
    shown += [channel_table([run]), *experienced_tables([run])]
    if run.silent_violations():
        shown.append(silent_table(run))
    shown += [errors_table([run], budget) for budget in budget_order([run])]
    shown += [termination_table([run]), wrong_names_table([run], top=10)]
    if any(t.errors for t in run.tasks()):
        shown.append(tasks_table(run))
    for table in shown:
        console.print(table.rich())


def _print_comparisons(comparisons: list[CellComparison]) -> None:
    console = Console()
    for c in comparisons:
        console.print(figures_table(c).rich())
        console.print(channel_table((c.a, c.b), c).rich())
        console.print(budget_ci_table((c.a, c.b), c.budget, c).rich())
    for c in comparisons:
        console.print(f"[bold]{c.name}[/]: {c.verdict()}", highlight=False, soft_wrap=True)
    if comparisons:
        console.print(comparisons[0].bootstrap(), highlight=False)
