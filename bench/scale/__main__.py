"""`python -m bench.scale`: see the package's docstring."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import bench.scale
from bench.drivers import have_wrk
from bench.machine import load_average, machine
from bench.processes import ROOT
from bench.scale.measure import measure
from bench.scale.report import BEGIN, END, NEW_FILE, as_json, section, show
from bench.scale.roles import roles_of
from bench.tables import console, write_section

RESULTS = ROOT / "bench" / "results" / "scale.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description=bench.scale.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration", type=float, default=3.0, help="seconds a round [3]")
    parser.add_argument("--rounds", type=int, default=3, help="rounds a point [3]")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds [2]")
    parser.add_argument(
        "--connections", type=int, default=256, help="wrk's and the open loop's [256]"
    )
    parser.add_argument(
        "--rates",
        default="auto",
        help="open-loop requests a second, comma-separated, or auto (see above) [auto]",
    )
    parser.add_argument(
        "--stores",
        type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
        default=["memory", "sqlite", "redis"],
        help="toolsentry's session stores measured [memory,sqlite,redis]",
    )
    parser.add_argument(
        "--monitor-requests", type=int, default=50, help="requests under MONITOR [50]"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round of 1 s, 1 rate")
    parser.add_argument("--no-write", action="store_true", help=f"do not update {RESULTS.name}")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    args = parser.parse_args(argv)
    if unknown := set(args.stores) - {"memory", "sqlite", "redis"}:
        parser.error(f"unknown store(s) {', '.join(sorted(unknown))}")
    if args.quick:
        args.duration, args.rounds, args.warmup = 1.0, 1, 1.0
        args.monitor_requests = min(args.monitor_requests, 20)
    if not have_wrk():
        console.print("[bold red]wrk is not installed[/] (scripts/system-deps)")
        return 2
    # With PYTHONDONTWRITEBYTECODE every worker compiles its imports and may miss uvicorn's
    # start-up check, to be replaced in a loop (seen on 16 cores): let the first write them.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    roles = roles_of(sorted(os.sched_getaffinity(0)))
    console.print(f"{machine()}\n{roles.describe()}; workers {roles.worker_counts()}")
    info: dict[str, Any] = {"load": load_average()}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="toolsentry-scale-") as tmp:
        outcomes = measure(args, roles, Path(tmp))
    info |= {"seconds": time.monotonic() - started, "load_end": load_average()}
    show(outcomes, roles, args)
    if args.json:
        args.json.write_text(json.dumps(as_json(outcomes, roles), indent=1))
    if not args.no_write and not args.quick:
        given = sys.argv[1:] if argv is None else argv
        n = len(roles.every)
        text = section(outcomes, roles, args, given, info)
        write_section(RESULTS, text, BEGIN.format(n=n), END.format(n=n), new=NEW_FILE)
        console.print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
