"""Ending the child processes the tests start (servers, the proxy), also when they hang."""

from __future__ import annotations

import subprocess
from typing import Any


def stop_process(process: subprocess.Popen[Any], timeout: float) -> None:
    """Terminate `process` (when still running) and wait up to `timeout` seconds for it to end,
    then kill it. Its pipes are read to the end, so a full pipe cannot keep it alive."""
    process.terminate()
    try:
        process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
