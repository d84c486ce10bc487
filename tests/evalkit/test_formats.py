"""Results files round-trip, read τ²-bench's own, write atomically, and fail with a position."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evalkit.agent import OracleAgent
from evalkit.domains.base import Domain
from evalkit.errors import ResultsFileError
from evalkit.formats import (
    Results,
    make_info,
    read_results,
    results_to_dict,
    toolsentry_block,
    write_results,
)
from evalkit.messages import AssistantMessage, ToolMessage
from evalkit.orchestrator import run_episode
from evalkit.scoring import evaluate
from evalkit.users import ScriptedUser


def test_tau2_results_file_round_trips_without_loss(
    tau2_results_file: Path, tmp_path: Path
) -> None:
    original = json.loads(tau2_results_file.read_text())
    results = read_results(tau2_results_file)
    assert len(results.simulations) == 40
    assert results.simulations[0].messages[4].tool_calls  # type: ignore[union-attr]
    out = write_results(tmp_path / "copy.json", results)
    assert json.loads(out.read_text()) == original


async def test_our_results_round_trip_with_the_toolsentry_block(
    retail: Domain, tmp_path: Path
) -> None:
    task = retail.tasks[0]
    sim = await run_episode(retail, task, OracleAgent(task), ScriptedUser(task), seed=3)
    sim.reward_info = evaluate(retail, task, sim.messages, sim.termination_reason)
    results = Results(
        info=make_info(
            domain="retail",
            policy=retail.policy,
            agent={"implementation": "oracle"},
            user={"implementation": "scripted"},
            num_trials=1,
            max_steps=200,
            max_errors=10,
        ),
        tasks=[task],
        simulations=[sim],
    )
    path = write_results(tmp_path / "run.json", results)
    again = read_results(path)
    assert results_to_dict(again) == json.loads(path.read_text())
    loaded = again.simulations[0]
    assert loaded.reward_info is not None
    assert loaded.reward_info.reward == 1.0
    assert loaded.toolsentry is not None
    assert loaded.toolsentry["tool_errors"] == 0
    assert loaded.seed == 3
    assert [m.role for m in loaded.messages] == [m.role for m in sim.messages]


def test_toolsentry_block_sums_channels_and_keeps_last_counters() -> None:
    messages = [
        AssistantMessage(
            content="a",
            turn_idx=1,
            proxy_headers={
                "x-toolsentry-violations": "unknown_tool,schema_violation",
                "x-toolsentry-errors": "1",
                "x-toolsentry-repairs": "0",
                "x-toolsentry-max-errors": "10",
                "x-toolsentry-session": "s1",
            },
        ),
        ToolMessage(id="c", content="Error: x", error=True),
        AssistantMessage(
            content="b",
            turn_idx=3,
            proxy_headers={"x-toolsentry-violations": "unknown_tool", "x-toolsentry-errors": "2"},
        ),
        AssistantMessage(content="no proxy"),
    ]
    block = toolsentry_block(messages)
    assert block["channels"] == {"unknown_tool": 2, "schema_violation": 1}
    assert block["errors"] == 2
    assert block["repairs"] == 0
    assert block["max_errors"] == 10
    assert block["session"] == "s1"
    assert [t["turn_idx"] for t in block["turns"]] == [1, 3]
    assert block["tool_errors"] == 1


def test_truncated_file_names_the_file_and_position(
    tau2_results_file: Path, tmp_path: Path
) -> None:
    cut = tmp_path / "cut.json"
    cut.write_bytes(tau2_results_file.read_bytes()[:50_000])
    with pytest.raises(ResultsFileError) as info:
        read_results(cut)
    message = info.value.message
    assert str(cut) in message
    assert "line " in message
    assert "column " in message
    assert "truncated" in message
    assert info.value.exit_code == 4


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", "empty file"),
        ("[1, 2]", "expected a JSON object"),
        ('{"simulations": [{"id": "x"}]}', "at simulations.0.task_id"),
        ('{"simulations": [], "tasks": [1]}', "at tasks.0"),
        ("{}", "no simulations list"),
        ('{"info": {"num_trials": 1}}', "no simulations list"),
    ],
)
def test_files_that_are_not_results_say_where(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ResultsFileError, match=expected):
        read_results(path)


def test_missing_file_is_a_results_file_error(tmp_path: Path) -> None:
    with pytest.raises(ResultsFileError, match="no such results file"):
        read_results(tmp_path / "absent.json")


def test_write_replaces_atomically_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "out" / "run.json"
    write_results(path, Results())
    write_results(path, {"info": {"n": 2}, "tasks": [], "simulations": []})
    assert json.loads(path.read_text())["info"] == {"n": 2}
    assert [p.name for p in path.parent.iterdir()] == ["run.json"]


def test_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    write_results(path, {"info": {"n": 1}})
    with pytest.raises(TypeError):
        write_results(path, {"info": {"n": object()}})
    assert json.loads(path.read_text()) == {"info": {"n": 1}}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


@pytest.mark.parametrize("command", ["analyze", "rescore"])
def test_a_file_without_simulations_is_refused_by_the_cli(tmp_path: Path, command: str) -> None:
    path = tmp_path / "empty.json"
    path.write_text("{}")
    proc = subprocess.run(
        [sys.executable, "-m", "evalkit.cli", command, str(path)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == (4 if command == "analyze" else 2), proc.stderr
    assert "no simulations list" in proc.stderr
    assert "Traceback" not in proc.stderr
