"""How every evalkit command ends on its own errors: one line on stderr and the error's exit code."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer
from rich.console import Console

from evalkit.errors import EvalkitError


@contextlib.contextmanager
def exit_on_error(exit_code: int | None = None) -> Iterator[None]:
    """Turn an `EvalkitError` into a one-line message on stderr and the error's exit code (or
    `exit_code`, for a command whose statuses mean something else)."""
    try:
        yield
    except EvalkitError as exc:
        Console(stderr=True).print(
            f"[bold red]error:[/] {exc.message}", highlight=False, markup=True, soft_wrap=True
        )
        raise typer.Exit(exc.exit_code if exit_code is None else exit_code) from None
