"""`evalkit rescore` prints agreement and turns bad input into a message and an exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from evalkit.cli import app

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_rescore_json_reports_full_agreement(tau2_results_file: Path, tau2_dir: Path) -> None:
    result = runner.invoke(
        app,
        [
            "rescore",
            str(tau2_results_file),
            "--data-dir",
            str(tau2_dir / "domains" / "retail"),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["simulations"], report["agree"], report["disagree"]) == (40, 40, [])
    # The file embeds an older version of the tasks (without NL assertions) than the data's:
    # a note per simulation, which explains nothing here since everything agrees.
    assert report["status"] == 0
    assert {i["problem"] for i in report["issues"]} == {"task_differs"}
    assert "evaluation_criteria.reward_basis" in report["issues"][0]["detail"]


def test_rescore_table_marks_each_simulation(tau2_results_file: Path, tau2_dir: Path) -> None:
    result = runner.invoke(
        app,
        ["rescore", str(tau2_results_file), "--data-dir", str(tau2_dir / "domains" / "retail")],
    )
    assert result.exit_code == 0, result.output
    assert result.output.count("agree") >= 40
    assert "40 of 40 simulations agree." in result.output


def test_truncated_file_exits_2_with_a_message_and_no_traceback(
    tau2_results_file: Path, tmp_path: Path
) -> None:
    cut = tmp_path / "cut.json"
    cut.write_bytes(tau2_results_file.read_bytes()[:10_000])
    result = runner.invoke(app, ["rescore", str(cut)])
    assert result.exit_code == 2
    assert "corrupt JSON at line" in result.output
    assert "cut.json" in result.output
    assert "Traceback" not in result.output


def test_unknown_domain_exits_2_listing_valid_ones(tau2_results_file: Path) -> None:
    result = runner.invoke(app, ["rescore", str(tau2_results_file), "--domain", "airline"])
    assert result.exit_code == 2
    assert "valid domains: retail" in result.output


def test_the_module_runs_as_a_program_and_reports_errors_on_stderr(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"info": {}, "simulations": [')
    proc = subprocess.run(
        [sys.executable, "-m", "evalkit.cli", "rescore", str(broken)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert "broken.json" in proc.stderr
    assert "truncated" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_rescore_of_a_tau2_telecom_file_reports_full_agreement(tau2_dir: Path) -> None:
    results = tau2_dir / "results" / "gpt-4.1_telecom_1trial.json"
    result = runner.invoke(
        app,
        ["rescore", str(results), "--data-dir", str(tau2_dir / "domains" / "telecom"), "--json"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["simulations"], report["agree"], report["disagree"]) == (40, 40, [])
