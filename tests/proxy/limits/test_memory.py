"""What a hostile upstream costs a real `toolsentry serve` in memory: its peak resident size
(`VmHWM` in /proc) stays within a bound while its answers are capped (`max_response_bytes`).

The bound is loose (48 MB) and the attacks well past it (a gzip bomb that decodes to 128 MB, a
32 MB body): without the caps the peak grows by at least the attack's decoded size.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from proxy.testing import LoopbackServer
from tests.processes import served_with
from tests.proxy.limits.hostile import MB, Hostile

REPO = Path(__file__).resolve().parents[3]
BOUND = 48 * MB


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Hostile, str, int]]:
    script = Hostile()
    with LoopbackServer(script.app) as upstream:
        limits = {"max_response_bytes": MB, "max_stream_bytes": MB}
        upstreams = [{"name": "hostile", "base_url": f"{upstream.url}/v1", **limits}]
        with served_with({"upstreams": upstreams, "retries": 0}, tmp_path) as (port, pid):
            yield script, f"http://127.0.0.1:{port}", pid


def test_a_gzip_bomb_and_a_huge_body_leave_the_peak_memory_within_a_bound(
    served: tuple[Hostile, str, int],
) -> None:
    script, url, pid = served
    request = {"model": "hostile", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=url, timeout=60) as http:
        script.mode = "small_gzip"
        assert http.post("/v1/chat/completions", json=request).status_code == 200
        before = status_kb(pid, "VmHWM")
        for mode, size in [("bomb", 128 * MB), ("big", 32 * MB), ("big_error", 32 * MB)]:
            script.mode, script.size = mode, size
            response = http.post("/v1/chat/completions", json=request)
            assert response.status_code == 502, response.text[:300]
        grown = status_kb(pid, "VmHWM") - before
    assert grown < BOUND, f"the peak grew by {grown / MB:.0f} MB"
