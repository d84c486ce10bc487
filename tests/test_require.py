"""A missing real component skips outside CI and fails under it (tests/require.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.require import COMPONENTS, required_components

REPO = Path(__file__).resolve().parents[1]

NEEDS_REDIS = """
from tests.require import require

def test_needs_redis():
    require("redis", "redis-server is not installed: apt-get install redis-server")
"""

PLAIN_SKIP = """
import pytest

@pytest.mark.skipif(True, reason="no widget here: install widget")
def test_skipped_by_a_mark():
    pass
"""

NEEDS_MARK = """
from tests.require import needs

@needs("chromium", "chromium is not installed: apt-get install chromium")
def test_marked():
    pass

@needs("chromium", None)
def test_marked_present():
    pass
"""


def run_pytest(tmp_path: Path, source: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `source` as a test file in a pytest of its own, with only the require plugin loaded."""
    (tmp_path / "test_sample.py").write_text(source, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n", encoding="utf-8"
    )
    environ = {k: v for k, v in os.environ.items() if k not in {"CI", "TOOLSENTRY_REQUIRE"}}
    environ.update(env, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.require", "-p", "no:cacheprovider", "-rA"],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_missing_component_skips_with_its_reason_outside_ci(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, NEEDS_REDIS)
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout
    assert "apt-get install redis-server" in result.stdout


@pytest.mark.parametrize("env", [{"CI": "true"}, {"TOOLSENTRY_REQUIRE": "chromium,redis"}])
def test_a_required_missing_component_fails_with_the_same_reason(
    tmp_path: Path, env: dict[str, str]
) -> None:
    result = run_pytest(tmp_path, NEEDS_REDIS, **env)
    assert result.returncode == 1, result.stdout
    assert "1 failed" in result.stdout
    assert "required component redis is missing" in result.stdout
    assert "apt-get install redis-server" in result.stdout


def test_a_component_not_named_in_toolsentry_require_still_skips(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, NEEDS_REDIS, TOOLSENTRY_REQUIRE="chromium")
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout


def test_the_needs_mark_skips_or_fails_only_where_the_component_is_missing(
    tmp_path: Path,
) -> None:
    outside = run_pytest(tmp_path, NEEDS_MARK)
    assert "1 passed, 1 skipped" in outside.stdout, outside.stdout
    required = run_pytest(tmp_path, NEEDS_MARK, TOOLSENTRY_REQUIRE="chromium")
    assert "1 passed, 1 error" in required.stdout, required.stdout  # it fails in set-up
    assert "apt-get install chromium" in required.stdout


def test_under_ci_any_skip_fails_with_its_reason(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, PLAIN_SKIP, CI="true")
    assert result.returncode == 1, result.stdout
    assert "skipped under CI=true" in result.stdout
    assert "no widget here: install widget" in result.stdout


def test_under_ci_a_module_level_skip_fails_too(tmp_path: Path) -> None:
    source = 'import pytest\npytest.importorskip("no_such_module_here", reason="pip install it")\n'
    result = run_pytest(tmp_path, source, CI="true")
    assert result.returncode != 0, result.stdout
    assert "skipped under CI=true" in result.stdout
    assert "pip install it" in result.stdout


def test_the_required_set_is_every_component_under_ci_and_the_named_ones_otherwise() -> None:
    assert required_components({"CI": "true"}) == COMPONENTS
    assert required_components({"CI": "false"}) == frozenset()
    assert required_components({"TOOLSENTRY_REQUIRE": " redis , tau2"}) == {"redis", "tau2"}
    assert required_components({"TOOLSENTRY_REQUIRE": "all"}) == COMPONENTS


def test_a_misspelt_component_in_toolsentry_require_stops_the_run(tmp_path: Path) -> None:
    with pytest.raises(pytest.UsageError, match="redsi"):
        required_components({"TOOLSENTRY_REQUIRE": "redsi"})
    result = run_pytest(tmp_path, NEEDS_REDIS, TOOLSENTRY_REQUIRE="redsi")
    assert result.returncode == 4, result.stdout + result.stderr
    assert "redsi" in result.stderr
