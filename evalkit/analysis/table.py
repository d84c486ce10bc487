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
from rich.console import Group, RenderableType
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
        screen."""
        table = RichTable(
            box=box.SIMPLE_HEAD,
            padding=(0, 0),
            collapse_padding=True,
            pad_edge=False,
        )
        for position, column in enumerate(self.columns):
            table.add_column(
                column.header,
                justify="right" if column.numeric else "left",
                no_wrap=position == 0,
            )
        for row in self.rows:
            table.add_row(*row)
        parts: list[RenderableType] = [Text(self.title, style="bold"), table]
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


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def columns(*headers: str, text: int = 1) -> list[Column]:
    """Columns named `headers`: the first `text` hold text, the rest numbers."""
    return [Column(h, numeric=i >= text) for i, h in enumerate(headers)]
