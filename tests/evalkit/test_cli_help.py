"""`evalkit … --help`: every command's help is written as paragraphs, so an 80-column terminal
wraps them cleanly — no ragged short line in the middle of a paragraph."""

from __future__ import annotations

import itertools

import click
import pytest
import typer
from typer.testing import CliRunner

from evalkit.cli import app, help_paragraphs

WIDTH = 80


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [prefix]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += _commands(command, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


COMMANDS = _commands(typer.main.get_group(app))


def ragged_lines(text: str, width: int = WIDTH) -> list[str]:
    """Lines of help prose (outside the option panels) followed, in the same paragraph, by a
    line whose first word would have fit after them (the text has one space of margin a side)."""
    prose = [
        line.rstrip()
        for line in text.splitlines()
        if not line.lstrip().startswith(("╭", "│", "╰", "Usage:"))
    ]
    ragged = []
    for line, following in itertools.pairwise(prose):
        if line.strip() and following.strip():
            first = following.split()[0]
            if len(line) + 1 + len(first) <= width - 1:
                ragged.append(line)
    return ragged


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "evalkit")
def test_help_is_wrapped_as_paragraphs_at_80_columns(command: tuple[str, ...]) -> None:
    result = CliRunner(env={"COLUMNS": str(WIDTH)}).invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= WIDTH
    assert ragged_lines(result.output) == [], result.output


def test_a_hard_wrapped_docstring_becomes_one_line_a_paragraph() -> None:
    written = """First line
    goes on.

    Second
    paragraph.
    """
    assert help_paragraphs(written) == "First line goes on.\n\nSecond paragraph."
    assert help_paragraphs("\b\nkept\nas is") == "\b\nkept\nas is"
    assert ragged_lines(" a short line\n the next line of it\n") == [" a short line"]
