"""Soak: many requests through a real proxy process in front of a scripted upstream process, every
count checked against the scripted truth and the proxy's memory sampled throughout.

The soak is a correctness check as much as a measurement, so it lives with the tests
(tests/proxy/system/soak.py, which tests/proxy/system/test_soak.py runs small); this entry point
runs it as a program of its own, with the same arguments, so that bench/ and tests/ never import
each other.

    python -m bench.soak run [--requests 20000] [--concurrency 100] [--store memory]
                             [--results bench/RESULTS.md]
    python -m bench.soak upstream --port N     (the scripted upstream; used by `run`)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}
    program = [sys.executable, "-m", "tests.proxy.system.soak", *sys.argv[1:]]
    os.execve(sys.executable, program, env)


if __name__ == "__main__":
    main()
