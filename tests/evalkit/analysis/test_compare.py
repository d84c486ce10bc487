"""Comparing B against A: pairing, score difference, channel ratios, signatures, budget gap and
the verdict, on runs built by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalkit.analysis.channels import ErrorChannel
from evalkit.analysis.compare import compare_cells, compare_runs, pair_episodes
from evalkit.analysis.load import load_runs, pair_cells
from evalkit.analysis.run import RunAnalysis
from evalkit.analysis.stats import holm, rate_ratio, spearman
from evalkit.errors import UsageError
from tests.evalkit.analysis.builders import OK, UNKNOWN, Call, episode, errors, results, write

TASKS = [str(i) for i in range(12)]


def _run(tmp_path: Path, name: str, sims: list[dict], **kwargs: object) -> RunAnalysis:
    path = write(tmp_path / f"{name}.json", results(sims, **kwargs))  # type: ignore[arg-type]
    (run,) = load_runs([path], label=name, resamples=2000)
    return run


def _reference(tmp_path: Path) -> RunAnalysis:
    # Every task passes; tasks 0-2 stumble once on a made-up tool name, the rest call cleanly.
    sims = [
        episode(t, [Call(UNKNOWN, "get_weather")] if int(t) < 3 else [Call(OK)] * 2) for t in TASKS
    ]
    return _run(tmp_path, "bf16", sims)


def _damaged(tmp_path: Path) -> RunAnalysis:
    # The same mistakes, more often: tasks 0-5 call made-up names twice, task 6 three times
    # and fails; one name A never used.
    sims = []
    for t in TASKS:
        i = int(t)
        if i < 6:
            calls = [Call(UNKNOWN, "get_weather"), Call(UNKNOWN, "get_weather")]
        elif i == 6:
            calls = [*errors(2, UNKNOWN, "get_weather"), Call(UNKNOWN, "lookup_order")]
        else:
            calls = [Call(OK)] * 2
        sims.append(episode(t, calls, reward=0.0 if i == 6 else 1.0))
    return _run(tmp_path, "int4", sims)


def test_a_damaged_run_against_its_reference_gives_the_figures_computed_by_hand(
    tmp_path: Path,
) -> None:
    a, b = _reference(tmp_path), _damaged(tmp_path)
    cell = compare_runs(a, b, resamples=2000)
    assert cell.pairs == 12
    assert (cell.a_score, cell.b_score) == (1.0, pytest.approx(11 / 12))
    assert cell.difference == pytest.approx(-1 / 12)
    assert cell.ci[0] <= cell.difference <= cell.ci[1]
    # One task of twelve differs: the exact sign-flip p-value is 1.
    assert cell.p_value == 1.0

    unknown = next(c for c in cell.channels if c.channel is ErrorChannel.UNKNOWN_TOOL)
    # A: 3 of 21 calls (3 + 9·2); B: 15 of 25 calls (6·2 + 3 + 5·2).
    assert (unknown.a_count, unknown.a_calls, unknown.b_count, unknown.b_calls) == (3, 21, 15, 25)
    expected = rate_ratio(3, 21, 15, 25)
    assert unknown.ratio == expected
    assert unknown.ratio is not None
    assert unknown.ratio.ratio == pytest.approx((15 / 25) / (3 / 21))

    # Signatures: (task, channel) counts over the union of tasks 0-6.
    a_counts = [1, 1, 1, 0, 0, 0, 0]
    b_counts = [2, 2, 2, 2, 2, 2, 3]
    assert cell.signature_correlation == pytest.approx(spearman(a_counts, b_counts))
    # B's failures on tasks 3-6 (2·3 + 3 = 9 of 15) never happen in A.
    assert cell.novel_share == pytest.approx(9 / 15)
    assert cell.tool_name_correlation == pytest.approx(spearman([3, 0], [14, 1]))
    assert cell.novel_tool_name_share == pytest.approx(1 / 15)

    # Budget gap A − B: at k = 1 A loses tasks 0-2 (9/12 pass), B loses 0-6 (5/12);
    # at k = 2 A passes all, B loses 0-6 (tasks with two errors) → 5/12; from k = 3 B loses 6 only.
    gaps = {g.k: g.gap for g in cell.gaps}
    assert gaps[0] == 0.0
    assert gaps[1] == pytest.approx(9 / 12 - 5 / 12)
    assert gaps[2] == pytest.approx(1 - 5 / 12)
    assert gaps[3] == pytest.approx(1 / 12)
    assert gaps[10] == pytest.approx(1 / 12)
    widest = cell.largest_gap()
    assert widest is not None
    assert widest.k == 2


def test_the_verdict_names_the_score_the_damaged_channel_and_the_widest_gap(
    tmp_path: Path,
) -> None:
    cell = compare_runs(_reference(tmp_path), _damaged(tmp_path), resamples=2000)
    verdict = cell.verdict()
    assert verdict.startswith("score ")
    assert "tool-name hallucination ×4.2 [" in verdict
    assert "gap at budget 2: 58.3 points (8.3 at 10)" in verdict


def test_a_run_compared_with_itself_draws_no_conclusion_from_zero_variance(
    tmp_path: Path,
) -> None:
    """Identical paired rewards have no spread: no interval and no TOST "equivalence" from it."""
    a = _reference(tmp_path)
    cell = compare_runs(a, a, resamples=500)
    assert not cell.equivalent
    assert cell.tost is None
    assert cell.difference == 0.0
    assert all(g.gap == 0.0 for g in cell.gaps)
    assert cell.novel_share == 0.0
    assert cell.to_dict()["ci_low"] is None
    assert cell.verdict() == (
        "score B − A +0.0, not tested: the paired differences do not vary (every one of 12 tasks "
        "+0.0), so no interval or equivalence test can be drawn; one task that flips moves the "
        "score by 8.3 points — more tasks or trials (--trials) needed, "
        "too few wrong-name calls to compare (A 3, B 3; 10 a side needed), "
        "no channel's rate changed significantly, the same score at every budget"
    )


def test_a_large_consistent_drop_is_a_significant_difference_not_equivalence(
    tmp_path: Path,
) -> None:
    tasks = [str(i) for i in range(30)]
    a = _run(tmp_path, "a", [episode(t) for t in tasks])
    b = _run(tmp_path, "b", [episode(t, reward=0.0 if int(t) % 2 else 1.0) for t in tasks])
    cell = compare_runs(a, b, resamples=2000)
    assert cell.difference == pytest.approx(-0.5)
    assert cell.p_value == pytest.approx(2 / 2**15)
    assert not cell.equivalent
    assert cell.verdict().startswith("score lower by 50.0 points")


def test_episodes_pair_by_task_and_trial_order_and_leftovers_are_counted(tmp_path: Path) -> None:
    a = _run(
        tmp_path,
        "a",
        [episode("x", trial=1), episode("x", trial=0), episode("y", trial=0), episode("z")],
    )
    b = _run(tmp_path, "b", [episode("x", trial=0), episode("x", trial=5), episode("y")])
    pairs = pair_episodes(a.episodes, b.episodes)
    assert [(ea.task_id, ea.trial, eb.trial) for ea, eb in pairs] == [
        ("x", 1, 5),
        ("x", 0, 0),
        ("y", 0, 0),
    ]
    cell = compare_runs(a, b, resamples=200)
    assert (cell.pairs, cell.unmatched_a, cell.unmatched_b) == (3, 1, 0)


def test_runs_with_no_common_task_compare_to_nothing(tmp_path: Path) -> None:
    a = _run(tmp_path, "a", [episode("1")])
    b = _run(tmp_path, "b", [episode("2")])
    cell = compare_runs(a, b, resamples=200)
    assert cell.pairs == 0
    assert cell.tost is None
    assert cell.verdict() == "no episodes could be paired by task and trial"


def test_holm_corrects_the_score_tests_across_cells(tmp_path: Path) -> None:
    tasks = [str(i) for i in range(20)]
    retail_a = _run(tmp_path, "ra", [episode(t) for t in tasks])
    retail_b = _run(tmp_path, "rb", [episode(t, reward=float(int(t) > 6)) for t in tasks])
    telecom_a = _run(tmp_path, "ta", [episode(t) for t in tasks], domain="telecom")
    telecom_b = _run(
        tmp_path, "tb", [episode(t, reward=float(int(t) > 2)) for t in tasks], domain="telecom"
    )
    cells = compare_cells([(retail_a, retail_b), (telecom_a, telecom_b)], resamples=500)
    raw = [c.p_value for c in cells]
    assert [c.p_holm for c in cells] == pytest.approx(holm(raw))
    assert cells[0].p_holm == pytest.approx(2 * raw[0])  # the smaller p-value, times two


def test_cells_pair_by_domain_then_order_and_refuse_a_lopsided_domain(tmp_path: Path) -> None:
    a_retail = _run(tmp_path, "a1", [episode("1")], model="m-bf16")
    a_telecom = _run(tmp_path, "a2", [episode("1")], domain="telecom", model="m-bf16")
    b_telecom = _run(tmp_path, "b2", [episode("1")], domain="telecom", model="m-int4")
    b_retail = _run(tmp_path, "b1", [episode("1")], model="m-int4")
    cells = pair_cells([a_retail, a_telecom], [b_telecom, b_retail])
    assert [(x.label, y.label) for x, y in cells] == [("a1", "b1"), ("a2", "b2")]
    with pytest.raises(UsageError, match="domain 'telecom': A has no run"):
        pair_cells([a_retail], [b_retail, b_telecom])


def test_margin_must_be_positive(tmp_path: Path) -> None:
    a = _reference(tmp_path)
    with pytest.raises(ValueError, match="margin"):
        compare_runs(a, a, margin=0.0)


def test_the_comparison_serialises_every_figure(tmp_path: Path) -> None:
    cell = compare_runs(_reference(tmp_path), _damaged(tmp_path), resamples=500)
    data = cell.to_dict()
    assert data["pairs"] == 12
    assert data["difference"] == pytest.approx(-1 / 12)
    assert {c["channel"] for c in data["channels"]} == {c.value for c in ErrorChannel}
    assert [g["k"] for g in data["budget_gap"]] == list(range(11))
    assert data["tost"]["margin"] == 0.075
    assert data["verdict"] == cell.verdict()


def test_signature_statistics_are_shown_with_a_warning_under_the_threshold(
    tmp_path: Path,
) -> None:
    small = compare_runs(_reference(tmp_path), _damaged(tmp_path), resamples=500)
    # A makes 3 wrong-name calls: too few for a rank correlation to mean much, but it is shown.
    assert not small.wrong_names.enough
    assert small.wrong_names.correlation == 1.0
    assert "wrong tool names ρ 1.00" in small.verdict()
    assert "warning: only 3 (A) and 15 (B) wrong-name calls" in small.verdict()
    # Every resample gives ρ = 1 (two names, in the same order): a point, not an interval.
    assert small.wrong_names.correlation_ci is None
    assert small.wrong_names.novel_ci is not None
    damaged = _damaged(tmp_path)
    large = compare_runs(damaged, damaged, resamples=500)
    stats = large.wrong_names
    assert stats.enough
    assert stats.warning() is None
    assert stats.novel == 0.0
    assert stats.novel_ci is None  # 0 in every resample
    assert "no interval for ρ" in large.verdict()
