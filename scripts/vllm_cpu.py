"""Where the vLLM server of `scripts/vllm-cpu` is, for the Python that talks to it: the live tests
and the benchmarks both find it here (neither may import the other)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

VLLM_CPU = Path(__file__).resolve().parent / "vllm-cpu"


def find_vllm() -> tuple[str | None, str]:
    """The running vLLM's base URL (…/v1) from `$TOOLSENTRY_VLLM_URL` or `scripts/vllm-cpu status`,
    and, when there is none, why."""
    if url := os.environ.get("TOOLSENTRY_VLLM_URL"):
        return url.rstrip("/"), ""
    status = subprocess.run(
        [str(VLLM_CPU), "status"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if status.returncode == 0 and status.stdout.strip():
        return status.stdout.strip().splitlines()[-1].rstrip("/"), ""
    return None, status.stderr.strip() or f"scripts/vllm-cpu status exited {status.returncode}"
