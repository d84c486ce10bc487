"""The one table model of evalkit's output: a title, columns, rows of text and a note, rendered to
the terminal (rich), to Markdown and to HTML. Every table that `replay`, `analyze`, `compare`,
`report` and `probe` print is a `Table`; the figures in its cells come from the analysis.

    table = Table("Budget curve", [Column("k"), Column("pass %", numeric=True)], [["1", "35.0"]])
    console.print(table.rich()); table.markdown(); table.html()
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table as RichTable
from rich.text import Text


@dataclass(frozen=True, slots=True)
class Column:
    """One column: its header, and whether it holds numbers (aligned right)."""

    header: str
    numeric: bool = False


@dataclass(frozen=True)
class Table:
    """A table of text cells. `note` is one or two sentences under the title saying what the
    figures are (which budget, which denominator); every renderer shows it.

    Raises (on construction):
        ValueError: when a row has another number of cells than there are columns.
    """

    title: str
    columns: Sequence[Column]
    rows: Sequence[Sequence[str]]
    note: str = ""
    footnotes: Sequence[str] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(
                    f"table {self.title!r}: a row of {len(row)} cells for {len(self.columns)} "
                    "columns"
                )

    @property
    def headers(self) -> list[str]:
        """The column headers, in order."""
        return [c.header for c in self.columns]

    def column(self, header: str) -> list[str]:
        """The cells of the column named `header`.

        Raises:
            KeyError: when no column has that header.
        """
        position = self.headers.index(header) if header in self.headers else None
        if position is None:
            raise KeyError(header)
        return [row[position] for row in self.rows]

    # -- renderers ---------------------------------------------------------------------------

    def rich(self) -> RenderableType:
        """The table for a rich console, its title above and its note and footnotes under it as
        text as wide as the console (not the table): compact, so that a summary fits one
        screen. Cells wrap between words, never inside one, so no number is cut; when the
        columns' longest words do not fit the console side by side, the table is shown in
        parts, each repeating the first column (see `_FittedTable`)."""
        parts: list[RenderableType] = [Text(self.title, style="bold"), _FittedTable(self)]
        caption = " ".join(part for part in (self.note, *self.footnotes) if part)
        if caption:
            parts += [Text(caption, style="dim"), Text("")]
        return Group(*parts)

    def markdown(self, level: int = 2) -> str:
        """The table as a Markdown section under a heading of `level` (0: no heading)."""
        lines = [f"{'#' * level} {self.title}", ""] if level else []
        if self.note:
            lines += [_md_cell(self.note), ""]
        lines.append("| " + " | ".join(_md_cell(h) for h in self.headers) + " |")
        lines.append("|" + "|".join(" ---: " if c.numeric else " --- " for c in self.columns) + "|")
        lines += ["| " + " | ".join(_md_cell(cell) for cell in row) + " |" for row in self.rows]
        if self.footnotes:
            lines += ["", *[_md_cell(f) for f in self.footnotes]]
        return "\n".join(lines) + "\n"

    def html(self, level: int = 3) -> str:
        """The table as an HTML fragment under a heading of `level` (0: no heading)."""
        parts = [f"<h{level}>{html.escape(self.title)}</h{level}>"] if level else []
        if self.note:
            parts.append(f'<p class="note">{html.escape(self.note)}</p>')
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self.headers)
        body = "".join(
            "<tr>"
            + "".join(
                f'<td class="num">{html.escape(cell)}</td>'
                if column.numeric
                else f"<td>{html.escape(cell)}</td>"
                for column, cell in zip(self.columns, row, strict=True)
            )
            + "</tr>"
            for row in self.rows
        )
        parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        parts += [f'<p class="note">{html.escape(f)}</p>' for f in self.footnotes]
        return "\n".join(parts)


class _FittedTable:
    """A `Table`'s cells as one or more rich tables that fit the console's width.

    A column needs at least its longest word (a number with its interval, or a header word);
    the columns that fit beside the first one side by side form one part, and the rest follow
    in further parts under it, each with the first column again. Within a part rich wraps cells
    between words to share out the width."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        cells = [
            [column.header, *(row[i] for row in self.table.rows)]
            for i, column in enumerate(self.table.columns)
        ]
        needs = [max(_longest_word(text) for text in texts) for texts in cells]
        wants = [max(_longest_line(text) for text in texts) for texts in cells]
        for part in column_parts(needs, options.max_width):
            widths = share_width(
                [needs[p] for p in part],
                [wants[p] for p in part],
                options.max_width - len(part) - 1,
            )
            yield self._part(part, widths)

    def _part(self, positions: Sequence[int], widths: Sequence[int]) -> RichTable:
        part = RichTable(box=box.SIMPLE_HEAD, padding=(0, 0), collapse_padding=True, pad_edge=False)
        for position, width in zip(positions, widths, strict=True):
            column = self.table.columns[position]
            part.add_column(
                column.header,
                justify="right" if column.numeric else "left",
                width=width,
                overflow="fold",
            )
        for row in self.table.rows:
            part.add_row(*(row[position] for position in positions))
        return part


def share_width(needs: Sequence[int], wants: Sequence[int], room: int) -> list[int]:
    """Widths of columns that need at least `needs` and want `wants` characters, in `room`
    characters: what each wants when all fit, else the widest columns narrowed first, one
    character at a time, down to what they need (never below it, even when it does not fit)."""
    widths = [max(need, want) for need, want in zip(needs, wants, strict=True)]
    while sum(widths) > room:
        slack = [width - need for width, need in zip(widths, needs, strict=True)]
        widest = max(range(len(widths)), key=lambda i: (slack[i] > 0, widths[i]))
        if slack[widest] <= 0:
            break
        widths[widest] -= 1
    return widths


def column_parts(needs: Sequence[int], width: int) -> list[list[int]]:
    """The columns (by position) of each part of a table whose columns need `needs` characters
    each, on a console `width` wide: the first column in every part, the others in order, as
    many beside it as fit. A part is one character wider than its columns and their separators
    (an edge each side, one between columns); a column too wide even beside the first alone
    gets a part of its own with it all the same."""
    if not needs:
        return []
    parts: list[list[int]] = [[0]]
    used = needs[0] + 2
    for position in range(1, len(needs)):
        if len(parts[-1]) > 1 and used + 1 + needs[position] > width:
            parts.append([0])
            used = needs[0] + 2
        parts[-1].append(position)
        used += 1 + needs[position]
    return parts


def _longest_line(text: str) -> int:
    return max((cell_len(line) for line in text.splitlines()), default=0)


def _longest_word(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def columns(*headers: str, text: int = 1) -> list[Column]:
    """Columns named `headers`: the first `text` hold text, the rest numbers."""
    return [Column(h, numeric=i >= text) for i, h in enumerate(headers)]
