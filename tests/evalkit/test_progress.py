"""Progress said as plain lines where the output is not a terminal (`evalkit.progress`)."""

from __future__ import annotations

import io

from rich.console import Console

from evalkit.progress import ProgressLines

HOUR = 3600.0


def console(*, terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=20), out


def test_off_a_terminal_a_bar_says_its_first_count_then_only_when_due_and_its_last() -> None:
    shown, out = console(terminal=False)
    lines = ProgressLines(shown, "episodes", interval_s=HOUR)
    for done in range(1, 47):
        lines.update("int4   ", done, 46, f"reward {done}")
    assert out.getvalue().splitlines() == [
        "int4: 1/46 episodes  reward 1",
        "int4: 46/46 episodes  reward 46",
    ]


def test_each_bar_has_its_own_first_line_and_a_line_is_never_wrapped() -> None:
    shown, out = console(terminal=False)
    lines = ProgressLines(shown, "answers", interval_s=HOUR)
    lines.update("a direct", 1, None, "violations  12.5%")
    lines.update("b direct", 1, None, "")
    lines.update("a direct", 2, None, "violations   6.2%")
    assert out.getvalue().splitlines() == [
        "a direct: 1 answers  violations  12.5%",
        "b direct: 1 answers",
    ]


def test_with_no_interval_every_count_is_said() -> None:
    shown, out = console(terminal=False)
    lines = ProgressLines(shown, "episodes", interval_s=0.0)
    for done in (1, 2, 3):
        lines.update("bf16", done, 5, "")
    assert len(out.getvalue().splitlines()) == 3


def test_on_a_terminal_the_live_bars_say_it_and_no_line_is_printed() -> None:
    shown, out = console(terminal=True)
    lines = ProgressLines(shown, "episodes")
    lines.update("int4", 1, 46, "")
    assert out.getvalue() == ""
