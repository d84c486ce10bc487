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

    from evalkit.analysis.run import RunAnalysis
    from evalkit.analysis.stats import DEFAULT_RESAMPLES
    from evalkit.analysis.table import Table, columns
    from evalkit.cli_analysis import (
        ResamplesOption,
        SeedOption,
        analyze_command,
        compare_command,
        report_command,
    )
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


# -- analyze, compare, report (evalkit.cli_analysis) ----------------------------------------------

app.command("analyze")(analyze_command)
app.command("compare")(compare_command)
app.command("report")(report_command)


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


# -- replay ---------------------------------------------------------------------------------------

ReplayBaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--base-url",
        help="A running proxy or OpenAI-compatible server; without it, the simulated "
        "upstream and the proxy start in-process.",
    ),
]
ProfilesOption = Annotated[
    str | None,
    typer.Option(
        help="Damage profiles of the simulated upstream, comma-separated: bf16, fp8, int4 or "
        f"a YAML file [default: {','.join(DEFAULT_PROFILES)}].",
    ),
]
Int4MultiplierOption = Annotated[
    float, typer.Option(help="int4's channel error rates as a multiple of bf16's.")
]
RepairsOption = Annotated[
    str | None,
    typer.Option(
        help="The proxy's repair, comma-separated for one arm each: off, reask [default: "
        f"{','.join(DEFAULT_REPAIRS)} embedded; the proxy's own setting with --base-url].",
    ),
]
ReplayOutOption = Annotated[
    Path | None,
    typer.Option(help="Output directory [default: runs/<domain>-<date>-<time>]."),
]
ReplayResumeOption = Annotated[
    Path | None,
    typer.Option(help="Finish the run in this directory (its options are reused)."),
]
ApiOption = Annotated[
    str,
    typer.Option(
        help="The wire protocol the agent speaks to the proxy: chat (Chat Completions), "
        "responses (the Responses API) or messages (the Anthropic Messages API); the same "
        "seed gives the same episodes on each.",
    ),
]


@app.command("replay")
def replay_command(
    domain: Annotated[str, typer.Option(help="Domain: retail or telecom.")] = "retail",
    base_url: ReplayBaseUrlOption = None,
    model: Annotated[
        str | None, typer.Option(help="The model to ask for (with --base-url).")
    ] = None,
    profile: ProfilesOption = None,
    int4_multiplier: Int4MultiplierOption = 2.5,
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
    repair: RepairsOption = None,
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
    out: ReplayOutOption = None,
    resume: ReplayResumeOption = None,
    judge_base_url: JudgeBaseUrlOption = None,
    judge_model: JudgeModelOption = None,
    api: ApiOption = "chat",
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
    int4_multiplier: Int4MultiplierOption = 2.5,
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
