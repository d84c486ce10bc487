"""Rescoring reproduces the DB reward τ²-bench recorded for every simulation of its results file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evalkit.domains.base import Domain
from evalkit.exits import WRONG_DATA
from evalkit.formats import read_results
from evalkit.rescore import rescore
from evalkit.scoring import DBCheck

REPO = Path(__file__).resolve().parents[2]


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


def _evalkit(*args: str) -> subprocess.CompletedProcess[str]:
    """The real `evalkit` command line, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "evalkit.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _tau2_files(tau2_dir: Path) -> list[tuple[Path, str]]:
    """Every τ²-bench results file shipped with the reference data, with its domain's name."""
    found = []
    for path in sorted((tau2_dir / "results").glob("*.json")):
        info = json.loads(path.read_text(encoding="utf-8")).get("info", {})
        found.append((path, info["environment_info"]["domain_name"]))
    assert found, f"no τ²-bench results file in {tau2_dir / 'results'}"
    return found


def test_every_tau2_file_without_its_data_is_refused_with_the_fix(tau2_dir: Path) -> None:
    # The shipped databases are synthetic: a verdict on τ²-bench's files from them would be
    # coincidence (retail) or a crash (telecom), so rescore refuses them in one line.
    for path, _ in _tau2_files(tau2_dir):
        proc = _evalkit("rescore", str(path))
        assert proc.returncode == WRONG_DATA, (path, proc.stdout, proc.stderr)
        assert proc.stdout == ""
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert "--data-dir" in proc.stderr
        assert "Traceback" not in proc.stderr


def test_every_tau2_file_with_its_data_agrees_with_its_recorded_rewards(tau2_dir: Path) -> None:
    for path, domain in _tau2_files(tau2_dir):
        recorded = json.loads(path.read_text(encoding="utf-8"))["simulations"]
        proc = _evalkit("rescore", str(path), "--data-dir", str(tau2_dir / "domains" / domain))
        assert proc.returncode == 0, (path, proc.stdout[-2000:], proc.stderr)
        assert f"{len(recorded)} of {len(recorded)} simulations agree." in proc.stdout
        assert "Traceback" not in proc.stdout + proc.stderr


def test_analyze_reads_every_tau2_file_with_and_without_its_data(tau2_dir: Path) -> None:
    for path, _ in _tau2_files(tau2_dir):
        for extra in ([], ["--data-dir", str(tau2_dir)]):
            proc = _evalkit("analyze", str(path), *extra)
            assert proc.returncode == 0, (path, extra, proc.stderr)
            assert "Traceback" not in proc.stdout + proc.stderr


def solo_mode_file(recorded: Path, out: Path) -> int:
    """τ²-bench's recorded telecom run as its solo orchestrator writes one: the agent is
    `llm_agent_solo`, the user `dummy_user`, and every call of the user's tools is the agent's
    (role `assistant`, requestor `assistant`, as its solo environment takes them); the user's
    words are gone. The tool calls run in the same order on the same state, so τ²-bench's
    recorded rewards stay the rewards of the solo file. Returns how many calls moved."""
    data = json.loads(recorded.read_text(encoding="utf-8"))
    data["info"]["agent_info"]["implementation"] = "llm_agent_solo"
    data["info"]["user_info"] = {"implementation": "dummy_user", "llm": None, "llm_args": None}
    moved = 0
    for simulation in data["simulations"]:
        messages = []
        for message in simulation["messages"]:
            if message["role"] == "user":
                if not message.get("tool_calls"):
                    continue
                message = {**message, "role": "assistant"}
                for call in message["tool_calls"]:
                    call["requestor"] = "assistant"
                    moved += 1
            elif message["role"] == "tool":
                message = {**message, "requestor": "assistant"}
            messages.append(message)
        simulation["messages"] = messages
    out.write_text(json.dumps(data), encoding="utf-8")
    return moved


def test_a_solo_mode_file_agrees_with_its_recorded_rewards(
    tau2_dir: Path, tau2_telecom_results_file: Path, tmp_path: Path
) -> None:
    # The solo agent's calls of the user's tools run on the user's device, as in τ²-bench.
    solo = tmp_path / "solo.json"
    assert solo_mode_file(tau2_telecom_results_file, solo) > 0
    proc = _evalkit("rescore", str(solo), "--data-dir", str(tau2_dir / "domains" / "telecom"))
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr)
    assert "40 of 40 simulations agree." in proc.stdout


def test_analyze_counts_a_solo_agent_s_user_tools_as_its_own(
    tau2_dir: Path, tau2_telecom_results_file: Path, tmp_path: Path
) -> None:
    # The user's tools declared to the solo agent are not unknown tools: nothing the agent
    # experienced failed, so the proxy's budget curve is τ²-bench's at every k > 0.
    solo = tmp_path / "solo.json"
    solo_mode_file(tau2_telecom_results_file, solo)
    proc = _evalkit("analyze", str(solo), "--data-dir", str(tau2_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    run = json.loads(proc.stdout)
    assert run["experienced"] == {}
    curves = run["budget_curves"]
    assert [p["pass_rate"] for p in curves["proxy"]] == [p["pass_rate"] for p in curves["tau2"]]
    recorded = json.loads(tau2_telecom_results_file.read_text(encoding="utf-8"))["simulations"]
    rewards = [s["reward_info"]["reward"] for s in recorded]
    assert run["mean_reward"] == pytest.approx(sum(rewards) / len(rewards))


def test_an_assertion_naming_an_id_the_data_lacks_is_refused_without_a_traceback(
    tau2_dir: Path, tau2_telecom_results_file: Path, tmp_path: Path
) -> None:
    # The tasks are in the data and set up on it, but one assertion names a line it lacks:
    # the reward cannot come from this data, so nothing is scored.
    data = json.loads(tau2_telecom_results_file.read_text(encoding="utf-8"))
    ended = {s["task_id"] for s in data["simulations"] if s["termination_reason"] == "user_stop"}
    task = next(t for t in data["tasks"] if t["id"] in ended)
    task["evaluation_criteria"]["env_assertions"].append(
        {
            "env_type": "assistant",
            "func_name": "assert_line_status",
            "arguments": {"customer_id": "C9999", "line_id": "L9999", "expected_status": "Active"},
            "assert_value": True,
        }
    )
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(data), encoding="utf-8")
    proc = _evalkit("rescore", str(tampered), "--data-dir", str(tau2_dir / "domains" / "telecom"))
    assert proc.returncode == WRONG_DATA, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert "--data-dir" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
