"""Where a shadowed pair's cost goes in the real server: the shadow cut short at each stage, each
stage measured side by side with shadowing off.

The shadow throughput goal (c64 with every request shadowed at least 80% of shadowing off) leaves
a pair a quarter of a request's CPU. This says which part of today's pair takes what, on the real
server (`python -m proxy.cli serve`, uvicorn and all) rather than in one process
(bench/shadowfloor.py): each stage is a proxy process whose shadow stops after that stage, and
the stages are, cumulatively:

- `turn`: the turn hands its request over (`ShadowRequest`, `Shadow.submit`, the scheduled
  start), and nothing is sent;
- `socket`: the request is sent to the reference over a bare asyncio protocol (the head written
  anew each time, the answer framed by httptools, nothing else parsed: the least any HTTP/1.1
  exchange costs in this process), and the answer is not judged;
- `exchange`: sent as the shadow sends it (`HttpUpstream.send` on an idle pooled connection), and
  the answer not judged or counted;
- `full`: as shipped: the answer judged by the guard and the pair counted.

A stage is the shipped proxy with methods of `proxy.shadow.Shadow` replaced in its own process
(this module's `--serve STAGE`, which then runs `proxy.cli`): nothing in the proxy knows of it.
Each stage and a proxy with shadowing off run side by side on the proxy's core (both resumed at
once, each under its own wrk at concurrency 64, as bench.overhead's `measure_side_by_side`):
their requests/s ratio is the inverse ratio of their CPU per request, whatever speed the shared
core ran at. `off` beside another `off` (A/A) is the method's own noise. The upstream
(bench/fake_upstream.py) is also the reference; it and the load generators run on CPU 0, the
proxies on CPU 1. `--baseline COMMIT` adds the `full` stage of that commit's proxy (its `proxy/`
extracted, as bench.overhead's `--baseline`), beside the same `off`, in the same rounds: a
change's effect on the shadow's cost, free of the drift between two runs.

    python -m bench.shadowstages [--rounds 3] [--duration 4] [--baseline COMMIT] [--no-write]

Results: bench/results/shadowstages.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httptools

from bench.bodies import WORKLOADS
from bench.drivers import HIGH_CONCURRENCY, side_by_side
from bench.machine import load_average, machine
from bench.processes import (
    Placement,
    Server,
    baseline_checkout,
    free_port,
    pinned,
    start,
    wait_ready,
)
from bench.tables import markdown_table, spread

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "shadowstages.md"
STAGES = ("turn", "socket", "exchange", "full")
BASELINE = "baseline"
GOAL = 0.80


# -- the stages, applied inside a proxy process ----------------------------------------------------


class _Bare(asyncio.Protocol):
    """One keep-alive connection to the reference: a request written, its answer framed by
    httptools, `on_message_complete` ending the shadow request it carried."""

    def __init__(self, idle: list[_Bare], ended: Any) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.request: Any = None
        self._idle = idle
        self._ended = ended

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        request, self.request = self.request, None
        self._idle.append(self)
        if request is not None:
            self._ended(request)


class _Sent:
    """What `_start` files as the request's job: cancelling forgets the answer."""

    def __init__(self, bare: _Bare) -> None:
        self._bare = bare

    def cancel(self) -> None:
        self._bare.request = None

    task = None


def apply(stage: str) -> None:
    """Cut the shadow short after `stage` in this process (see the module doc)."""
    from proxy import shadow

    module: Any = shadow
    shadow_class: Any = shadow.Shadow
    if stage == "turn":

        def start(self: Any, request: Any, entry: Any, trace: Any) -> None:
            entry.job = None
            self._left(request)

        shadow_class._start = start
    elif stage == "socket":
        origin = urlsplit(os.environ["SHADOWSTAGES_REFERENCE_URL"])
        host = origin.netloc.encode()
        target = (origin.path.rstrip("/") + "/chat/completions").encode()
        idle: list[_Bare] = []

        def send_now(self: Any, request: Any, trace: Any) -> _Sent:
            body = self.payload(request)
            if not idle:  # this pair is not sent; a connection is made for the next
                self._left(request)
                asyncio.get_running_loop().create_task(connect(self))
                return _Sent(_Bare(idle, None))
            bare = idle.pop()
            bare.request = request
            head = (
                b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n" % (target, host, len(body))
            )
            assert bare.transport is not None
            bare.transport.writelines((head, body))
            return _Sent(bare)

        async def connect(shadow: Any) -> None:
            _, bare = await asyncio.get_running_loop().create_connection(
                lambda: _Bare(idle, shadow._left), origin.hostname or "127.0.0.1", origin.port or 80
            )
            idle.append(bare)

        shadow_class._send_now = send_now  # what `_start` calls first (the reference is HTTP)
    elif stage == "exchange":
        module._judged = lambda request, response: (None, None)
        shadow_class._answered = lambda self, request, decision, reply: None
    elif stage != "full":
        raise SystemExit(f"unknown stage {stage!r}: one of {', '.join(STAGES)}")


def serve(stage: str, argv: list[str]) -> None:
    """`proxy.cli` with the shadow cut short after `stage`."""
    if stage != "off":
        apply(stage)
    from proxy import cli

    sys.argv = ["toolsentry", *argv]
    cli.main()


# -- the measurement ---------------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    placement = Placement.for_machine()
    workload = WORKLOADS["chat"]
    python = sys.executable
    ratios: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="toolsentry-stages-") as tmp:
        work = Path(tmp)
        body = work / "chat.json"
        body.write_bytes(workload.body())
        up = free_port()
        upstream = start(
            "upstream",
            pinned(placement.upstream, [python, "-m", "bench.fake_upstream", "--port", str(up)]),
            up,
            workload.route,
            work,
        )
        started = [upstream]
        try:
            why = wait_ready(upstream, workload.body(), 20)
            if why:
                raise SystemExit(f"the fake upstream did not start: {why}")
            base = f"http://127.0.0.1:{up}/v1"
            servers: dict[str, Server] = {}
            checkout = baseline_checkout(args.baseline, work) if args.baseline else None
            names = ("off", "off-b", *STAGES, *((BASELINE,) if checkout else ()))
            for name in names:
                stage = "off" if name.startswith("off") else "full" if name == BASELINE else name
                env = {}
                if stage != "off":
                    env = {
                        "TOOLSENTRY_SHADOW_REFERENCE": f"127.0.0.1:{up}",
                        "TOOLSENTRY_SHADOW_SAMPLE": "1.0",
                        "TOOLSENTRY_SHADOW_MAX_IN_FLIGHT": str(2 * HIGH_CONCURRENCY),
                        "SHADOWSTAGES_REFERENCE_URL": base,
                    }
                port = free_port()
                argv = ["serve", "--upstream", base, "--port", str(port)]
                cwd = ROOT
                if name == BASELINE and checkout is not None:
                    # The baseline's `proxy` first (the working directory), this tree's `bench`.
                    cwd, env = checkout, {**env, "PYTHONPATH": str(ROOT)}
                server = start(
                    name,
                    pinned(
                        placement.proxy,
                        [python, "-m", "bench.shadowstages", "--serve", stage, "--", *argv],
                    ),
                    port,
                    workload.route,
                    work,
                    env=env,
                    cwd=cwd,
                )
                started.append(server)
                why = wait_ready(server, workload.body(), 30)
                if why:
                    raise SystemExit(f"{name} did not start: {why}")
                server.pause()
                servers[name] = server
            off = servers["off"]
            for round_ in range(args.rounds):
                for name in names[1:]:
                    other = servers[name]
                    off.resume()
                    other.resume()
                    try:
                        rps = side_by_side(
                            [off, other], workload.route, body, args.duration, placement.load
                        )
                        ratio = rps[1] / rps[0]
                    finally:
                        off.pause()
                        other.pause()
                    ratios.setdefault(name, []).append(ratio)
                    print(
                        f"  round {round_ + 1}/{args.rounds} {name:9} ÷ off {ratio:.3f}",
                        flush=True,
                    )
        finally:
            for server in started:
                server.stop()
    return ratios


def report(ratios: dict[str, list[float]], args: argparse.Namespace, began: str) -> str:
    def cell(values: list[float]) -> str:
        return spread(values, lambda v: f"{v:.3f}")

    def share(values: list[float]) -> str:
        # What the stage's pair costs, as a share of a request: 1/ratio − 1.
        return f"{1 / statistics.median(values) - 1:.3f}"

    labels = {
        "off-b": "off beside off (the method's noise)",
        "turn": "turn: handed over, nothing sent",
        "socket": "socket: sent over a bare protocol, not judged",
        "exchange": "exchange: sent as the shadow sends, not judged or counted",
        "full": "full: as shipped",
        BASELINE: f"full, at `{args.baseline}` (--baseline)",
    }
    lines = [
        "# Where a shadowed pair's cost goes in the real server (bench/shadowstages.py)",
        "",
        f"{began} UTC, {machine()}. Command: `python -m bench.shadowstages --rounds {args.rounds} "
        f"--duration {args.duration:g}"
        + (f" --baseline {args.baseline}" if args.baseline else "")
        + f"`; load average at start {args.load}.",
        "",
        "Each stage side by side with shadowing off on the proxy's core, c64 from wrk each, "
        "median (min–max) over rounds; a pair's cost as a share of a request is 1 ÷ ratio − 1 "
        f"(the {GOAL:.0%} goal leaves {1 / GOAL - 1:.2f}).",
        "",
    ]
    costs = {name: 1 / statistics.median(v) - 1 for name, v in ratios.items() if name != "off-b"}
    whole, before = costs.get("full"), 0.0
    body = []
    for name, values in ratios.items():
        if name in ("off-b", BASELINE):
            shown = "–" if name == "off-b" else share(values)
            body.append([labels[name], cell(values), shown, "–"])
            continue
        part = "–" if not whole else f"{(costs[name] - before) / whole:.0%}"
        before = costs[name]
        body.append([labels[name], cell(values), share(values), part])
    header = ["stage", "req/s ÷ off", "a pair, share of a request", "this stage's part of the pair"]
    lines += [markdown_table(header, body), ""]
    if whole and "exchange" in costs and "socket" in costs:
        # What the pair would cost with an upstream client as cheap as the bare protocol.
        floor = whole - (costs["exchange"] - costs["socket"])
        lines += [
            f"With an upstream client that cost no more than the bare protocol, a pair would cost "
            f"{floor:.3f} of a request: at best {1 / (1 + floor):.0%} of shadowing off.",
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        if len(argv) < 3 or argv[2] != "--":
            raise SystemExit("usage: python -m bench.shadowstages --serve STAGE -- SERVE_ARGS…")
        serve(argv[1], argv[3:])
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m bench.shadowstages", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument(
        "--duration", type=float, default=4, help="seconds of load per measurement (default 4)"
    )
    parser.add_argument(
        "--baseline",
        metavar="COMMIT",
        help="also measure the full stage of this commit's proxy (or a directory holding proxy/)",
    )
    parser.add_argument("--no-write", action="store_true", help=f"do not write {OUT.name}")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.duration < 1:
        parser.error("--rounds and --duration must be at least 1")
    args.load = load_average()
    began = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M")
    t0 = time.monotonic()
    ratios = measure(args)
    text = report(ratios, args, began)
    print(text)
    print(f"{time.monotonic() - t0:.0f} s")
    if not args.no_write:
        OUT.write_text(text)
        print(f"written to {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
