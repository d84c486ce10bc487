"""Every τ²-bench results file in the reference data (../shared/tau2/results or
$TAU2_DATA_DIR/results), and the older format of each — a leaderboard submission without
`task_id` and `termination_reason`, made here by dropping them, never stored in the repository —
through `rescore` and `analyze`, with and without `--data-dir`: a verdict or a named refusal,
never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from evalkit.cli import app
from evalkit.formats import OLDER_FORMAT_FIELDS, UNKNOWN_TASK_PREFIX, read_results

# rescore: 0 agree, 1 unexplained, 3 explained by the records, 2 unusable, 6 other data
RESCORE_STATUSES = {0, 1, 2, 3, 6}


def _files(tau2_dir: Path) -> list[Path]:
    files = sorted((tau2_dir / "results").glob("*.json"))
    assert files, f"no results files in {tau2_dir / 'results'}"
    return files


def _older(path: Path, into: Path) -> Path:
    """`path` as an older τ²-bench format: its simulations without the fields it lacked."""
    data = json.loads(path.read_text())
    for simulation in data["simulations"]:
        for field in OLDER_FORMAT_FIELDS:
            simulation.pop(field, None)
    older = into / f"older-{path.name}"
    older.write_text(json.dumps(data))
    return older


def _invoke(*args: str) -> Result:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    return result


def _domain(path: Path) -> str:
    return str(read_results(path).info["environment_info"]["domain_name"])


def test_every_results_file_is_rescored_or_refused_by_name(tau2_dir: Path) -> None:
    for path in _files(tau2_dir):
        for extra in ([], ["--data-dir", str(tau2_dir / "domains" / _domain(path))]):
            result = _invoke("rescore", str(path), *extra)
            assert result.exit_code in RESCORE_STATUSES, (path, extra, result.output)
            if not extra and result.exit_code == 6:
                assert "--data-dir" in result.output


def test_every_results_file_and_its_older_format_is_analysed(
    tau2_dir: Path, tmp_path: Path
) -> None:
    for path in _files(tau2_dir):
        older = _older(path, tmp_path)
        for extra in ([], ["--data-dir", str(tau2_dir)]):
            curves = []
            for file in (path, older):
                result = _invoke("analyze", str(file), "--json", "--resamples", "200", *extra)
                assert result.exit_code == 0, (file, extra, result.output)
                run = json.loads(result.output)
                curves.append(run["budget_curves"]["tau2"])
                if file is older:
                    assert any("older τ²-bench format" in w for w in run["warnings"])
                    assert run["channels"]
            # The budget curve needs neither field: the older file's is the complete file's.
            assert [p["pass_rate"] for p in curves[0]] == [p["pass_rate"] for p in curves[1]]


def test_an_older_format_is_read_with_a_note_and_refused_by_rescore(
    tau2_dir: Path, tmp_path: Path
) -> None:
    older = _older(_files(tau2_dir)[0], tmp_path)
    results = read_results(older)
    n = len(results.simulations)
    assert results.missing == dict.fromkeys(OLDER_FORMAT_FIELDS, n)
    assert all(s.task_id.startswith(UNKNOWN_TASK_PREFIX) for s in results.simulations)
    note = results.missing_note()
    assert note is not None
    assert f"task_id ({n} of {n})" in note
    result = _invoke("rescore", str(older))
    assert result.exit_code == 2
    assert "older τ²-bench format without task_id" in result.output
    assert "evalkit analyze" in result.output


def test_a_complete_file_has_nothing_missing(tau2_dir: Path) -> None:
    results = read_results(_files(tau2_dir)[0])
    assert results.missing == {}
    assert results.missing_note() is None


@pytest.mark.parametrize("field", OLDER_FORMAT_FIELDS)
def test_a_file_missing_one_field_in_some_simulations_counts_them(
    tau2_dir: Path, tmp_path: Path, field: str
) -> None:
    data = json.loads(_files(tau2_dir)[0].read_text())
    del data["simulations"][0][field]
    path = tmp_path / "partial.json"
    path.write_text(json.dumps(data))
    assert read_results(path).missing == {field: 1}
