"""A small soak (tests/proxy/system/soak.py, which `python -m bench.soak` runs at full size) at
1,000 requests, concurrency 20, half of each kind streamed: a proxy process in front of a
scripted upstream process keeps every count equal to the scripted truth, for JSON and streamed
answers alike, and its memory flat."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.proxy.system.soak import run_soak

MIB = 1024


@pytest.mark.slow
def test_a_thousand_mixed_streamed_and_json_requests_keep_exact_counts_and_flat_memory(
    tmp_path: Path,
) -> None:
    report = run_soak(1000, 20, workdir=tmp_path)
    assert report.mismatches == []
    assert report.statuses == {200: 1000}
    assert report.sent == {"valid": 600, "repairable": 250, "unrepairable": 150}
    assert report.streamed == {"valid": 300, "repairable": 125, "unrepairable": 75}
    # Memory, not time: a per-request leak would show as growth over the second half.
    assert report.rss_kib[-1][1] - report.rss_at(0.5) < 16 * MIB


@pytest.mark.slow
@pytest.mark.redis
def test_the_soak_keeps_exact_counts_on_redis(tmp_path: Path, redis_url: str) -> None:
    report = run_soak(500, 20, store=redis_url, workdir=tmp_path)
    assert report.mismatches == []
    assert report.statuses == {200: 500}
