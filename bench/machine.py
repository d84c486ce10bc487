"""What every results file says about the machine it was measured on."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
from pathlib import Path


def load_average() -> str:
    """The 1, 5 and 15 minute load averages as `/proc/loadavg` has them, or "unknown"."""
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "unknown"


def machine() -> str:
    """CPUs, CPU model, Python and kernel in one line."""
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} CPUs (`nproc`), {model}, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def cpu_seconds() -> float:
    """User + system CPU time of this process (every thread) so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
