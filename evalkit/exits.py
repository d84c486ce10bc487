"""How every evalkit command ends on its own errors: one line on stderr and the error's exit code."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer
from rich.console import Console

from evalkit.errors import EvalkitError, WrongDataError

WRONG_DATA = WrongDataError.exit_code
"""Exit status of every command that refuses a results file run on other data than the loaded
domain's (`rescore`, `probe`): the file's tasks or database ids are not in it; the message names
`--data-dir`. Distinct from every other status, so that no script mistakes it for a verdict."""


@contextlib.contextmanager
def exit_on_error(exit_code: int | None = None) -> Iterator[None]:
    """Turn an `EvalkitError` into a one-line message on stderr and the error's exit code (or
    `exit_code`, for a command whose statuses mean something else; a `WrongDataError` keeps
    `WRONG_DATA` everywhere)."""
    try:
        yield
    except EvalkitError as exc:
        Console(stderr=True).print(
            f"[bold red]error:[/] {exc.message}", highlight=False, markup=True, soft_wrap=True
        )
        if exit_code is None or isinstance(exc, WrongDataError):
            exit_code = exc.exit_code
        raise typer.Exit(exit_code) from None
