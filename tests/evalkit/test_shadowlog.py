"""`evalkit shadow LOG`: the shadow log read back gives the proxy's figures, and more."""

from __future__ import annotations

import dataclasses
import html
import json
import random
from pathlib import Path
from typing import Any

import matplotlib
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from evalkit.analysis.table import Table
from evalkit.cli import app
from evalkit.shadowlog import (
    LoggedPair,
    analyze_shadow_log,
    plot_shadow,
    read_shadow_log,
    shadow_tables,
    signature_figures,
    signature_lines,
    signature_summary,
)
from proxy.shadowstats import Decision, Pair, figures, tally_pairs

UNKNOWN = "unknown_tool"


def random_pairs(seed: int, n: int, *, own: tuple[str, ...] = ()) -> list[tuple[str, Pair]]:
    """Pairs of a quantized side that fails the reference's way, more often — and with the
    wrong names `own` too, which the reference never calls."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        names = ["lookup_order", "get_order", "find_user"]
        sides = []
        for rate, wrong in ((0.3, rng.choice(names + list(own))), (0.1, rng.choice(names))):
            if rng.random() < rate:
                sides.append(Decision((wrong,), (None,), ((UNKNOWN, wrong),)))
            elif rng.random() < 0.05:
                sides.append(Decision((), (), (("empty_response", ""),)))
            else:
                sides.append(Decision(("get_order_details",), ('{"order_id":"#W1"}',), ()))
        out.append((f"session-{i // 4}", Pair.between(sides[0], sides[1])))
    return out


def write_log(path: Path, pairs: list[tuple[str, Pair]], *, drops: int = 0) -> None:
    lines: list[dict[str, Any]] = []
    models = {"primary": "gemma-int4", "reference": "bf16"}
    for i, (session, pair) in enumerate(pairs):
        lines.append(
            {"event": "pair", "session": session, "request_id": str(i), "models": models}
            | pair.to_log()
        )
    lines += [{"event": "dropped", "session": "x", "models": models}] * drops
    lines.append({"event": "error", "kind": "timeout", "session": "x", "models": models})
    lines.append(
        {"event": "skipped", "reason": "previous_response_id", "session": "x", "models": models}
    )
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_the_log_gives_the_figures_the_proxy_computes_live(tmp_path: Path) -> None:
    pairs = random_pairs(1, 400)
    write_log(tmp_path / "shadow.jsonl", pairs, drops=2)
    result = CliRunner().invoke(app, ["shadow", str(tmp_path / "shadow.jsonl"), "--json"])
    assert result.exit_code == 0, result.output
    (offline,) = json.loads(result.output)["data"]
    live = figures(tally_pairs(p for _, p in pairs))
    assert offline["pairs"] == live["pairs"] == 400
    assert offline["outcomes"] == live["outcomes"]
    assert offline["dropped"] == 2
    assert offline["errors"] == {"timeout": 1}
    assert offline["skipped"] == {"previous_response_id": 1, "conversation": 0, "item_reference": 0}
    assert offline["skipped"].keys() == live["skipped"].keys()
    assert set(offline["channels"]) == set(live["channels"]) == {UNKNOWN, "empty_response"}
    for channel, mine in live["channels"].items():
        theirs = offline["channels"][channel]
        for side in ("primary", "reference"):
            assert theirs[side]["answers"] == mine[side]["answers"]
            assert theirs[side]["ci"] == pytest.approx(mine[side]["ci"], rel=1e-6)
        assert theirs["ratio"]["value"] == pytest.approx(mine["ratio"]["value"], rel=1e-12)
        assert theirs["ratio"]["ci"] == pytest.approx(mine["ratio"]["ci"], rel=1e-9)
    for key in ("rank_correlation", "novel_share", "primary_failures", "reference_failures"):
        assert offline["signatures"][key] == pytest.approx(live["signatures"][key], rel=1e-12)
    assert offline["arguments"]["compared"] == live["arguments"]["compared"]
    assert offline["arguments"]["equal"] == live["arguments"]["equal"]


def test_the_session_resampled_difference_sees_the_louder_side(tmp_path: Path) -> None:
    write_log(tmp_path / "shadow.jsonl", random_pairs(2, 400))
    (analysis,) = analyze_shadow_log(read_shadow_log([tmp_path / "shadow.jsonl"]), resamples=2000)
    unknown = next(c for c in analysis.channels if c.channel == UNKNOWN)
    assert analysis.sessions == 100
    assert unknown.difference > 0
    assert unknown.difference_ci[0] > 0  # 30% against 10%, 400 pairs: far from 0
    assert unknown.p_holm < 0.01


def test_rotated_and_per_worker_logs_read_together(tmp_path: Path) -> None:
    pairs = random_pairs(3, 60)
    write_log(tmp_path / "a.jsonl", pairs[:30])
    write_log(tmp_path / "a.jsonl.1", pairs[30:])
    (together,) = analyze_shadow_log(
        read_shadow_log([tmp_path / "a.jsonl", tmp_path / "a.jsonl.1"]), resamples=200
    )
    assert together.pairs == 60
    assert together.errors == {"timeout": 2}


def test_the_terminal_report_and_the_plot(tmp_path: Path) -> None:
    write_log(tmp_path / "shadow.jsonl", random_pairs(4, 100))
    plot = tmp_path / "shadow.png"
    result = CliRunner(env={"COLUMNS": "240"}).invoke(
        app, ["shadow", str(tmp_path / "shadow.jsonl"), "--plot", str(plot), "--resamples", "200"]
    )
    assert result.exit_code == 0, result.output
    assert "gemma-int4 against bf16" in result.output
    assert "unknown_tool" in result.output
    assert "novel share" in result.output
    assert "skipped: previous_response_id" in result.output
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_the_tables_are_evalkits_one_table_model(tmp_path: Path) -> None:
    write_log(tmp_path / "shadow.jsonl", random_pairs(6, 100))
    (analysis,) = analyze_shadow_log(read_shadow_log([tmp_path / "shadow.jsonl"]), resamples=200)
    summary, channels = shadow_tables(analysis)
    assert isinstance(summary, Table)
    assert isinstance(channels, Table)
    unknown = next(c for c in analysis.channels if c.channel == UNKNOWN)
    (row,) = [r for r in channels.rows if r[0] == UNKNOWN]
    assert row[channels.headers.index("ratio")] == f"{unknown.ratio.ratio:.2f}"  # type: ignore[union-attr]
    assert dict(summary.rows)["skipped: previous_response_id"] == "1"
    markdown = channels.markdown()
    assert "| channel | primary % | reference % | ratio |" in markdown
    assert "novel share" in markdown
    assert "<table>" in channels.html()


def test_a_line_that_is_not_a_shadow_line_names_its_file_and_line(tmp_path: Path) -> None:
    log = tmp_path / "shadow.jsonl"
    write_log(log, random_pairs(5, 3))
    log.write_text(log.read_text() + '{"event": "pair"}\n')
    result = CliRunner().invoke(app, ["shadow", str(log)])
    assert result.exit_code == 4
    assert f"{log}:6 is not a shadow log line" in result.output
    missing = CliRunner().invoke(app, ["shadow", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2
    assert "cannot read shadow log" in missing.output


def test_an_empty_log_and_one_that_is_not_text_are_clear_errors(tmp_path: Path) -> None:
    empty, blank = tmp_path / "empty.jsonl", tmp_path / "blank.jsonl"
    empty.write_bytes(b"")
    blank.write_text("\n  \n")
    result = CliRunner().invoke(app, ["shadow", str(empty), str(blank)])
    assert result.exit_code == 4
    assert f"no shadow log line in {empty}, {blank} (empty, or blank lines only)" in result.output
    corrupt = tmp_path / "corrupt.jsonl"
    write_log(corrupt, random_pairs(7, 2))
    corrupt.write_bytes(corrupt.read_bytes() + b"\xff\xfe garbage\n")
    result = CliRunner().invoke(app, ["shadow", str(corrupt), "--json"])
    assert result.exit_code == 4
    assert f"{corrupt}:5 is not a shadow log line (not UTF-8 text" in result.output
    assert "Traceback" not in result.output
    truncated = tmp_path / "truncated.jsonl"  # a writer stopped in the middle of its last line
    write_log(truncated, random_pairs(8, 2))
    truncated.write_bytes(truncated.read_bytes()[:-20])
    result = CliRunner().invoke(app, ["shadow", str(truncated)])
    assert result.exit_code == 4
    assert f"{truncated}:4 is not a shadow log line" in result.output


def test_the_report_gives_the_signature_figures_intervals_and_how_they_were_drawn(
    tmp_path: Path,
) -> None:
    log = tmp_path / "shadow.jsonl"
    write_log(log, random_pairs(9, 400, own=("fetch_order",)))
    result = CliRunner(env={"COLUMNS": "400"}).invoke(
        app, ["shadow", str(log), "--resamples", "300", "--seed", "4"]
    )
    assert result.exit_code == 0, result.output
    (analysis,) = analyze_shadow_log(read_shadow_log([log]), resamples=300, seed=4)
    sig = analysis.signatures
    assert sig.rank_correlation_ci is not None
    assert sig.novel_share_ci is not None
    rho, novel = sig.rank_correlation_ci, sig.novel_share_ci
    printed = " ".join(result.output.split())  # the terminal wraps the footnotes
    for text in (printed, shadow_tables(analysis)[1].markdown()):
        assert f"Spearman {sig.rank_correlation:.2f} (95% CI {rho.low:.2f}–{rho.high:.2f})" in text
        assert f"(95% CI {100 * novel.low:.1f}–{100 * novel.high:.1f}%)" in text
        assert "basic bootstrap over the log's 100 sessions" in text
        assert "300 resamples, seed 4" in text
        assert f"With {sig.reference_failures} reference failures (under 100)" in text
    enough = dataclasses.replace(sig, reference_failures=100)
    assert "reference failures (under" not in " ".join(signature_lines(enough))


def test_without_failures_or_pairs_the_signature_figures_have_no_interval(tmp_path: Path) -> None:
    clean = Decision(("get_order_details",), ('{"order_id":"#W1"}',), ())
    log = tmp_path / "shadow.jsonl"
    write_log(log, [(f"s{i}", Pair.between(clean, clean)) for i in range(5)], drops=3)
    only_drops = tmp_path / "drops.jsonl"
    write_log(only_drops, [], drops=3)
    unknown = Decision(("lookup",), (None,), ((UNKNOWN, "lookup"),))
    other = Decision(("find",), (None,), ((UNKNOWN, "find"),))
    one_session = tmp_path / "one.jsonl"  # figures defined, but nothing to resample
    write_log(
        one_session,
        [("s", Pair.between(unknown, unknown))] * 2 + [("s", Pair.between(other, clean))],
    )
    (single,) = analyze_shadow_log(read_shadow_log([one_session]), resamples=100)
    assert single.signatures.novel_share == pytest.approx(1 / 3)
    assert single.signatures.rank_correlation is not None
    assert single.signatures.rank_correlation_ci is None
    assert single.signatures.novel_share_ci is None
    assert signature_lines(single.signatures)[1] == (
        "No intervals: the figures are undefined or the log holds 1 session(s), too few to "
        "resample."
    )
    for path, sessions in ((log, 5), (only_drops, 0)):
        result = CliRunner().invoke(app, ["shadow", str(path), "--json", "--resamples", "100"])
        assert result.exit_code == 0, result.output
        (offline,) = json.loads(result.output)["data"]
        signatures = offline["signatures"]
        assert signatures["rank_correlation"] is None
        assert signatures["rank_correlation_ci"] is None
        assert signatures["novel_share_ci"] is None
        assert signatures["bootstrap"]["sessions"] == sessions
        text = CliRunner().invoke(app, ["shadow", str(path), "--resamples", "100"])
        assert text.exit_code == 0, text.output
        assert "Spearman –" in " ".join(text.output.split())


def test_the_plot_titles_each_panel_with_the_signature_figures(tmp_path: Path) -> None:
    log = tmp_path / "shadow.jsonl"
    write_log(log, random_pairs(10, 200))
    analyses = analyze_shadow_log(read_shadow_log([log]), resamples=200, seed=2)
    svg = tmp_path / "shadow.svg"
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as text, to read it back
        plot_shadow(analyses, svg)
    sig = analyses[0].signatures
    assert sig.rank_correlation_ci is not None
    text = html.unescape(svg.read_text())
    assert f"failure signatures: {signature_summary(sig)}" in text
    assert f"(95% CI {sig.rank_correlation_ci.low:.2f}–{sig.rank_correlation_ci.high:.2f})" in text


def test_the_report_fits_an_80_column_terminal_without_cutting_a_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_log(tmp_path / "shadow.jsonl", random_pairs(1, 400))
    monkeypatch.setenv("COLUMNS", "80")
    result = CliRunner().invoke(app, ["shadow", str(tmp_path / "shadow.jsonl")])
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    assert "…" not in result.output
    (analysis,) = analyze_shadow_log(read_shadow_log([tmp_path / "shadow.jsonl"]))
    words = result.output.split()
    for table in shadow_tables(analysis):
        for row in table.rows:
            assert all(word in words for cell in row for word in cell.split()), row


@settings(max_examples=60, deadline=None)
@given(
    sessions=st.lists(
        st.lists(
            st.tuples(st.sampled_from(["", "a", "b", "c"]), st.sampled_from(["", "a", "b", "d"])),
            min_size=1,
            max_size=6,
        ),
        min_size=1,
        max_size=12,
    ),
    seed=st.integers(0, 20),
)
def test_every_signature_interval_holds_its_estimate_and_stays_in_range(
    sessions: list[list[tuple[str, str]]], seed: int
) -> None:
    """Pairs whose sides call a wrong name ("" for a valid call), sessions of a few pairs."""

    def side(wrong: str) -> Decision:
        if not wrong:
            return Decision(("get_order_details",), ("{}",), ())
        return Decision((wrong,), (None,), ((UNKNOWN, wrong),))

    pairs = [
        LoggedPair(f"s{i}", Pair.between(side(primary), side(reference)))
        for i, session in enumerate(sessions)
        for primary, reference in session
    ]
    figures = signature_figures(pairs, resamples=200, seed=seed)
    for ci, estimate, lowest in (
        (figures.rank_correlation_ci, figures.rank_correlation, -1.0),
        (figures.novel_share_ci, figures.novel_share, 0.0),
    ):
        if ci is not None:
            assert estimate is not None
            assert lowest <= ci.low <= estimate <= ci.high <= 1.0
            assert ci.low < ci.high
