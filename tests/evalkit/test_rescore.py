"""Rescoring reproduces the DB reward τ²-bench recorded for every simulation of its results file."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalkit.domains.base import Domain
from evalkit.formats import read_results
from evalkit.rescore import rescore
from evalkit.scoring import DBCheck


@pytest.mark.parametrize("shortcut", [True, False])
def test_rescore_agrees_with_every_recorded_db_reward(
    tau2_results_file: Path, tau2_retail: Domain, shortcut: bool
) -> None:
    results = read_results(tau2_results_file)
    report = rescore(results, tau2_retail, shortcut=shortcut)
    assert len(report.simulations) == 40
    assert report.disagreements == []
    recorded = [s.recorded for s in report.simulations]
    assert recorded.count(0.0) == 6
    assert recorded.count(1.0) == 34


def test_a_tampered_recording_is_reported_as_a_disagreement(
    tau2_results_file: Path, tau2_retail: Domain
) -> None:
    results = read_results(tau2_results_file)
    results.simulations = results.simulations[:2]
    sim = results.simulations[0]
    assert sim.reward_info is not None
    assert sim.reward_info.db_check is not None
    flipped = 1.0 - sim.reward_info.db_check.db_reward
    sim.reward_info.db_check = DBCheck(db_match=bool(flipped), db_reward=flipped)
    report = rescore(results, tau2_retail)
    assert report.to_dict()["disagree"] == [
        {"id": sim.id, "task_id": sim.task_id, "recorded": flipped, "recomputed": 1.0 - flipped}
    ]


def test_premature_endings_have_no_db_reward_on_either_side(
    tau2_results_file: Path, tau2_retail: Domain
) -> None:
    results = read_results(tau2_results_file)
    results.simulations = results.simulations[:1]
    sim = results.simulations[0]
    sim.termination_reason = "too_many_errors"
    sim.reward_info = None
    report = rescore(results, tau2_retail)
    first = report.simulations[0]
    assert first.recorded is None
    assert first.recomputed is None
    assert first.agrees


def test_rescore_of_tau2_telecom_agrees_on_db_env_assertions_and_reward(
    tau2_telecom_results_file: Path, tau2_telecom: Domain
) -> None:
    report = rescore(read_results(tau2_telecom_results_file), tau2_telecom)
    assert len(report.simulations) == 40
    assert report.disagreements == []
    assert all(s.recomputed_env is not None for s in report.simulations)
    rewards = [s.recomputed_reward for s in report.simulations]
    assert rewards.count(1.0) == 18
    assert rewards.count(0.0) == 22
    # τ²-bench's gold replay skips the sync step, so DB matches are rare even among successes
    assert [s.recorded for s in report.simulations].count(1.0) == 6


def test_a_tampered_env_assertion_is_reported_as_a_disagreement(
    tau2_telecom_results_file: Path, tau2_telecom: Domain
) -> None:
    results = read_results(tau2_telecom_results_file)
    sim = next(s for s in results.simulations if s.reward_info and s.reward_info.reward == 1.0)
    results.simulations = [sim]
    assert sim.reward_info is not None
    checks = sim.reward_info.env_assertions or []
    checks[0] = checks[0].model_copy(update={"met": False, "reward": 0.0})
    sim.reward_info.env_assertions = checks
    sim.reward_info.reward = 0.0
    entry = rescore(results, tau2_telecom).to_dict()["disagree"][0]
    assert entry["env"] == {"recorded": 0.0, "recomputed": 1.0}
    assert entry["reward"] == {"recorded": 0.0, "recomputed": 1.0}
