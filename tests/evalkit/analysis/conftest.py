"""τ²-bench's real results files for the analysis tests (skipped with a reason when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest


def _results_file(tau2_dir: Path, name: str) -> Path:
    path = tau2_dir / "results" / name
    if not path.is_file():
        pytest.skip(f"τ²-bench results file missing: {path} (see shared/tau2/README.md)")
    return path


@pytest.fixture(scope="session")
def tau2_retail_results(tau2_dir: Path) -> Path:
    return _results_file(tau2_dir, "gpt-4.1_retail_1trial.json")


@pytest.fixture(scope="session")
def tau2_telecom_results(tau2_dir: Path) -> Path:
    return _results_file(tau2_dir, "gpt-4.1_telecom_1trial.json")
