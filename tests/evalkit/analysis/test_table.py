"""The one table model: the same cells in Markdown, HTML and on the terminal."""

from __future__ import annotations

import pytest
from rich.console import Console

from evalkit.analysis.table import Column, Table, column_parts, columns, share_width


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


def wide_table() -> Table:
    """A table as `evalkit shadow` writes it: numbers with their intervals in many columns."""
    header = ("channel", "primary %", "reference %", "ratio", "ratio 95% CI", "diff", "diff 95% CI")
    rows = [
        [name, "28.5 [24.3–33.1]", "8.5 [6.1–11.6]", "3.35", "2.35–4.79", "20.0", "14.3–25.8"]
        for name in ("unknown_tool", "empty_response", "invalid_arguments")
    ]
    header += ("p (Holm)",)
    rows = [[*row, "0.0002"] for row in rows]
    return Table("Per channel", columns(*header), rows, "A note.")


def rendered(table: Table, width: int) -> str:
    console = Console(width=width, record=True)
    console.print(table.rich())
    return console.export_text()


@pytest.mark.parametrize("width", [80, 60, 40])
def test_a_wide_table_fits_the_terminal_and_cuts_no_number(width: int) -> None:
    table = wide_table()
    text = rendered(table, width)
    assert max(len(line) for line in text.splitlines()) <= width
    words = text.split()
    for row in table.rows:
        for cell in row:
            for word in cell.split():
                assert word in words, f"{word!r} cut at {width} columns:\n{text}"
    assert "…" not in text


def test_a_table_that_fits_is_one_part_and_one_that_does_not_repeats_its_first_column() -> None:
    assert "unknown_tool" in rendered(wide_table(), 200)
    assert rendered(wide_table(), 200).count("unknown_tool") == 1
    assert rendered(wide_table(), 40).count("unknown_tool") > 1


def test_column_parts_keep_the_first_column_and_fit_what_fits() -> None:
    assert column_parts([10, 10, 10], 80) == [[0, 1, 2]]
    assert column_parts([10, 10, 10], 30) == [[0, 1], [0, 2]]
    assert column_parts([10, 70], 30) == [[0, 1]]  # too wide even alone: shown all the same
    assert column_parts([], 80) == []


def test_shared_width_narrows_the_widest_columns_down_to_their_longest_word() -> None:
    assert share_width([4, 4], [10, 6], 20) == [10, 6]
    assert share_width([4, 4], [10, 6], 12) == [6, 6]
    assert share_width([4, 4], [10, 6], 5) == [4, 4]
