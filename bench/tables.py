"""The one table renderer of the benchmarks: Markdown for the results files, rich for the terminal,
the `median (min–max)` spread every report prints beside a figure over rounds, and the marked
section of a results file that a benchmark rewrites."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

console = Console(width=None if sys.stdout.isatty() else 150)
"""The terminal the benchmarks print to (150 columns when it is not a terminal)."""


def markdown_table(
    header: Sequence[str],
    body: Iterable[Sequence[str]],
    *,
    right: Collection[int] = (),
) -> str:
    """A Markdown table; the columns whose index is in `right` are right-aligned (`---:`). A `|`
    inside a cell becomes `/` so that it cannot split the row."""
    rule = "|" + "".join("---:|" if i in right else "---|" for i in range(len(header)))
    lines = ["| " + " | ".join(header) + " |", rule]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in body]
    return "\n".join(lines)


def rich_table(
    title: str,
    header: Sequence[str],
    body: Iterable[Sequence[str | None]],
    *,
    text_columns: Collection[str] | None = None,
) -> Table:
    """A table for the terminal; with `text_columns`, those are left-aligned and the rest
    (figures) right-aligned."""
    table = Table(title=title)
    for column in header:
        if text_columns is None:
            table.add_column(column)
        else:
            text = column in text_columns
            table.add_column(column, justify="left" if text else "right", no_wrap=text)
    for row in body:
        table.add_row(*row)
    return table


def spread(values: Sequence[float], render: Callable[[float], str]) -> str:
    """`median (min–max)` of the rounds' values, each drawn by `render`; `–` when there are none."""
    if not values:
        return "–"
    return f"{render(statistics.median(values))} ({render(min(values))}–{render(max(values))})"


def write_section(path: Path, text: str, begin: str, end: str, *, new: str = "") -> None:
    """Put `text` (which starts with `begin` and ends with `end`) in place of the section between
    those markers in `path`, or append it; other sections stay. A missing file starts as `new`."""
    current = path.read_text() if path.exists() else new
    if begin in current and end in current:
        before, rest = current.split(begin, 1)
        after = rest.split(end, 1)[1]
        current = before + text + after
    else:
        current = current.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(current)
