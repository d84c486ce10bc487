"""What does toolsentry add to every agent call? Measured side by side against the floor and LiteLLM.

One run starts a canned upstream (bench/fake_upstream.py), then each target in front of it:

- `direct`        the upstream itself, no proxy;
- `toolsentry`    `python -m proxy.cli serve --upstream …` as shipped: validation on, repair by
                  re-ask on, memory session store, per-request log to a file;
- `toolsentry-shadow`
                  the same with shadow comparison on every request (`sample: 1.0`), the fake
                  upstream itself as the (fast) reference;
- `pass-aiohttp`, `pass-httpx`
                  bench/passthrough.py: Starlette forwarding the body with no logic (the floor is
                  the faster of the two);
- `litellm`       LiteLLM's proxy (`litellm --config …`), installed by this script into its own
                  virtualenv, one worker.

The requests (`--workloads`, bench/bodies.py) are one agent turn whose answer carries one valid
tool call, so toolsentry validates a call on every request: `chat`, `responses`, `messages` (a
retail turn with 17 τ²-bench-like tools, about 7 kB, on each wire protocol) and `chat-large`,
`messages-large` (a Claude-Code-sized turn, 24 tools, about 75 kB, on chat completions and on
Claude Code's own `/v1/messages?beta=true`). The baseline, the shadow arm, httpx and LiteLLM are
measured on `chat` only. Load comes
from `wrk` (a Lua script POSTs the body and prints percentiles); the time to first token comes
from bench/ttft.py. Each round first measures concurrency 1 (latency p50/p99; added = target −
direct of the same round): each target in turn runs every workload back to back, the workloads a
ratio goal compares next to each other, so that those ratios compare runs seconds apart. Then, for
each workload and target, concurrency 64 (requests/s and p99) and on the small bodies a streamed
request's time to first token. Target order rotates from round to round, the c1 workload order
reverses every other round. The latency ratio goals (Responses and Messages against chat on the
same body size) come from a measurement of their own, once a round: a small keep-alive client
sends one request to toolsentry and one to direct on each workload compared, in turn (the order
rotating), `--interleaved-requests` of each, so that the two workloads of a ratio are measured
milliseconds apart; its latencies include the client's own time (in direct's too, so not in
what is added). The shadow's throughput goal comes from a measurement of its own, once a round:
`toolsentry` and `toolsentry-shadow` both on the proxy's core at once, each under its own wrk at
concurrency 64, so that the core's speed, which drifts by a fifth from second to second on a
shared machine, is the same for both, and the ratio of their requests/s is the ratio of what a
request costs each (both are CPU-bound; each gets half the core). The proxies not being
measured are stopped (SIGSTOP) so an idle one cannot steal the core. The goals of the issues are
printed last, each as the median (min–max) over rounds of a figure computed round by round.

CPU placement (`taskset`): upstream and load generator share one core, the proxy under test has
the other to itself; on a one-core machine everything shares core 0. The medians over rounds are
reported, with ratios as the headline because the machine is shared and absolute numbers drift.

    python -m bench.overhead [--duration 4] [--rounds 2] [--only toolsentry,pass-aiohttp]
                             [--workloads chat,responses,…] [--baseline DIR_OR_COMMIT]
                             [--skip-litellm] [--profile] [--no-write]

The final table of the turn, Messages and shadow issues (about 10 minutes):

    python -m bench.overhead --only toolsentry,toolsentry-shadow,pass-aiohttp --baseline f869956 \
        --workloads chat,responses,messages,chat-large,messages-large --rounds 5 --duration 2 \
        --ttft-requests 100

Needs `wrk` (Debian/Ubuntu: `apt-get install -y wrk`). `--profile` also records py-spy flame
graphs of toolsentry and the aiohttp pass-through under concurrency 64 into bench/profiles/.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench.bodies import WORKLOADS
from bench.drivers import have_wrk
from bench.machine import load_average
from bench.overhead.measure import INTERLEAVED_REQUESTS, TTFT_REQUESTS, measure
from bench.overhead.report import REFACTOR_PARENT, section, show, write_results
from bench.overhead.targets import BASELINE, TARGETS
from bench.processes import ROOT
from bench.tables import console

RESULTS = ROOT / "bench" / "RESULTS.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.overhead", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--duration", type=float, default=4.0, help="seconds per wrk measurement [4]"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds in rotating order [2]")
    parser.add_argument(
        "--only",
        type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
        help=f"comma-separated targets among {', '.join(TARGETS)} (direct is always measured)",
    )
    parser.add_argument("--skip-litellm", action="store_true", help="do not install or run LiteLLM")
    parser.add_argument("--ttft-requests", type=int, default=TTFT_REQUESTS)
    parser.add_argument(
        "--interleaved-requests",
        type=int,
        default=INTERLEAVED_REQUESTS,
        help="requests to toolsentry and direct per workload and round for the latency ratio "
        f"goals, one to each in turn (0: none) [{INTERLEAVED_REQUESTS}]",
    )
    parser.add_argument(
        "--profile", action="store_true", help="py-spy flame graphs into bench/profiles/"
    )
    parser.add_argument("--profile-prefix", default="", help="file name prefix for --profile")
    parser.add_argument(
        "--baseline",
        metavar="DIR_OR_COMMIT",
        help="also measure the toolsentry of this checkout, or of this commit's proxy/ (git "
        f"archive), as '{BASELINE}', on the chat workload: before/after comparisons "
        f"(the commit before the turn refactor is {REFACTOR_PARENT})",
    )
    parser.add_argument(
        "--toolsentry-dir",
        type=Path,
        default=ROOT,
        help="the checkout whose toolsentry is measured as 'toolsentry' [this one]",
    )
    parser.add_argument(
        "--workloads",
        type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
        default=["chat"],
        help=f"comma-separated requests among {', '.join(WORKLOADS)} [chat]",
    )
    parser.add_argument("--no-write", action="store_true", help=f"do not update {RESULTS.name}")
    args = parser.parse_args(argv)
    unknown = set(args.only or ()) - set(TARGETS)
    if unknown:
        parser.error(
            f"unknown target(s) {', '.join(sorted(unknown))}; choose among {', '.join(TARGETS)}"
        )
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown or not args.workloads:
        parser.error(
            f"unknown workload(s) {', '.join(sorted(unknown))}; choose among {', '.join(WORKLOADS)}"
        )
    if not have_wrk():
        console.print(
            "[bold red]wrk is not installed.[/] It generates the load. Debian/Ubuntu: "
            "`apt-get install -y wrk`; macOS: `brew install wrk`."
        )
        return 2
    started = time.monotonic()
    results, info = measure(args)
    info.update(
        duration=args.duration,
        rounds=args.rounds,
        load_end=load_average(),
        seconds=time.monotonic() - started,
    )
    show(results, info)
    console.print(f"[dim]{info['seconds']:.0f} s; load average at the end {info['load_end']}[/]")
    if not args.no_write:
        given = sys.argv[1:] if argv is None else argv
        write_results(RESULTS, section(results, info, given))
        console.print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
