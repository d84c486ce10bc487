"""The `evalkit` command line: a thin router from typer commands to the library.

Every command reports an `EvalkitError` as one line on stderr and exits with the error's
`exit_code`; no traceback reaches the user.
"""

from __future__ import annotations

import contextlib
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
from evalkit.rescore import RescoreReport, rescore

app = typer.Typer(
    name="evalkit",
    help="Replay agent scenarios through toolsentry and measure the damage a flat score hides.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


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
            help="Domain directory (τ²-bench's layout: retail's db.json, tasks.json, policy.md; "
            "telecom's db.toml, user_db.toml, tasks.json, policies); default: shipped.",
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
    """Replay each simulation's tool calls on fresh databases; compare DB check, ENV assertions
    and reward with the recorded ones."""
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
    table = Table(title="Rewards: recorded → recomputed")
    for column in ("simulation", "task", "trial", "termination", "DB", "ENV", "reward", ""):
        table.add_column(column)
    for s in report.simulations:
        table.add_row(
            s.id[:8],
            s.task_id,
            "" if s.trial is None else str(s.trial),
            s.termination_reason,
            f"{_reward(s.recorded)} → {_reward(s.recomputed)}",
            f"{_reward(s.recorded_env)} → {_reward(s.recomputed_env)}",
            f"{_reward(s.recorded_reward)} → {_reward(s.recomputed_reward)}",
            "[green]agree[/]" if s.agrees else "[bold red]DISAGREE[/]",
        )
    console = Console()
    console.print(table)
    console.print(f"{report.agree} of {len(report.simulations)} simulations agree.")


def _reward(value: float | None) -> str:
    return "—" if value is None else f"{value:g}"


def main() -> None:
    """Console-script entry point (`evalkit`)."""
    app()


if __name__ == "__main__":
    main()
