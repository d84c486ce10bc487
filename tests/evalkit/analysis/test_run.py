"""A run's figures: channels, rates, errors per episode, terminations, tasks, and its JSON."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalkit.analysis.budget import Budget
from evalkit.analysis.channels import ErrorChannel
from evalkit.analysis.load import load_runs
from evalkit.analysis.run import analyze_episodes
from tests.evalkit.analysis.builders import (
    OK,
    UNKNOWN,
    USER_ERROR,
    USER_OK,
    Call,
    episode,
    errors,
    results,
    write,
)


def _run(tmp_path: Path):  # type: ignore[no-untyped-def]
    sims = [
        episode("1", [Call(OK), Call(UNKNOWN, "get_weather"), Call(USER_OK, "check_sim")]),
        episode("1", errors(3), reward=0.0, termination="too_many_errors", trial=1),
        episode("2", [Call(USER_ERROR, "toggle_data"), Call(UNKNOWN, "get_weather")]),
        episode("3", [Call(OK)], reward=0.5, termination="agent_stop"),
    ]
    # A domain evalkit does not ship, so the error texts alone classify the failures.
    path = write(tmp_path / "run.json", results(sims, domain="airline", max_errors=3))
    (run,) = load_runs([path], resamples=500)
    return run


def test_the_figures_of_a_small_run(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert len(run.episodes) == 4
    assert run.mean_reward == pytest.approx(2.5 / 4)
    assert run.errors == 6
    assert (run.agent_calls, run.user_calls) == (7, 2)
    assert run.channels() == {
        ErrorChannel.UNKNOWN_TOOL: 2,
        ErrorChannel.ENVIRONMENT_ERROR: 3,
        ErrorChannel.USER_TOOL_ERROR: 1,
    }
    assert run.rate(ErrorChannel.UNKNOWN_TOOL) == pytest.approx(2 / 7)
    assert run.rate(ErrorChannel.USER_TOOL_ERROR) == pytest.approx(1 / 2)
    assert run.errors_per_episode() == {0: 1, 1: 1, 2: 1, 3: 1}
    assert run.termination_reasons() == {"user_stop": 2, "too_many_errors": 1, "agent_stop": 1}
    assert run.wrong_tool_names() == {"get_weather": 2}
    tasks = {t.task_id: t for t in run.tasks()}
    assert (tasks["1"].episodes, tasks["1"].mean_reward, tasks["1"].errors) == (2, 0.5, 4)


def test_the_json_leads_with_the_documented_keys(tmp_path: Path) -> None:
    data = _run(tmp_path).to_dict()
    assert list(data)[:5] == [
        "episodes",
        "mean_reward",
        "channels",
        "budget_curve",
        "termination_reasons",
    ]
    assert data["channels"]["unknown_tool"] == 2
    assert sum(data["channels"].values()) == data["errors"] == 6
    assert [p["k"] for p in data["budget_curve"]] == [0, 1, 2, 3]
    assert set(data["budget_curve"][0]) == {"k", "pass_rate", "ci_low", "ci_high"}
    assert data["errors_per_episode"] == {"0": 1, "1": 1, "2": 1, "3": 1}
    assert len(data["per_episode"]) == 4


def test_the_proxys_own_counts_are_summed_from_the_headers_of_each_turn(tmp_path: Path) -> None:
    through_proxy = episode("1", [Call(UNKNOWN, "get_weather")])
    through_proxy["toolsentry"] = {
        # x-toolsentry-repairs counts the repairs of its own response: they add up.
        "turns": [
            {"turn_idx": 1, "headers": {"x-toolsentry-repairs": "1"}},
            {"turn_idx": 3, "headers": {"x-toolsentry-repairs": "1"}},
        ],
        "channels": {"unknown_tool": 3, "schema_violation": 1},
        "repairs": 1,
        "errors": 1,
    }
    direct = episode("2")
    path = write(tmp_path / "proxy.json", results([through_proxy, direct]))
    (run,) = load_runs([path], resamples=200)
    assert run.proxy_channels() == {"unknown_tool": 3, "schema_violation": 1}
    assert run.repairs == 2
    # The trajectory shows the one failure the agent experienced; the proxy saw three more.
    assert run.channels()[ErrorChannel.UNKNOWN_TOOL] == 1
    assert run.to_dict()["proxy"] == {
        "channels": {"unknown_tool": 3, "schema_violation": 1},
        "repairs": 2,
        "requests": 2,
        "sources": {"response headers": 1},
    }
    # A run through the proxy is budgeted by it: its headline curve is the proxy's.
    assert run.budget is Budget.PROXY


def test_the_session_record_is_preferred_to_the_headers(tmp_path: Path) -> None:
    sim = episode("1")
    sim["toolsentry"] = {
        "turns": [{"turn_idx": 1, "headers": {"x-toolsentry-repairs": "1"}}],
        "channels": {"unknown_tool": 1},
        "proxy_session": {
            "channels": {"unknown_tool": 3, "tool_error": 1},
            "requests": 7,
            "repairs": 2,
        },
    }
    (run,) = load_runs([write(tmp_path / "r.json", results([sim]))], resamples=200)
    assert run.proxy_channels() == {"unknown_tool": 3, "tool_error": 1}
    assert (run.proxy_requests, run.repairs) == (7, 2)
    assert run.proxy_sources() == {"session record": 1}


def test_an_empty_run_has_zero_figures_and_no_curve() -> None:
    run = analyze_episodes([], max_errors=5)
    assert (run.mean_reward, run.errors, run.errors_per_episode()) == (0.0, 0, {})
    assert run.budget_curve == ()
    assert run.rate(ErrorChannel.UNKNOWN_TOOL) is None
    with pytest.raises(ValueError, match="max_errors"):
        analyze_episodes([], max_errors=-1)
