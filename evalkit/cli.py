"""The `evalkit` command line: a thin router from typer commands to the library.

Every command reports an `EvalkitError` as one line on stderr and exits with the error's
`exit_code`; no traceback reaches the user.
"""

from __future__ import annotations

import asyncio
import datetime
import inspect
import io
import json
import sys
from pathlib import Path
from typing import Annotated, cast

# The slim install (`pip install toolsentry`, the proxy alone) ships this command without
# evalkit's dependencies: say in one line what to install instead of a traceback.
_EXTRA = {"anthropic", "httpx", "matplotlib", "numpy", "openai"}
try:
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
    from evalkit.analysis.table import Table, columns
    from evalkit.domains import get_domain
    from evalkit.domains.base import Domain
    from evalkit.errors import JudgeError, UsageError
    from evalkit.exits import exit_on_error
    from evalkit.formats import Results, read_results
    from evalkit.judge import LLMJudge
    from evalkit.probe.command import probe_command
    from evalkit.replay import (
        DEFAULT_PROFILES,
        DEFAULT_REPAIRS,
        Replay,
        ReplayOptions,
        UserKind,
        check_reachable,
    )
    from evalkit.report import write_report
    from evalkit.rescore import (
        RescoreReport,
        check_complete,
        check_data,
        judge_simulations,
        rescore,
    )
    from evalkit.scoring import NLAssertionCheck
    from evalkit.wire import ApiName
except ModuleNotFoundError as exc:
    if exc.name is None or exc.name.partition(".")[0] not in _EXTRA:
        raise
    sys.stderr.write(
        f"evalkit needs its dependencies ({exc.name} is missing): "
        "pip install 'toolsentry[evalkit]'\n"
    )
    raise SystemExit(2) from None

app = typer.Typer(
    name="evalkit",
    help="Replay agent scenarios through toolsentry and measure the damage a flat score hides.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


sim_app = typer.Typer(
    help="The simulated quantized upstream: an OpenAI-compatible server with damage profiles.",
    no_args_is_help=True,
)
app.add_typer(sim_app, name="sim")
app.command("probe")(probe_command)


@app.callback()
def _root() -> None:
    """evalkit: τ²-bench-style episodes, rewards and results files."""


JudgeBaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--judge-base-url",
        help="An OpenAI-compatible endpoint whose model judges NL assertions (τ²-bench's judge "
        "protocol, retried); without it they are left out of the reward and counted as such.",
    ),
]
JudgeModelOption = Annotated[
    str | None, typer.Option("--judge-model", help="The judge's model (with --judge-base-url).")
]

RESCORE_EPILOG = (
    "Exit status: 0 every simulation agrees; 1 a disagreement the records do not explain; "
    "3 inconsistent records only (a simulation without messages, a reward_info that checks "
    "another task's actions, an action id or task id of no task in the data), or "
    "disagreements all explained by them or by another version of a task; 2 the file or the "
    "options cannot be used (corrupt or truncated JSON, named with its position; an older "
    "τ²-bench format without task ids or endings, which analyze reads; an unknown domain); 6 "
    "the file was run on other data than the loaded domain's (a task of the file "
    "is not in it, or cannot be set up on its databases): nothing is scored, pass --data-dir "
    "with the data the file was run on."
)


@app.command("rescore", epilog=RESCORE_EPILOG)
def rescore_command(
    results: Annotated[Path, typer.Argument(help="A results file (evalkit's or τ²-bench's).")],
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="Domain directory (τ²-bench's layout: retail's db.json, tasks.json, policy.md; "
            "telecom's db.toml, user_db.toml, tasks.json, policies); default: shipped.",
        ),
    ] = None,
    domain: Annotated[
        str | None,
        typer.Option("--domain", help="Domain name; default: the one the results file names."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary.")] = False,
    judge_base_url: JudgeBaseUrlOption = None,
    judge_model: JudgeModelOption = None,
) -> None:
    """Replay each simulation's tool calls on fresh databases; compare DB check, ENV assertions
    and reward with the recorded ones, and say why records disagree. With a judge, tasks whose
    reward needs NL assertions are recomputed too."""
    with exit_on_error(exit_code=2):
        if bool(judge_base_url) != bool(judge_model):
            raise UsageError("--judge-base-url and --judge-model go together")
        loaded = read_results(results)
        check_complete(loaded, source=str(results))
        name = domain or loaded.info.get("environment_info", {}).get("domain_name")
        if not isinstance(name, str):
            raise UsageError(
                f"{results}: the file does not name its domain; pass --domain (e.g. --domain retail)"
            )
        data = get_domain(name, data_dir)
        check_data(loaded, data, source=str(data_dir) if data_dir else "evalkit's shipped data")
        verdicts = None
        if judge_base_url and judge_model:
            verdicts = asyncio.run(_judge(loaded, data, judge_base_url, judge_model))
        report = rescore(loaded, data, verdicts=verdicts)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        _print_report(report)
    if report.status:
        raise typer.Exit(report.status)


async def _judge(
    results: Results, domain: Domain, base_url: str, model: str
) -> dict[str, list[NLAssertionCheck] | JudgeError]:
    await check_reachable(base_url, "judge endpoint")
    judge = LLMJudge.at(base_url, model)
    try:
        return await judge_simulations(results, domain, judge)
    finally:
        await judge.close()


def _print_report(report: RescoreReport) -> None:
    rows = [
        [
            s.id[:8],
            s.task_id,
            "" if s.trial is None else str(s.trial),
            s.termination_reason,
            f"{_reward(s.recorded)} → {_reward(s.recomputed)}",
            f"{_reward(s.recorded_env)} → {_reward(s.recomputed_env)}",
            f"{_reward(s.recorded_reward)} → {_reward(s.recomputed_reward)}",
            "agree" if s.agrees else ("explained" if s.explained else "DISAGREE"),
        ]
        for s in report.simulations
    ]
    header = columns(
        "simulation", "task", "trial", "termination", "DB", "ENV", "reward", "", text=8
    )
    console = Console()
    console.print(Table("Rewards: recorded → recomputed", header, rows).rich())
    for s in report.simulations:
        for found in s.issues:
            if found.problem.inconsistent or not s.agrees:
                console.print(f"{s.id[:8]} (task {s.task_id}): {found.detail}", highlight=False)
    for line in report.summary():
        console.print(line, highlight=False)


def _reward(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


# -- analyze, compare, report --------------------------------------------------------------------

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


@app.command("analyze")
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


@app.command("compare")
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
    delta: Annotated[
        float, typer.Option("--delta", min=0.01, help="TOST equivalence margin, in points.")
    ] = 7.5,
    data_dir: DataDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
    label_a: Annotated[str | None, typer.Option(help="Name of run A.")] = None,
    label_b: Annotated[str | None, typer.Option(help="Name of run B.")] = None,
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


@app.command("report")
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
    delta: Annotated[
        float, typer.Option("--delta", min=0.01, help="TOST equivalence margin, in points.")
    ] = 7.5,
    data_dir: DataDirOption = None,
    label_a: Annotated[str | None, typer.Option(help="Name of run A.")] = None,
    label_b: Annotated[str | None, typer.Option(help="Name of run B.")] = None,
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


def _split(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return tuple(part.strip() for part in value.split(",") if part.strip())


@app.command("shadow")
def shadow_command(
    logs: Annotated[
        list[Path],
        typer.Argument(help="Shadow log files (the proxy's shadow.log, rotated or per worker)."),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the figures as JSON.")] = False,
    plot: Annotated[
        Path | None, typer.Option(help="Write a plot of the per-channel rates (PNG, SVG, PDF).")
    ] = None,
    resamples: ResamplesOption = DEFAULT_RESAMPLES,
    seed: SeedOption = 0,
) -> None:
    """The proxy's shadow comparison read back from its log: the quantized model against its
    reference on live traffic, per channel, with the figures GET /v1/stats/shadow shows and the
    session-resampled statistics beside them."""
    from evalkit.shadowlog import analyze_shadow_log, plot_shadow, read_shadow_log, shadow_tables

    with exit_on_error():
        analyses = analyze_shadow_log(read_shadow_log(logs), resamples=resamples, seed=seed)
        if plot is not None:
            plot_shadow(analyses, plot)
    if as_json:
        typer.echo(json.dumps({"data": [a.to_dict() for a in analyses]}, indent=2))
        return
    console = Console()
    for analysis in analyses:
        for table in shadow_tables(analysis):
            console.print(table.rich())


@app.command("replay")
def replay_command(
    domain: Annotated[str, typer.Option(help="Domain: retail or telecom.")] = "retail",
    base_url: Annotated[
        str | None,
        typer.Option(
            "--base-url",
            help="A running proxy or OpenAI-compatible server; without it, the simulated "
            "upstream and the proxy start in-process.",
        ),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="The model to ask for (with --base-url).")
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            help="Damage profiles of the simulated upstream, comma-separated: bf16, fp8, int4 or "
            f"a YAML file [default: {','.join(DEFAULT_PROFILES)}].",
        ),
    ] = None,
    int4_multiplier: Annotated[
        float, typer.Option(help="int4's channel error rates as a multiple of bf16's.")
    ] = 2.5,
    user: Annotated[str, typer.Option(help="scripted (no model) or llm.")] = "scripted",
    user_base_url: Annotated[
        str | None, typer.Option("--user-base-url", help="The user model's endpoint (--user llm).")
    ] = None,
    user_model: Annotated[
        str | None, typer.Option("--user-model", help="The user model (--user llm).")
    ] = None,
    trials: Annotated[int, typer.Option(help="Trials per task.")] = 1,
    max_errors: Annotated[
        int, typer.Option("--max-errors", help="Error budget per episode (τ²-bench: 10).")
    ] = 10,
    max_steps: Annotated[int, typer.Option("--max-steps", help="Steps per episode.")] = 200,
    repair: Annotated[
        str | None,
        typer.Option(
            help="The proxy's repair, comma-separated for one arm each: off, reask [default: "
            f"{','.join(DEFAULT_REPAIRS)} embedded; the proxy's own setting with --base-url].",
        ),
    ] = None,
    tasks: Annotated[
        str | None, typer.Option(help="Task ids, comma-separated, or a split name [default: all].")
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Episodes at a time.")] = 8,
    seed: Annotated[int, typer.Option(help="Seed of the simulated upstream.")] = 0,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir", help="Domain directory (τ²-bench's own works); default: shipped."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Output directory [default: runs/<domain>-<date>-<time>]."),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(help="Finish the run in this directory (its options are reused)."),
    ] = None,
    judge_base_url: JudgeBaseUrlOption = None,
    judge_model: JudgeModelOption = None,
    api: Annotated[
        str,
        typer.Option(
            help="The wire protocol the agent speaks to the proxy: chat (Chat Completions), "
            "responses (the Responses API) or messages (the Anthropic Messages API); the same "
            "seed gives the same episodes on each.",
        ),
    ] = "chat",
) -> None:
    """Replay a domain's tasks through the proxy and show what a flat score hides."""
    from evalkit.summary import summarize_replay

    console = Console()
    with exit_on_error():
        if resume is not None:
            replay = Replay.resume(resume)
        else:
            options = ReplayOptions(
                domain=domain,
                base_url=base_url,
                model=model,
                profiles=_split(profile) or DEFAULT_PROFILES,
                int4_multiplier=int4_multiplier,
                user=cast(UserKind, user),  # ReplayOptions.check refuses other values
                user_base_url=user_base_url,
                user_model=user_model,
                trials=trials,
                max_errors=max_errors,
                max_steps=max_steps,
                repairs=_split(repair) or (DEFAULT_REPAIRS if base_url is None else ()),
                tasks=tasks,
                concurrency=concurrency,
                seed=seed,
                data_dir=None if data_dir is None else str(data_dir),
                judge_base_url=judge_base_url,
                judge_model=judge_model,
                api=cast(ApiName, api),  # ReplayOptions.check refuses other values
            )
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            replay = Replay.start(options, out or Path("runs") / f"{domain}-{stamp}")
        _play(replay, console)
        runs = summarize_replay(replay)
    _print_replay_summary(replay, runs, console)


def _play(replay: Replay, console: Console) -> None:
    """Play `replay`'s pending episodes under its progress bars. Ctrl-C keeps the finished ones
    and says how to finish (exit 130)."""
    from evalkit.progress import ReplayProgress
    from evalkit.replay import execute
    from proxy.logs import configure_logging

    if replay.options.embedded:
        # The in-process proxy logs every request; the progress bars are the log here.
        configure_logging("error", stream=io.StringIO())
    try:
        with ReplayProgress(replay, console) as progress:
            asyncio.run(execute(replay, progress.on_episode))
    except KeyboardInterrupt:
        kept = sum(len(r.simulations) for r in replay.runs.values())
        console.print(
            f"interrupted: {kept} finished episodes kept in {replay.out}; "
            f"finish with: evalkit replay --resume {replay.out}",
            soft_wrap=True,  # one line: the command is copied as it stands
        )
        raise typer.Exit(130) from None


def _print_replay_summary(replay: Replay, runs: list[RunAnalysis], console: Console) -> None:
    """Print what `replay` shows (its tables and headline) and write its summary file."""
    from evalkit.summary import arm_keys, headline, replay_preamble, tables, write_summary

    for line in replay_preamble(replay):
        console.print(line, highlight=False)
    for table in tables(runs):
        console.print(table.rich())
    for line in headline(arm_keys(replay), runs):
        console.print(f"• {line}", highlight=False)
    path = write_summary(replay, runs)
    console.print(f"results and summary in {replay.out} ({path.name})")


@sim_app.command("serve")
def sim_serve(
    domain: Annotated[str, typer.Option(help="Domain whose tasks the model plays.")] = "retail",
    profile: Annotated[
        str, typer.Option(help="Default damage profile: bf16, fp8, int4 or a YAML file.")
    ] = "int4",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="Port to listen on; 0 takes a free one (see --port-file).")
    ] = 8001,
    port_file: Annotated[
        Path | None,
        typer.Option(
            help="Write the port listened on to this file (one line) once the socket listens."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of requests that carry none.")] = 0,
    int4_multiplier: Annotated[
        float, typer.Option(help="int4's channel error rates as a multiple of bf16's.")
    ] = 2.5,
    data_dir: Annotated[
        Path | None, typer.Option("--data-dir", help="Domain directory; default: shipped.")
    ] = None,
) -> None:
    """Serve the simulated upstream: every built-in profile as model sim-<profile>."""
    import uvicorn

    from evalkit.sim import builtin_profiles, create_sim_app, load_profile
    from proxy import listening
    from proxy.errors import ConfigError

    with exit_on_error():
        loaded = get_domain(domain, data_dir)
        profiles = builtin_profiles(int4_multiplier)
        default = load_profile(profile, int4_multiplier=int4_multiplier)
        profiles[default.name] = default
        application = create_sim_app(loaded, profiles, default_profile=default.name, seed=seed)
        try:
            sock = listening.listen(host, port)
        except ConfigError as exc:
            raise UsageError(exc.message) from None
    with sock:
        if port_file is not None:
            listening.write_port_file(port_file, sock)
        Console(stderr=True).print(
            f"evalkit sim ({domain}, default profile {default.name}) on "
            f"{listening.url_of(host, sock)}/v1 — simulated answers, not a real model",
            highlight=False,
            soft_wrap=True,
        )
        config = uvicorn.Config(application, log_level="warning", access_log=False)
        status = listening.serve(config, sock)
    if status:
        raise typer.Exit(code=status)


def help_paragraphs(text: str) -> str:
    """`text` (a docstring or an epilog, hard-wrapped in the source) as paragraphs of one line
    each, separated by blank lines, for the terminal to wrap: typer's help keeps a paragraph's
    line breaks and wraps each line again, which leaves ragged short lines. A paragraph that
    starts with click's no-rewrap mark (a backspace) keeps its lines."""
    return "\n\n".join(
        paragraph if paragraph.startswith("\b") else " ".join(paragraph.split())
        for paragraph in inspect.cleandoc(text).split("\n\n")
    )


def _help_as_paragraphs(*applications: typer.Typer) -> None:
    """Every command's help and epilog of `applications` as `help_paragraphs`."""
    for application in applications:
        for info in application.registered_commands:
            written = info.help if info.help is not None else inspect.getdoc(info.callback)
            info.help = None if written is None else help_paragraphs(written)
            info.epilog = None if info.epilog is None else help_paragraphs(info.epilog)


_help_as_paragraphs(app, sim_app)


def main() -> None:
    """Console-script entry point (`evalkit`)."""
    app()


if __name__ == "__main__":
    main()
