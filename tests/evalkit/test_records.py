"""`rescore` and `analyze` on hand-made inconsistent results files: each says why the records
disagree, and rescore's exit status tells real disagreements (1) from inconsistent records (3)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from evalkit.cli import app
from evalkit.formats import parse_results
from evalkit.records import Problem, check_records, task_differences

runner = CliRunner()


@pytest.fixture(scope="module")
def recorded(tau2_results_file: Path) -> dict[str, Any]:
    """τ²-bench's gpt-4.1 retail run, whose records are consistent."""
    data: dict[str, Any] = json.loads(tau2_results_file.read_text(encoding="utf-8"))
    return data


def rescored(
    data: dict[str, Any], tmp_path: Path, tau2_dir: Path, *options: str
) -> tuple[int, str]:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    retail = str(tau2_dir / "domains" / "retail")
    result = runner.invoke(app, ["rescore", str(path), "--data-dir", retail, *options])
    return result.exit_code, result.output


def first_two(data: dict[str, Any]) -> dict[str, Any]:
    """The file with only its first two simulations (rescoring all 40 is slow)."""
    out = copy.deepcopy(data)
    out["simulations"] = out["simulations"][:2]
    return out


def test_consistent_records_agree_and_exit_0(
    recorded: dict[str, Any], tmp_path: Path, tau2_dir: Path
) -> None:
    status, output = rescored(first_two(recorded), tmp_path, tau2_dir)
    assert status == 0, output
    assert "2 of 2 simulations agree." in output


def test_swapped_task_ids_are_explained_and_exit_3(
    recorded: dict[str, Any], tmp_path: Path, tau2_dir: Path
) -> None:
    data = first_two(recorded)
    a, b = data["simulations"]
    a["task_id"], b["task_id"] = b["task_id"], a["task_id"]
    status, output = rescored(data, tmp_path, tau2_dir, "--json")
    assert status == 3, output
    report = json.loads(output)
    problems = {(i["task_id"], i["problem"]) for i in report["issues"]}
    assert (a["task_id"], "other_tasks_actions") in problems
    assert (b["task_id"], "other_tasks_actions") in problems
    detail = next(i["detail"] for i in report["issues"] if i["task_id"] == a["task_id"])
    assert f"checks the actions of task {b['task_id']}, not those of task {a['task_id']}" in detail
    assert all("explained_by" in d for d in report["disagree"])


def test_an_unknown_action_id_is_named_and_exits_3(
    recorded: dict[str, Any], tmp_path: Path, tau2_dir: Path
) -> None:
    data = first_two(recorded)
    data["simulations"][0]["reward_info"]["action_checks"][0]["action"]["action_id"] = "999_0"
    status, output = rescored(data, tmp_path, tau2_dir)
    assert status == 3, output
    assert "action id(s) 999_0 belong to no task in the data" in output
    assert "1 of 2 simulations: an action id of no task in the data." in output


def test_a_changed_task_text_says_which_fields_differ(
    recorded: dict[str, Any], tmp_path: Path, tau2_dir: Path
) -> None:
    data = first_two(recorded)
    task_id = data["simulations"][0]["task_id"]
    task = next(t for t in data["tasks"] if t["id"] == task_id)
    # Another version of the task: its gold action changes the order another way.
    task["evaluation_criteria"]["actions"][-1]["arguments"]["order_id"] = "#W0000000"
    status, output = rescored(data, tmp_path, tau2_dir, "--json")
    assert status == 3, output
    report = json.loads(output)
    (disagreement,) = report["disagree"]
    assert disagreement["explained_by"] == ["task_differs"]
    detail = next(
        i["detail"]
        for i in report["issues"]
        if i["task_id"] == task_id and i["problem"] == "task_differs"
    )
    assert "evaluation_criteria.actions" in detail


def test_a_simulation_without_messages_is_inconsistent(
    recorded: dict[str, Any], tmp_path: Path, tau2_dir: Path
) -> None:
    data = first_two(recorded)
    data["simulations"][1]["messages"] = []
    status, output = rescored(data, tmp_path, tau2_dir)
    assert status == 3, output
    assert "the simulation has no messages" in output


def test_a_tampered_reward_is_a_real_disagreement_and_exits_1(
    recorded: dict[str, Any], tmp_path: Path, tau2_dir: Path
) -> None:
    data = first_two(recorded)
    data["tasks"] = [t for t in data["tasks"] if t["id"] == data["simulations"][0]["task_id"]]
    info = data["simulations"][0]["reward_info"]
    info["db_check"]["db_reward"] = 1.0 - info["db_check"]["db_reward"]
    status, output = rescored(data, tmp_path, tau2_dir)
    assert status == 1, output
    assert "DISAGREE" in output
    assert "1 disagree for no reason the records give" in output


@pytest.mark.parametrize("cut", [10_000, 1])
def test_a_corrupt_or_truncated_file_names_file_and_position_and_exits_2(
    tau2_results_file: Path, tmp_path: Path, cut: int
) -> None:
    broken = tmp_path / "cut.json"
    broken.write_bytes(tau2_results_file.read_bytes()[:cut])
    result = runner.invoke(app, ["rescore", str(broken)])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "cut.json: corrupt JSON at line" in text
    assert f"of {cut})" in text
    assert "Traceback" not in result.output


def test_analyze_warns_on_the_same_conditions(
    recorded: dict[str, Any], tmp_path: Path, tau2_dir: Path
) -> None:
    data = first_two(recorded)
    a, b = data["simulations"]
    a["task_id"], b["task_id"] = b["task_id"], a["task_id"]
    path = tmp_path / "swapped.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    result = runner.invoke(
        app, ["analyze", str(path), "--data-dir", str(tau2_dir), "--resamples", "200"]
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "warning: 2 of 2 simulations: reward_info checks another task's actions" in text


def test_task_differences_are_field_by_field(recorded: dict[str, Any]) -> None:
    results = parse_results(first_two(recorded))
    task = results.tasks[0]
    changed = task.model_copy(update={"description": {"purpose": "another"}})
    assert task_differences(task, task) == []
    assert task_differences(task, changed) == ["description.purpose"]
    issues = check_records(results, [changed, *results.tasks[1:]])
    assert [i.problem for i in issues] == [Problem.TASK_DIFFERS] * sum(
        1 for s in results.simulations if s.task_id == task.id
    )
