"""The one table model: the same cells in Markdown, HTML and on the terminal."""

from __future__ import annotations

import pytest
from rich.console import Console

from evalkit.analysis.table import Column, Table, columns


def make_table(**fields: object) -> Table:
    values: dict[str, object] = {
        "title": "Budget curve",
        "columns": columns("run", "k=1", "k=2"),
        "rows": [["int4", "34.8", "60.9"], ["a|b <c>", "1.0", "2.0"]],
        "note": "Mean reward at budget k.",
    }
    values.update(fields)
    return Table(**values)  # type: ignore[arg-type]


def test_markdown_has_the_heading_note_alignment_and_escaped_cells() -> None:
    text = make_table().markdown()
    assert text.splitlines()[:3] == ["## Budget curve", "", "Mean reward at budget k."]
    assert "| run | k=1 | k=2 |" in text
    assert "| --- | ---: | ---: |" in text
    assert "| int4 | 34.8 | 60.9 |" in text
    assert "| a\\|b <c> | 1.0 | 2.0 |" in text
    assert make_table().markdown(level=0).startswith("Mean reward")


def test_html_escapes_cells_and_marks_numbers() -> None:
    text = make_table(footnotes=("n < 10",)).html()
    assert text.startswith("<h3>Budget curve</h3>")
    assert "<td>a|b &lt;c&gt;</td>" in text
    assert '<td class="num">60.9</td>' in text
    assert '<p class="note">n &lt; 10</p>' in text


def test_the_terminal_shows_title_cells_and_note() -> None:
    console = Console(width=100, record=True)
    console.print(make_table(footnotes=("two of four runs",)).rich())
    text = console.export_text()
    assert text.startswith("Budget curve\n")
    assert "int4 34.8 60.9" in " ".join(text.split())
    assert "Mean reward at budget k. two of four runs" in text


def test_a_row_of_the_wrong_width_is_refused_and_columns_are_read_by_header() -> None:
    with pytest.raises(ValueError, match="a row of 2 cells for 3 columns"):
        make_table(rows=[["int4", "1.0"]])
    assert make_table().column("k=2") == ["60.9", "2.0"]
    with pytest.raises(KeyError):
        make_table().column("k=9")
    assert columns("a", "b", text=2) == [Column("a"), Column("b")]
