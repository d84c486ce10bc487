"""`python -m bench.scale --quick` end to end (bench/scale/, bench/openloop.py), run as the
program it is (tests and benchmarks never import each other): every point measured, every
session count exact, the open loop's schedule kept whole. No timing is asserted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REDIS_MISSING
from tests.require import require

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One `--quick` run on the memory and Redis stores (about a minute), its figures."""
    tmp_path = tmp_path_factory.mktemp("scale")
    if shutil.which("redis-server") is None:
        require("redis", REDIS_MISSING)
    if shutil.which("wrk") is None:
        require("wrk", "wrk is not installed: apt-get install wrk (scripts/system-deps)")
    out = tmp_path / "scale.json"
    quick = ["--quick", "--stores", "memory,redis", "--no-write", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.scale", *quick],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result


@pytest.mark.slow
@pytest.mark.redis
def test_the_quick_scale_run_measures_every_point_with_exact_session_counts(
    quick_run: dict[str, Any],
) -> None:
    result = quick_run
    counts = result["worker_counts"]
    assert counts[0] == 1
    assert counts[-1] <= len(os.sched_getaffinity(0))
    measured = {(p["target"], p["store"], p["workers"]): p for p in result["points"]}
    expected = {("direct", "", 0), ("pass-aiohttp", "", 1), ("toolsentry", "memory", 1)}
    expected |= {("toolsentry", "redis", w) for w in counts[:2]}
    assert expected <= set(measured)
    for key in expected:
        (round_,) = measured[key]["rounds"]
        assert round_["requests"] > 0, key
        if key[0] == "toolsentry":
            assert round_["count_ok"], (key, round_["count_detail"])
    redis_one = measured["toolsentry", "redis", 1]
    assert redis_one["rounds"][0]["commands"] > 0
    assert redis_one["sent_per_request"] > 0


@pytest.mark.slow
@pytest.mark.redis
def test_the_open_loop_sends_its_whole_schedule_to_direct_and_the_proxy_alike(
    quick_run: dict[str, Any],
) -> None:
    result = quick_run
    runs = [run for p in result["points"] for run in p["open_loop"]]
    assert runs
    for run in runs:
        for side in ("direct", "target"):
            figures = run[side]
            # The schedule: rate × seconds requests, each answered or counted as cut.
            assert figures["scheduled"] == round(run["rate"] * figures["seconds"])
            assert figures["answered"] + figures["unanswered"] == figures["scheduled"]
        assert run["target"]["count_ok"], run["target"]["count_detail"]
