"""The `evalkit` command line: a thin router from typer commands to the library.

Every command reports an `EvalkitError` as one line on stderr and exits with the error's
`exit_code`; no traceback reaches the user.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from evalkit.domains import get_domain
from evalkit.errors import EvalkitError, UsageError
from evalkit.formats import read_results
from evalkit.replay import DEFAULT_PROFILES, DEFAULT_REPAIRS, Replay, ReplayOptions, UserKind
from evalkit.rescore import RescoreReport, rescore

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


@app.callback()
def _root() -> None:
    """evalkit: τ²-bench-style episodes, rewards and results files."""


@contextlib.contextmanager
def exit_on_error() -> Iterator[None]:
    """Turn an `EvalkitError` into a one-line message on stderr and the error's exit code."""
    try:
        yield
    except EvalkitError as exc:
        Console(stderr=True).print(
            f"[bold red]error:[/] {exc.message}", highlight=False, markup=True, soft_wrap=True
        )
        raise typer.Exit(exc.exit_code) from None


@app.command("rescore")
def rescore_command(
    results: Annotated[Path, typer.Argument(help="A results file (evalkit's or τ²-bench's).")],
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="Domain directory (db.json, tasks.json, policy.md); default: shipped.",
        ),
    ] = None,
    domain: Annotated[
        str | None,
        typer.Option("--domain", help="Domain name; default: the one the results file names."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary.")] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit with 1 when any simulation disagrees.")
    ] = False,
) -> None:
    """Replay each simulation's tool calls on a fresh database and compare DB rewards."""
    with exit_on_error():
        loaded = read_results(results)
        name = domain or loaded.info.get("environment_info", {}).get("domain_name")
        if not isinstance(name, str):
            raise UsageError(
                f"{results}: the file does not name its domain; pass --domain (e.g. --domain retail)"
            )
        report = rescore(loaded, get_domain(name, data_dir))
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        _print_report(report)
    if strict and report.disagreements:
        raise typer.Exit(1)


def _print_report(report: RescoreReport) -> None:
    table = Table(title="DB reward: recorded vs recomputed")
    for column in ("simulation", "task", "trial", "termination", "recorded", "recomputed", ""):
        table.add_column(column)
    for s in report.simulations:
        table.add_row(
            s.id[:8],
            s.task_id,
            "" if s.trial is None else str(s.trial),
            s.termination_reason,
            _reward(s.recorded),
            _reward(s.recomputed),
            "[green]agree[/]" if s.agrees else "[bold red]DISAGREE[/]",
        )
    console = Console()
    console.print(table)
    console.print(f"{report.agree} of {len(report.simulations)} simulations agree.")


def _reward(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def _split(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return tuple(part.strip() for part in value.split(",") if part.strip())


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
) -> None:
    """Replay a domain's tasks through the proxy and show what a flat score hides."""
    from evalkit.progress import ReplayProgress
    from evalkit.replay import execute
    from evalkit.summary import (
        arm_keys,
        headline,
        replay_preamble,
        summarize_replay,
        tables,
        write_summary,
    )
    from proxy.logs import configure_logging

    console = Console()
    with exit_on_error():
        if resume is not None:
            replay = Replay.resume(resume)
        else:
            if user not in ("scripted", "llm"):
                raise UsageError(f"--user must be scripted or llm, got {user!r}")
            kind: UserKind = "scripted" if user == "scripted" else "llm"
            options = ReplayOptions(
                domain=domain,
                base_url=base_url,
                model=model,
                profiles=_split(profile) or DEFAULT_PROFILES,
                int4_multiplier=int4_multiplier,
                user=kind,
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
            )
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            replay = Replay.start(options, out or Path("runs") / f"{domain}-{stamp}")
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
                f"finish with: evalkit replay --resume {replay.out}"
            )
            raise typer.Exit(130) from None
        summaries = summarize_replay(replay)
    for line in replay_preamble(replay):
        console.print(line, highlight=False)
    for table in tables(summaries, replay.options.max_errors):
        console.print(table.rich())
    for line in headline(arm_keys(replay), summaries, replay.options.max_errors):
        console.print(f"• {line}", highlight=False)
    path = write_summary(replay, summaries)
    console.print(f"results and summary in {replay.out} ({path.name})")


@sim_app.command("serve")
def sim_serve(
    domain: Annotated[str, typer.Option(help="Domain whose tasks the model plays.")] = "retail",
    profile: Annotated[
        str, typer.Option(help="Default damage profile: bf16, fp8, int4 or a YAML file.")
    ] = "int4",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8001,
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

    with exit_on_error():
        loaded = get_domain(domain, data_dir)
        profiles = builtin_profiles(int4_multiplier)
        default = load_profile(profile, int4_multiplier=int4_multiplier)
        profiles[default.name] = default
        application = create_sim_app(loaded, profiles, default_profile=default.name, seed=seed)
    Console(stderr=True).print(
        f"evalkit sim ({domain}, default profile {default.name}) on http://{host}:{port}/v1 — "
        "simulated answers, not a real model",
        highlight=False,
    )
    uvicorn.run(application, host=host, port=port, log_level="warning", access_log=False)


def main() -> None:
    """Console-script entry point (`evalkit`)."""
    app()


if __name__ == "__main__":
    main()
