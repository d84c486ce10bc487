"""One measurement: `replay`'s screen and `summary.md`, `analyze` and `report` print the same
figures for the same results files — for runs whose agent leaked tool calls into its text and sent
empty answers, the failures that τ²-bench's count does not see and the proxy's does."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from evalkit.analysis.budget import Budget
from evalkit.analysis.figure_tables import pct
from evalkit.cli import app
from evalkit.replay import Replay, ReplayOptions, execute, proxy_in_front
from evalkit.summary import summarize_replay
from tests.evalkit.conftest import Reply, ScriptedChatServer, completion

runner = CliRunner()

LEAKY = """\
name: leaky
unknown_tool: 0.1
malformed_arguments: 0.02
schema_violation: 0.03
leaked_tool_call: 0.25
recover: 0.7
give_up: 0.1
reask_fix: 0.75
policy_error: 0.1
"""


def analyze_json(path: Path) -> dict[str, Any]:
    result = runner.invoke(app, ["analyze", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.output)
    return data


def markdown_rows(text: str, title: str) -> dict[str, list[str]]:
    """The rows of the Markdown table under the heading `title`, by their first cell."""
    section = text.split(f" {title}\n", 1)[1]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        if line.startswith("#"):
            break
        if line.startswith("| ") and "---" not in line:
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows.setdefault(cells[0], cells[1:])
    return rows


def test_replay_summary_analyze_and_report_agree_figure_for_figure(tmp_path: Path) -> None:
    profile = tmp_path / "leaky.yaml"
    profile.write_text(LEAKY, encoding="utf-8")
    out = tmp_path / "run"
    replayed = runner.invoke(
        app,
        [
            *("replay", "--tasks", "0,1,2,3,4,5", "--profile", f"bf16,{profile}"),
            *("--repair", "off", "--out", str(out), "--seed", "4", "--max-errors", "4"),
        ],
    )
    assert replayed.exit_code == 0, replayed.output
    summary = (out / "summary.md").read_text(encoding="utf-8")
    files = {arm: out / arm / "results.json" for arm in ("bf16", "leaky")}
    analysed = {arm: analyze_json(path) for arm, path in files.items()}
    leaky = analysed["leaky"]
    # The case that disagreed: failures τ²-bench's count does not see.
    assert leaky["experienced"].get("leaked_tool_call", 0) > 0
    assert sum(e["experienced"] for e in leaky["per_episode"]) > leaky["errors"]
    curves = leaky["budget_curves"]
    # The two budgets' curves part at k = 2 here, so the headline below shows which one it quotes.
    assert curves["tau2"][2]["pass_rate"] != curves["proxy"][2]["pass_rate"]

    report = tmp_path / "report.html"
    reported = runner.invoke(
        app, ["report", str(files["bf16"]), str(files["leaky"]), "-o", str(report)]
    )
    assert reported.exit_code == 0, reported.output
    report_md = report.with_suffix(".md").read_text(encoding="utf-8")

    for budget in Budget:
        title = next(
            line.removeprefix("## ")
            for line in summary.splitlines()
            if line.startswith(f"## Budget curve: {budget.label}")
        )
        in_summary = markdown_rows(summary, title)
        in_report = markdown_rows(report_md, title)
        for arm, data in analysed.items():
            curve = [pct(p["pass_rate"]) for p in data["budget_curves"][budget.value]]
            assert in_summary[arm] == curve, (budget, arm)
            # The report has a row per k: "<arm's figure> [low, high]" or "<figure> (no spread)" in the arm's column.
            column = list(analysed).index(arm)
            from_report = [in_report[str(k)][column].split(" ")[0] for k in range(len(curve))]
            assert from_report == curve, (budget, arm)
    # The headline quotes the proxy's curve (the budget the replay ran under), as analyze has it.
    assert leaky["budget"] == "proxy"
    headline = re.search(
        r"leaky against bf16: ([\d.]+)% vs ([\d.]+)% at max_errors 4 .*?; "
        r"([\d.]+)% vs ([\d.]+)% at max_errors 2",
        summary,
    )
    assert headline is not None, summary
    at = {arm: [pct(p["pass_rate"]) for p in d["budget_curve"]] for arm, d in analysed.items()}
    assert headline.groups() == (at["leaky"][4], at["bf16"][4], at["leaky"][2], at["bf16"][2])
    # Mean reward, failures per episode and repairs: the Runs table of both.
    runs_summary, runs_report = markdown_rows(summary, "Runs"), markdown_rows(report_md, "Runs")
    for arm, data in analysed.items():
        assert runs_summary[arm][1] == pct(data["mean_reward"]) == runs_report[arm][1]
        assert runs_summary[arm] == runs_report[arm]
    # The screen prints the same rows.
    screen = " ".join(replayed.output.split())
    assert f"leaky {' '.join(at['leaky'])}" in screen


@pytest.fixture
def proxied(chat_server: ScriptedChatServer) -> Iterator[str]:
    """The real proxy in front of the scripted chat server."""
    with proxy_in_front(chat_server.base_url, max_errors=3, name="scripted") as base_url:
        yield base_url


LEAKED = '<tool_call>{"name": "get_user_details", "arguments": {"user_id": "x"}}</tool_call>'


async def test_an_episode_with_leaked_calls_and_an_empty_answer_is_counted_once_everywhere(
    chat_server: ScriptedChatServer, proxied: str, tmp_path: Path
) -> None:
    chat_server.replies = [
        # Task 0: a leaked call, a made-up tool, then the episode goes on.
        Reply(completion(LEAKED)),
        Reply(completion(None, [("c1", "get_weather", "{}")])),
        Reply(completion("Is there anything else?")),
        # Task 1: an empty answer, which ends the episode.
        Reply(completion("")),
    ]
    options = ReplayOptions(
        domain="retail",
        base_url=proxied,
        model="scripted",
        repairs=("off",),
        tasks="0,1",
        concurrency=1,
        max_errors=3,
    )
    replay = Replay.start(options, tmp_path / "run")
    await execute(replay)
    (run,) = summarize_replay(replay)
    data = analyze_json(replay.runs[replay.arms[0].name].path)
    assert run.to_dict()["budget_curves"] == data["budget_curves"]
    assert run.to_dict()["experienced"] == data["experienced"]
    assert data["experienced"]["leaked_tool_call"] == 1
    assert data["experienced"]["unknown_tool"] == 1
    # The empty answer ended its episode before it reached the trajectory; the proxy counted it.
    assert data["proxy"]["channels"].get("empty_response") == 1
    assert data["termination_reasons"].get("agent_error") == 1
    # τ²-bench's count sees the one tool error; the proxy's budget the leaked call too.
    first = next(e for e in data["per_episode"] if e["task_id"] == "0")
    assert (first["errors"], first["experienced"]) == (1, 2)
