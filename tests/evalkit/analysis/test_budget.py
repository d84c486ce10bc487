"""The budget curve equals hand-computed values and, on τ²-bench's files, the recorded score."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from evalkit.analysis.budget import Budget, budget_curve, reward_at_budget, rewards_by_budget
from evalkit.analysis.load import default_tool_source, load_runs
from tests.evalkit.analysis.builders import USER_ERROR, Call, episode, errors, results, write


def _curve(path: Path) -> list[float]:
    (run,) = load_runs([path], resamples=500)
    return [p.pass_rate for p in run.budget_curve]


def test_reward_at_budget_keeps_the_reward_only_while_errors_stay_below_k() -> None:
    assert reward_at_budget(1.0, 0, 0) == 0.0
    assert reward_at_budget(1.0, 0, 1) == 1.0
    assert reward_at_budget(1.0, 2, 2) == 0.0
    assert reward_at_budget(1.0, 2, 3) == 1.0
    assert reward_at_budget(0.5, 1, 10) == 0.5


def test_curve_of_a_hand_built_run_equals_the_values_computed_by_hand(tmp_path: Path) -> None:
    sims = [
        episode("1", reward=1.0),  # no error: passes from k = 1
        episode("2", errors(2), reward=1.0),  # passes from k = 3
        episode("3", errors(10), reward=0.0, termination="too_many_errors"),  # never passes
        episode("4", errors(1), reward=1.0),  # passes from k = 2
        episode("5", reward=0.0),  # failed on its own: never passes
    ]
    path = write(tmp_path / "run.json", results(sims, max_errors=10))
    #        k = 0    1    2    3 … 10
    expected = [0.0, 0.2, 0.4] + [0.6] * 8
    assert _curve(path) == expected


def test_killed_episodes_score_zero_at_every_budget_and_the_curve_ends_at_the_recorded_score(
    tmp_path: Path,
) -> None:
    sims = [
        episode("a", errors(3), reward=0.0, termination="too_many_errors"),
        episode("b", errors(1), reward=1.0),
        episode("c", errors(2), reward=1.0),
    ]
    path = write(tmp_path / "run.json", results(sims, max_errors=3))
    assert _curve(path) == [0.0, 0.0, pytest.approx(1 / 3), pytest.approx(2 / 3)]
    recorded = json.loads(path.read_text())["simulations"]
    assert _curve(path)[-1] == math.fsum(s["reward_info"]["reward"] for s in recorded) / 3


def test_user_tool_errors_consume_the_budget_like_the_agents(tmp_path: Path) -> None:
    sims = [
        episode("t1", [Call(USER_ERROR, "toggle_data"), Call(USER_ERROR, "reboot_device")]),
        episode("t2", errors(1)),
    ]
    path = write(tmp_path / "telecom.json", results(sims, domain="telecom", max_errors=4))
    assert _curve(path) == [0.0, 0.0, 0.5, 1.0, 1.0]


def test_a_run_pooled_from_files_with_different_budgets_stops_at_the_smaller_one(
    tmp_path: Path,
) -> None:
    first = write(tmp_path / "a.json", results([episode("1", errors(1))], max_errors=5))
    second = write(tmp_path / "b.json", results([episode("2")], max_errors=3))
    (run,) = load_runs([first, second], resamples=200)
    assert run.max_errors == 3
    assert [p.pass_rate for p in run.budget_curve] == [0.0, 0.5, 1.0, 1.0]


def test_a_file_without_max_errors_is_read_at_taus_default_of_10(tmp_path: Path) -> None:
    path = write(tmp_path / "run.json", results([episode("1")], max_errors=None))
    (run,) = load_runs([path], resamples=200)
    assert run.max_errors == 10
    assert len(run.budget_curve) == 11


def test_intervals_hold_their_point_and_are_degenerate_where_every_episode_agrees() -> None:
    rewards = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    errs = [0, 0, 1, 3, 5, 2, 0, 1]
    curve = budget_curve(rewards, errs, 6, [str(i) for i in range(8)], resamples=2000)
    assert [p.k for p in curve] == list(range(7))
    assert (curve[0].ci_low, curve[0].ci_high) == (0.0, 0.0)
    for point in curve[1:]:
        assert 0.0 <= point.ci_low <= point.pass_rate <= point.ci_high <= 1.0
    assert curve[1].ci_low < curve[1].ci_high


def test_the_same_seed_gives_the_same_intervals_and_another_seed_other_ones() -> None:
    # Fractional rewards, so that quantiles of different resamples land on different values.
    rewards = [0.13, 0.91, 0.42, 0.77, 0.05, 0.66, 0.38, 0.84, 0.29, 0.57, 0.71, 0.02]
    errs = [0, 1, 2, 0, 0, 3, 1, 0, 2, 0, 1, 0]
    one = budget_curve(rewards, errs, 3, resamples=500, seed=1)
    assert one == budget_curve(rewards, errs, 3, resamples=500, seed=1)
    assert one != budget_curve(rewards, errs, 3, resamples=500, seed=2)


def test_mismatched_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="rewards for"):
        rewards_by_budget([1.0], [0, 1], 3)
    with pytest.raises(ValueError, match="max_errors"):
        rewards_by_budget([1.0], [0], -1)
    assert budget_curve([], [], 5) == []


@pytest.mark.parametrize(
    "fixture", ["tau2_results_file", "tau2_telecom_results_file"], ids=["retail", "telecom"]
)
def test_on_taus_results_the_curve_at_max_errors_is_the_recorded_mean_reward(
    fixture: str, request: pytest.FixtureRequest, tau2_dir: Path
) -> None:
    path: Path = request.getfixturevalue(fixture)
    data = json.loads(path.read_text(encoding="utf-8"))
    rewards = [s["reward_info"]["reward"] for s in data["simulations"]]
    (run,) = load_runs([path], tools=default_tool_source(tau2_dir), resamples=500)
    # A τ²-bench file was budgeted by τ²-bench's count alone: that is its headline curve.
    assert run.budget is Budget.TAU2
    curve = run.curve(Budget.TAU2)
    assert run.max_errors == data["info"]["max_errors"]
    assert curve[-1].k == data["info"]["max_errors"]
    assert curve[-1].pass_rate == math.fsum(rewards) / len(rewards)
    assert run.mean_reward == math.fsum(rewards) / len(rewards)
    # The proxy's count is never below τ²-bench's, so its curve never lies above.
    proxy = run.curve(Budget.PROXY)
    assert all(p.pass_rate <= t.pass_rate for p, t in zip(proxy, curve, strict=True))
    # Below the budget the curve can only fall, and at k = 1 only error-free episodes count.
    rates = [p.pass_rate for p in curve]
    assert rates == sorted(rates)
    clean = [
        s["reward_info"]["reward"]
        for s in data["simulations"]
        if not any(m["role"] == "tool" and m.get("error") for m in s["messages"])
    ]
    assert rates[1] == pytest.approx(sum(clean) / len(rewards))
