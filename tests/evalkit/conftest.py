"""Shared fixtures: τ²-bench's reference data (skipped with a reason when absent) and domains."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evalkit.domains import get_domain
from evalkit.domains.base import Domain

REPO = Path(__file__).resolve().parents[2]


def _tau2_dir() -> Path | None:
    configured = os.environ.get("TAU2_DATA_DIR")
    candidates = [Path(configured)] if configured else []
    candidates.append(REPO.parent / "shared" / "tau2")
    for candidate in candidates:
        if (candidate / "domains" / "retail" / "db.json").is_file():
            return candidate
    return None


@pytest.fixture(scope="session")
def tau2_dir() -> Path:
    found = _tau2_dir()
    if found is None:
        pytest.skip(
            "τ²-bench reference data not found: put it at ../shared/tau2 next to the repository "
            "or point TAU2_DATA_DIR at a directory holding domains/retail and results/"
        )
    return found


@pytest.fixture(scope="session")
def tau2_retail(tau2_dir: Path) -> Domain:
    return get_domain("retail", tau2_dir / "domains" / "retail")


@pytest.fixture(scope="session")
def tau2_results_file(tau2_dir: Path) -> Path:
    path = tau2_dir / "results" / "gpt-4.1_retail_1trial.json"
    if not path.is_file():
        pytest.skip(f"τ²-bench results file missing: {path}")
    return path


@pytest.fixture(scope="session")
def retail() -> Domain:
    return get_domain("retail")
