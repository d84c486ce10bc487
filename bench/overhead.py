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
import concurrent.futures
import contextlib
import datetime as dt
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from bench.bodies import request_body
from bench.fake_upstream import MODEL

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "RESULTS.md"
LUA = BENCH / "wrk_post.lua"
LITELLM_VENV = Path.home() / ".cache" / "toolsentry" / "litellm"
SHADOW = "toolsentry-shadow"
TARGETS = ("direct", "toolsentry", SHADOW, "pass-aiohttp", "pass-httpx", "litellm")
BASELINE = "toolsentry-baseline"
SECTION_BEGIN = "<!-- overhead.py:begin -->"
SECTION_END = "<!-- overhead.py:end -->"
HIGH_CONCURRENCY = 64
TTFT_REQUESTS = 300
INTERLEAVED_REQUESTS = 1000

# The goals this benchmark reports against (tests never time anything).
GOAL_ADDED_P50_MS = 0.6
GOAL_ADDED_P99_MS = 2.0
GOAL_THROUGHPUT_OF_FLOOR = 0.70
GOAL_THROUGHPUT_OF_LITELLM = 20.0
GOAL_ADDED_TTFT_MS = 1.0
GOAL_SHADOW_ADDED_P50_MS = 0.1  # beside shadowing off
GOAL_SHADOW_THROUGHPUT = 0.80  # of shadowing off, every request shadowed
GOAL_PROTOCOL_ADDED = 1.1  # Responses, Messages: added c1 p50 ÷ chat's on the same body size
GOAL_PROTOCOL_THROUGHPUT = 0.75  # c64 req/s ÷ the bare aiohttp pass-through's, each protocol
GOAL_LARGE_ADDED_MS = 1.0  # the Claude-Code-sized request's added c1 p50
GOAL_NO_SLOWER = 0.95  # chat against the commit before the turn refactor, 5% for noise
REFACTOR_PARENT = "f869956"

console = Console(width=None if sys.stdout.isatty() else 150)


@dataclass(frozen=True)
class Workload:
    """One request measured: a wire protocol's route and a body size (bench/bodies.py)."""

    name: str
    api: str
    size: str
    route: str
    ttft: bool  # also streamed one at a time for the time to first token

    def body(self, stream: bool = False) -> bytes:
        return request_body(stream=stream, api=self.api, size=self.size)


WORKLOADS = {
    w.name: w
    for w in (
        Workload("chat", "chat", "small", "/v1/chat/completions", True),
        Workload("responses", "responses", "small", "/v1/responses", True),
        Workload("messages", "messages", "small", "/v1/messages", True),
        Workload("chat-large", "chat", "large", "/v1/chat/completions", False),
        # Claude Code's own route, query string and all.
        Workload("messages-large", "messages", "large", "/v1/messages?beta=true", False),
    )
}
"""What `--workloads` chooses among; small bodies are about 7 kB, large ones about 75 kB."""

CHAT_ONLY = frozenset({BASELINE, SHADOW, "pass-httpx", "litellm"})
"""Targets measured on the small chat workload only (the commit before the refactor served chat
completions alone; the others are comparisons of the chat path)."""


# -- processes ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Placement:
    """Which CPU each role runs on (taskset lists)."""

    upstream: str
    proxy: str
    load: str

    @classmethod
    def for_machine(cls) -> Placement:
        if (os.cpu_count() or 1) >= 2:
            return cls(upstream="0", proxy="1", load="0")
        return cls(upstream="0", proxy="0", load="0")

    def describe(self) -> str:
        return f"upstream on CPU {self.upstream}, proxy under test on CPU {self.proxy}, load generator (wrk, ttft) on CPU {self.load}"


def load_average() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "unknown"


def pinned(cpus: str, argv: list[str]) -> list[str]:
    return ["taskset", "-c", cpus, *argv] if shutil.which("taskset") else argv


@dataclass
class Server:
    """A process started for the benchmark, in its own process group (so it can be paused)."""

    name: str
    port: int
    path: str
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    pausable: bool = True  # not the upstream: every target needs it

    @property
    def url(self) -> str:
        return self.url_for(self.path)

    def url_for(self, route: str) -> str:
        return f"http://127.0.0.1:{self.port}{route}"

    def signal(self, sig: signal.Signals) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, sig)

    def pause(self) -> None:
        if self.pausable:
            self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.pausable:
            self.signal(signal.SIGCONT)

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of every process in this server's group so far (Linux)."""
        if self.process is None:
            return None
        ticks = 0
        tick = os.sysconf("SC_CLK_TCK")
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == self.process.pid:  # field 5, pgrp
                    ticks += int(fields[11]) + int(fields[12])  # fields 14, 15: utime, stime
        return ticks / tick

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait()


def start(
    name: str,
    argv: list[str],
    port: int,
    path: str,
    workdir: Path,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> Server:
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    return Server(name, port, path, process, log)


def wait_ready(server: Server, body: bytes, timeout: float) -> str | None:
    """Poll with the benchmark's request until it answers 200; return why not, or None."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if server.process is not None and server.process.poll() is not None:
            return f"exited with {server.process.returncode}: {tail(server.log)}"
        request = urllib.request.Request(
            server.url, data=body, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return None
                last = f"status {response.status}"
        except urllib.error.HTTPError as exc:
            last = f"status {exc.code}: {exc.read()[:300]!r}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    return f"not ready after {timeout:.0f} s ({last}): {tail(server.log)}"


def tail(log: Path | None, lines: int = 5) -> str:
    if log is None or not log.exists():
        return ""
    return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])


# -- LiteLLM --------------------------------------------------------------------------------------


def ensure_litellm(venv: Path) -> tuple[Path | None, str]:
    """LiteLLM's proxy in its own virtualenv, installed on first use; (executable, version or why not)."""
    exe = venv / "bin" / "litellm"
    python = venv / "bin" / "python"
    if not exe.exists():
        console.print(f"installing litellm[proxy] into {venv} (once; a few minutes) …")
        try:
            if not python.exists():
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "litellm[proxy]"],
                check=True,
                timeout=900,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        except (subprocess.SubprocessError, OSError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            return None, f"pip install 'litellm[proxy]' failed: {exc} {detail[-300:]!r}"
    version = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return (exe, version) if exe.exists() else (None, "no litellm executable after install")


def litellm_config(workdir: Path, upstream: str) -> Path:
    path = workdir / "litellm.yaml"
    path.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {upstream}\n"
        "      api_key: bench-key\n"
        "litellm_settings:\n"
        "  set_verbose: false\n"
        "  telemetry: false\n"
        "  drop_params: true\n"
    )
    return path


# -- measurements ---------------------------------------------------------------------------------


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def run_wrk(
    url: str, body_file: Path, connections: int, seconds: float, cpus: str
) -> dict[str, float]:
    """One wrk run; returns its summary (latencies in µs) plus requests/s."""
    argv = pinned(
        cpus,
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            "10s",
            "-s",
            str(LUA),
            url,
        ],
    )
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env={**os.environ, "WRK_BODY": str(body_file)},
        timeout=seconds + 60,
        check=False,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("WRK ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary: {done.stdout[-500:]} {done.stderr[-500:]}")
    summary: dict[str, float] = orjson.loads(line[4:])
    summary["rps"] = summary["requests"] / (summary["duration_us"] / 1e6)
    summary["errors"] = sum(
        summary[k]
        for k in ("connect_errors", "read_errors", "write_errors", "status_errors", "timeouts")
    )
    return summary


def run_ttft(url: str, body_file: Path, requests: int, cpus: str) -> dict[str, Any]:
    argv = pinned(
        cpus,
        [
            sys.executable,
            "-m",
            "bench.ttft",
            "--url",
            url,
            "--body",
            str(body_file),
            "-n",
            str(requests),
        ],
    )
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    lines = done.stdout.strip().splitlines()
    if not lines:
        return {"error": f"bench.ttft failed: {done.stderr[-300:]}"}
    result: dict[str, Any] = orjson.loads(lines[-1])
    return result


@dataclass
class Sample:
    """One round of one target."""

    c1: dict[str, float]
    c64: dict[str, float]
    ttft: dict[str, Any]
    interleaved: dict[str, float] = field(default_factory=dict)  # `p50_us`, see measure_interleaved
    side: dict[str, float] = field(default_factory=dict)  # `rps`, see measure_side_by_side


@dataclass
class Outcome:
    """Everything measured for one target, or why it was skipped."""

    name: str
    note: str = ""
    samples: list[Sample] = field(default_factory=list)
    ttft_note: str = ""

    def median(self, part: str, key: str) -> float | None:
        values = [getattr(s, part).get(key) for s in self.samples]
        present = [v for v in values if isinstance(v, int | float)]
        return statistics.median(present) if present else None


def added(outcome: Outcome, direct: Outcome, part: str, key: str) -> float | None:
    """Median over rounds of (target − direct) in the same round, in µs."""
    diffs = []
    for mine, base in zip(outcome.samples, direct.samples, strict=False):
        a, b = getattr(mine, part).get(key), getattr(base, part).get(key)
        if isinstance(a, int | float) and isinstance(b, int | float):
            diffs.append(a - b)
    return statistics.median(diffs) if diffs else None


def per_round(
    outcome: Outcome, reference: Outcome, part: str, key: str, *, as_ratio: bool
) -> list[float]:
    """Round by round: target − reference (µs), or target / reference with `as_ratio`."""
    values = []
    for mine, base in zip(outcome.samples, reference.samples, strict=False):
        a, b = getattr(mine, part).get(key), getattr(base, part).get(key)
        if isinstance(a, int | float) and isinstance(b, int | float):
            if as_ratio:
                if b:
                    values.append(a / b)
            else:
                values.append(a - b)
    return values


def spread(values: list[float], render: Any) -> str:
    """`median (min–max)` of the rounds' values."""
    if not values:
        return "–"
    return f"{render(statistics.median(values))} ({render(min(values))}–{render(max(values))})"


SPREAD_COLUMNS = [
    "target",
    "added c1 p50 ms",
    "c64 req/s ÷ pass-aiohttp",
    "added TTFT ms",
]


def spread_rows(outcomes: dict[str, Outcome]) -> list[list[str]]:
    """Each proxy's figures as median [min–max] over rounds, each round against the same round's
    direct (added) or aiohttp pass-through (ratio): how far one round's noise reaches."""
    direct, floor = outcomes["direct"], outcomes.get("pass-aiohttp")
    out = []
    for o in outcomes.values():
        if o is direct or o is floor or not o.samples:
            continue
        rps = per_round(o, floor, "c64", "rps", as_ratio=True) if floor and floor.samples else []
        out.append(
            [
                o.name,
                spread(per_round(o, direct, "c1", "p50_us", as_ratio=False), ms),
                spread(rps, lambda r: f"{r:.2f}"),
                spread(per_round(o, direct, "ttft", "p50_us", as_ratio=False), ms),
            ]
        )
    return out


# -- the run --------------------------------------------------------------------------------------


@contextlib.contextmanager
def servers(
    wanted: list[str],
    workdir: Path,
    placement: Placement,
    upstream_port: int,
    checkouts: dict[str, Path] | None = None,
) -> Iterator[tuple[dict[str, Server], dict[str, str]]]:
    """Start the upstream and every wanted proxy; yield the running ones and skip notes."""
    route = WORKLOADS["chat"].route  # every target serves it: the readiness check
    python = sys.executable
    checkouts = checkouts or {}
    upstream_base = f"http://127.0.0.1:{upstream_port}/v1"
    running: dict[str, Server] = {}
    notes: dict[str, str] = {}
    started: list[Server] = []
    try:
        upstream = start(
            "upstream",
            pinned(
                placement.upstream,
                [python, "-m", "bench.fake_upstream", "--port", str(upstream_port)],
            ),
            upstream_port,
            route,
            workdir,
        )
        started.append(upstream)
        why = wait_ready(upstream, request_body(), 20)
        if why:
            raise RuntimeError(f"the fake upstream did not start: {why}")
        running["direct"] = Server(
            "direct", upstream_port, route, upstream.process, upstream.log, False
        )
        commands: dict[str, tuple[list[str], dict[str, str]]] = {}
        port = {name: free_port() for name in [*wanted, BASELINE]}
        for name in ("toolsentry", BASELINE, SHADOW):
            if name in wanted:
                commands[name] = (
                    [
                        python,
                        "-m",
                        "proxy.cli",
                        "serve",
                        "--upstream",
                        upstream_base,
                        "--port",
                        str(port[name]),
                    ],
                    # Every request shadowed (room for c64 in flight, so none is dropped); the
                    # reference is the fake upstream itself (a fast one, named after its
                    # address), so the copy costs the proxy, not a model.
                    {
                        "TOOLSENTRY_SHADOW_REFERENCE": f"127.0.0.1:{upstream_port}",
                        "TOOLSENTRY_SHADOW_SAMPLE": "1.0",
                        "TOOLSENTRY_SHADOW_MAX_IN_FLIGHT": str(2 * HIGH_CONCURRENCY),
                    }
                    if name == SHADOW
                    else {},
                )
        for client in ("aiohttp", "httpx"):
            if f"pass-{client}" in wanted:
                commands[f"pass-{client}"] = (
                    [
                        python,
                        "-m",
                        "bench.passthrough",
                        "--client",
                        client,
                        "--upstream",
                        upstream_base,
                        "--port",
                        str(port[f"pass-{client}"]),
                    ],
                    {},
                )
        if "litellm" in wanted:
            exe, version = ensure_litellm(LITELLM_VENV)
            if exe is None:
                notes["litellm"] = f"skipped: {version}"
            else:
                notes["litellm"] = f"LiteLLM {version}"
                commands["litellm"] = (
                    [
                        str(exe),
                        "--config",
                        str(litellm_config(workdir, upstream_base)),
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port["litellm"]),
                        "--num_workers",
                        "1",
                    ],
                    {
                        "LITELLM_LOG": "ERROR",
                        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                        "LITELLM_TELEMETRY": "False",
                        # No master key: LiteLLM then skips key checks, as toolsentry does here.
                        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
                    },
                )
        for name, (argv, env) in commands.items():
            cwd = checkouts.get(name, ROOT)
            server = start(
                name,
                pinned(placement.proxy, argv),
                port[name],
                route,
                workdir,
                env,
                cwd,
            )
            started.append(server)
        for server in started[1:]:
            why = wait_ready(server, request_body(), 120 if server.name == "litellm" else 30)
            if why:
                notes[server.name] = f"skipped: did not start ({why})"
                server.stop()
            else:
                running[server.name] = server
                server.pause()
        yield running, notes
    finally:
        for server in started:
            server.stop()


Results = dict[str, dict[str, Outcome]]
"""Outcomes by workload, then by target."""


def targets_of(workload: Workload, wanted: list[str]) -> list[str]:
    """The wanted targets measured on `workload`."""
    return [t for t in wanted if workload.name == "chat" or t not in CHAT_ONLY]


def measure(args: argparse.Namespace) -> tuple[Results, dict[str, Any]]:
    wanted = [t for t in (args.only or TARGETS) if not (t == "litellm" and args.skip_litellm)]
    if args.baseline is not None:
        wanted.insert(wanted.index("toolsentry") + 1 if "toolsentry" in wanted else 0, BASELINE)
    if "direct" not in wanted:
        wanted.insert(0, "direct")  # every added figure is against direct
    workloads = [WORKLOADS[name] for name in args.workloads]
    placement = Placement.for_machine()
    info: dict[str, Any] = {"placement": placement.describe(), "notes": {}, "load": load_average()}
    results: Results = {
        w.name: {name: Outcome(name) for name in targets_of(w, wanted)} for w in workloads
    }
    if args.skip_litellm and "litellm" in (args.only or TARGETS):
        info["notes"]["litellm"] = "skipped (--skip-litellm)"
    with tempfile.TemporaryDirectory(prefix="toolsentry-bench-") as tmp:
        workdir = Path(tmp)
        bodies: dict[str, tuple[Path, Path]] = {}
        for w in workloads:
            plain, streamed = workdir / f"{w.name}.json", workdir / f"{w.name}-stream.json"
            plain.write_bytes(w.body())
            streamed.write_bytes(w.body(stream=True))
            bodies[w.name] = plain, streamed
        baseline = baseline_checkout(args.baseline, workdir) if args.baseline else ROOT
        with servers(
            [w for w in wanted if w != "direct"],
            workdir,
            placement,
            free_port(),
            {"toolsentry": args.toolsentry_dir, BASELINE: baseline},
        ) as (running, notes):
            info["notes"].update(notes)
            for outcomes in results.values():
                for name, outcome in outcomes.items():
                    if name not in running:
                        outcome.note = notes.get(name, "skipped")
            if args.profile:
                body_file = bodies[workloads[0].name][0]
                info["notes"].update(profile(running, body_file, args, placement))
            # Streaming: a target that answers stream:true with an error is skipped with its answer.
            for w in workloads:
                for name, outcome in results[w.name].items():
                    if not w.ttft or name not in running:
                        continue
                    server = running[name]
                    server.resume()
                    probe = run_ttft(server.url_for(w.route), bodies[w.name][1], 3, placement.load)
                    server.pause()
                    if "error" in probe:
                        outcome.ttft_note = f"streaming skipped: {probe['error'][:160]}"
            for round_ in range(args.rounds):
                c1 = measure_c1(running, results, workloads, bodies, args, placement, round_)
                paired = measure_interleaved(running, workloads, bodies, args, round_)
                if paired:
                    console.print(
                        f"  round {round_ + 1}/{args.rounds} c1 interleaved, p50 ms: "
                        + ", ".join(
                            f"{w} {name} {values['p50_us'] / 1000:.3f}"
                            for (w, name), values in paired.items()
                        )
                    )
                side = measure_side_by_side(running, bodies, args, placement)
                if side:
                    console.print(
                        f"  round {round_ + 1}/{args.rounds} c64 side by side, req/s: "
                        + ", ".join(f"{name} {values['rps']:.0f}" for name, values in side.items())
                    )
                for w in workloads:
                    order = [name for name in results[w.name] if name in running]
                    shift = round_ % len(order)
                    for name in order[shift:] + order[:shift]:
                        outcome = results[w.name][name]
                        c64, ttft = measure_load(
                            running[name], w, bodies[w.name], outcome, args, placement
                        )
                        sample = Sample(
                            c1[w.name, name],
                            c64,
                            ttft,
                            paired.get((w.name, name), {}),
                            side.get(name, {}) if w.name == SIDE_BY_SIDE_WORKLOAD else {},
                        )
                        outcome.samples.append(sample)
                        console.print(
                            f"  round {round_ + 1}/{args.rounds} {w.name:14} {name:20}"
                            + describe(sample)
                        )
    return results, info


C1_ORDER = ("responses", "chat", "messages", "chat-large", "messages-large")
"""The order of a target's c1 runs in a round (reversed every other round): each workload a
ratio goal compares (Responses and Messages with chat, each large body with the other) is
measured next to the one it is compared with."""


def measure_c1(
    running: dict[str, Server],
    results: Results,
    workloads: Sequence[Workload],
    bodies: dict[str, tuple[Path, Path]],
    args: argparse.Namespace,
    placement: Placement,
    round_: int,
) -> dict[tuple[str, str], dict[str, float]]:
    """One round's concurrency-1 runs, by (workload, target): each target in turn (rotating
    order) runs every workload back to back, so the latency ratios between workloads compare
    runs seconds apart, not a round apart, and a shared machine's drift between them is small."""
    order = sorted(workloads, key=lambda w: C1_ORDER.index(w.name))
    if round_ % 2:
        order.reverse()
    names = [name for name in running if any(name in results[w.name] for w in workloads)]
    shift = round_ % len(names)
    out = {}
    for name in names[shift:] + names[:shift]:
        server = running[name]
        server.resume()
        try:
            for w in order:
                if name not in results[w.name]:
                    continue
                url, body_file = server.url_for(w.route), bodies[w.name][0]
                run_wrk(url, body_file, 8, 2 if round_ == 0 else 1, placement.load)  # warm-up
                out[w.name, name] = run_wrk(url, body_file, 1, args.duration, placement.load)
        finally:
            server.pause()
    return out


RATIO_GOALS = (
    ("responses", "chat", "Responses"),
    ("messages", "chat", "Messages, small body"),
    ("messages-large", "chat-large", "Messages, 75 kB body"),
)
"""The latency ratio goals: (workload, the chat workload it is compared with, label)."""


class KeepAlive:
    """One keep-alive HTTP/1.1 connection that POSTs the same body again and again: the
    interleaved latency client (a request written in one call, an answer framed by its
    Content-Length, nothing parsed beyond the head)."""

    def __init__(self, port: int, route: str, body: bytes) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = (
            f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.request = head.encode() + body
        self.route = route

    def post(self) -> float:
        """One request; its latency in µs, from before the write to the answer's last byte."""
        sock = self.sock
        start = time.perf_counter()
        sock.sendall(self.request)
        data = b""
        while (end := data.find(b"\r\n\r\n")) < 0:
            data += self._recv()
        head = data[:end].decode("latin-1").lower()
        length = next(
            (int(line[15:]) for line in head.split("\r\n") if line.startswith("content-length:")),
            None,
        )
        if length is None:
            raise RuntimeError(f"{self.route}: an answer without a Content-Length: {head[:200]}")
        while len(data) - end - 4 < length:
            data += self._recv()
        elapsed = (time.perf_counter() - start) * 1e6
        if not head.startswith("http/1.1 200"):
            raise RuntimeError(f"{self.route} answered {head[:200]!r}")
        return elapsed

    def _recv(self) -> bytes:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise RuntimeError(f"{self.route}: the server closed the connection")
        return chunk

    def close(self) -> None:
        self.sock.close()


def measure_interleaved(
    running: dict[str, Server],
    workloads: Sequence[Workload],
    bodies: dict[str, tuple[Path, Path]],
    args: argparse.Namespace,
    round_: int,
) -> dict[tuple[str, str], dict[str, float]]:
    """The c1 latency the ratio goals compare, by (workload, target): toolsentry and direct on
    every workload of a ratio goal, one request to each in turn (the order rotating), so that
    the workloads compared are measured milliseconds apart and what a shared machine's drift
    does to one it does to the other. `p50_us` of `--interleaved-requests` each."""
    names = {w.name for w in workloads}
    chosen = [
        w
        for w in workloads
        if any(w.name in pair[:2] and {pair[0], pair[1]} <= names for pair in RATIO_GOALS)
    ]
    server = running.get("toolsentry")
    if server is None or not chosen or args.interleaved_requests <= 0:
        return {}
    direct = running["direct"]
    server.resume()
    clients: dict[tuple[str, str], KeepAlive] = {}
    try:
        for w in chosen:
            body = bodies[w.name][0].read_bytes()
            for target in (server, direct):
                clients[w.name, target.name] = KeepAlive(target.port, w.route, body)
        keys = list(clients)
        for key in keys * 20:  # warm-up
            clients[key].post()
        latencies: dict[tuple[str, str], list[float]] = {key: [] for key in keys}
        for i in range(args.interleaved_requests):
            shift = (i + round_) % len(keys)
            for key in keys[shift:] + keys[:shift]:
                latencies[key].append(clients[key].post())
    finally:
        for client in clients.values():
            client.close()
        server.pause()
    return {key: {"p50_us": statistics.median(values)} for key, values in latencies.items()}


def measure_load(
    server: Server,
    workload: Workload,
    body_files: tuple[Path, Path],
    outcome: Outcome,
    args: argparse.Namespace,
    placement: Placement,
) -> tuple[dict[str, float], dict[str, Any]]:
    """One round of one target on one workload under load: c64 (with the proxy's CPU), TTFT."""
    url = server.url_for(workload.route)
    body_file, stream_file = body_files
    server.resume()
    try:
        run_wrk(url, body_file, 8, 1, placement.load)  # warm-up
        cpu_before = server.cpu_seconds()
        c64 = run_wrk(url, body_file, HIGH_CONCURRENCY, args.duration, placement.load)
        cpu_after = server.cpu_seconds()
        if cpu_before is not None and cpu_after is not None and c64["requests"]:
            # CPU per request is what contention on a shared machine disturbs least.
            c64["cpu_us"] = (cpu_after - cpu_before) / c64["requests"] * 1e6
        ttft: dict[str, Any] = {}
        if workload.ttft and not outcome.ttft_note:
            ttft = run_ttft(url, stream_file, args.ttft_requests, placement.load)
    finally:
        server.pause()
    return c64, ttft


SIDE_BY_SIDE_WORKLOAD = "chat"


def measure_side_by_side(
    running: dict[str, Server],
    bodies: dict[str, tuple[Path, Path]],
    args: argparse.Namespace,
    placement: Placement,
) -> dict[str, dict[str, float]]:
    """The shadow's throughput goal, measured so that a shared core's drift cancels out:
    `toolsentry` and `toolsentry-shadow` resumed together on the proxy's core, each under a wrk
    of its own at concurrency 64 for `--duration` seconds (`side_by_side`). Both are CPU-bound
    and the scheduler gives each half the core, so the ratio of their requests/s is the inverse
    ratio of their CPU per request, at whatever speed the core ran in those seconds. `rps` by
    target; empty when either target is not running."""
    pair = [running.get("toolsentry"), running.get(SHADOW)]
    if any(server is None for server in pair) or SIDE_BY_SIDE_WORKLOAD not in bodies:
        return {}
    servers = [server for server in pair if server is not None]
    route = WORKLOADS[SIDE_BY_SIDE_WORKLOAD].route
    body_file = bodies[SIDE_BY_SIDE_WORKLOAD][0]
    for server in servers:
        server.resume()
    try:
        rps = side_by_side(servers, route, body_file, args.duration, placement.load)
    finally:
        for server in servers:
            server.pause()
    return {server.name: {"rps": value} for server, value in zip(servers, rps, strict=True)}


def side_by_side(
    servers: Sequence[Server], route: str, body_file: Path, seconds: float, cpus: str
) -> list[float]:
    """The requests/s of each of `servers` (running), all under load at once: a wrk of its own
    each at concurrency 64 for `seconds`, after two seconds of warm-up, also all at once (a
    shadowing proxy's first seconds at c64 open its connections to the reference)."""
    with concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:

        def run(duration: float) -> list[dict[str, float]]:
            return list(
                pool.map(
                    lambda server: run_wrk(
                        server.url_for(route), body_file, HIGH_CONCURRENCY, duration, cpus
                    ),
                    servers,
                )
            )

        run(2)  # warm-up
        return [measured["rps"] for measured in run(seconds)]


def describe(sample: Sample) -> str:
    c1, c64, ttft = sample.c1, sample.c64, sample.ttft
    errors = c1["errors"] + c64["errors"]
    return (
        f"c1 p50 {c1['p50_us'] / 1000:.3f} ms  c64 {c64['rps']:,.0f} req/s"
        + (f"  ttft p50 {ttft['p50_us'] / 1000:.3f} ms" if "p50_us" in ttft else "")
        + (f"  ({errors:.0f} errors)" if errors else "")
    )


def baseline_checkout(given: str, workdir: Path) -> Path:
    """`--baseline`: a directory as it is, else a commit whose `proxy/` is extracted (git
    archive) into the run's temporary directory."""
    path = Path(given)
    if path.is_dir():
        return path
    target = workdir / "baseline"
    target.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", given, "proxy"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise SystemExit(
            f"--baseline {given}: neither a directory nor a commit: {archive.stderr!r}"
        )
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def profile(
    running: dict[str, Server], body_file: Path, args: argparse.Namespace, placement: Placement
) -> dict[str, str]:
    """Flame graphs of the Python proxies under concurrency-64 load (py-spy), into bench/profiles/."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        return {"profile": "no py-spy: pip install py-spy"}
    notes = {}
    for name in ("toolsentry", "pass-aiohttp"):
        server = running.get(name)
        if server is None or server.process is None:
            continue
        out = BENCH / "profiles" / f"{args.profile_prefix}{name}.svg"
        out.parent.mkdir(exist_ok=True)
        server.resume()
        seconds = max(3, round(args.duration))
        recorder = subprocess.Popen(
            pinned(
                placement.load,
                [
                    spy,
                    "record",
                    "-o",
                    str(out),
                    "--pid",
                    str(server.process.pid),
                    "--duration",
                    str(seconds),
                    "--rate",
                    "250",
                    "--nonblocking",
                ],
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(0.5)
        run_wrk(server.url, body_file, HIGH_CONCURRENCY, seconds, placement.load)
        _, err = recorder.communicate(timeout=60)
        server.pause()
        notes[f"profile {name}"] = (
            str(out.relative_to(ROOT)) if out.exists() else f"py-spy failed: {err[-200:]!r}"
        )
    return notes


# -- report ---------------------------------------------------------------------------------------


def ms(us: float | None, digits: int = 3) -> str:
    return "–" if us is None else f"{us / 1000:.{digits}f}"


def cpu(us: float | None) -> str:
    return "–" if us is None else f"{us:.0f}"


def ratio(a: float | None, b: float | None, digits: int = 1) -> str:
    if a is None or b is None or b == 0:
        return "–"
    return f"{a / b:.{digits}f}×"


def rows(outcomes: dict[str, Outcome]) -> list[list[str]]:
    direct = outcomes["direct"]
    out = []
    for o in outcomes.values():
        if not o.samples:
            out.append([o.name, "skipped (see below)", *["–"] * (len(COLUMNS) - 2)])
            continue
        is_direct = o is direct
        ttft_p50 = o.median("ttft", "p50_us")
        out.append(
            [
                o.name,
                ms(o.median("c1", "p50_us")),
                ms(o.median("c1", "p99_us")),
                "" if is_direct else ms(added(o, direct, "c1", "p50_us")),
                "" if is_direct else ms(added(o, direct, "c1", "p99_us")),
                f"{o.median('c64', 'rps'):,.0f}",
                ms(o.median("c64", "p99_us"), 2),
                cpu(o.median("c64", "cpu_us")),
                ms(ttft_p50) if ttft_p50 is not None else (o.ttft_note and "skipped") or "–",
                ""
                if is_direct
                else ms(added(o, direct, "ttft", "p50_us"))
                if ttft_p50 is not None
                else "–",
            ]
        )
    return out


COLUMNS = [
    "target",
    "c1 p50 ms",
    "c1 p99 ms",
    "added p50 ms",
    "added p99 ms",
    "c64 req/s",
    "c64 p99 ms",
    "CPU µs/req",
    "TTFT p50 ms",
    "added TTFT ms",
]


RATIO_COLUMNS = (
    "comparison",
    "throughput at c64",
    "added latency at c1",
    "p99 at c64",
    "proxy CPU at c64",
)


def floor_of(outcomes: dict[str, Outcome]) -> Outcome | None:
    passes = [o for n, o in outcomes.items() if n.startswith("pass-") and o.samples]
    return max(passes, key=lambda o: o.median("c64", "rps") or 0.0, default=None)


def throughput_ratio(mine: Outcome, other: Outcome) -> float | None:
    """`mine`'s c64 req/s ÷ `other`'s: the median of the rounds' ratios, as every table shows it."""
    values = per_round(mine, other, "c64", "rps", as_ratio=True)
    return statistics.median(values) if values else None


def headline(outcomes: dict[str, Outcome]) -> tuple[list[list[str]], list[list[str]]]:
    """(ratio rows, goal rows)."""
    ts, direct = outcomes.get("toolsentry"), outcomes["direct"]
    floor, lite = floor_of(outcomes), outcomes.get("litellm")
    ratios: list[list[str]] = []
    goals: list[list[str]] = []
    if ts is None or not ts.samples:
        return ratios, goals
    ts_add50 = added(ts, direct, "c1", "p50_us")
    ts_add99 = added(ts, direct, "c1", "p99_us")
    ts_rps, ts_p99 = ts.median("c64", "rps"), ts.median("c64", "p99_us")
    base = outcomes.get(BASELINE)
    for other in (floor, lite if lite is not None and lite.samples else None, base):
        if other is None or not other.samples:
            continue
        o50 = added(other, direct, "c1", "p50_us")
        rps_ratio = throughput_ratio(ts, other)
        ratios.append(
            [
                f"toolsentry vs {other.name}",
                "–" if rps_ratio is None else f"{rps_ratio:.2f}× the req/s",
                f"{ratio(ts_add50, o50, 2)} the added p50 ({ms(ts_add50)} vs {ms(o50)} ms)",
                f"{ratio(ts_p99, other.median('c64', 'p99_us'), 2)} the c64 p99",
                f"{ratio(ts.median('c64', 'cpu_us'), other.median('c64', 'cpu_us'), 2)} the CPU per request",
            ]
        )

    def goal(name: str, value: str, target: str, ok: bool | None) -> None:
        goals.append([name, value, target, "–" if ok is None else ("met" if ok else "MISSED")])

    goal(
        "added p50 at c1",
        f"{ms(ts_add50)} ms",
        f"≤ {GOAL_ADDED_P50_MS} ms",
        None if ts_add50 is None else ts_add50 / 1000 <= GOAL_ADDED_P50_MS,
    )
    goal(
        "added p99 at c1",
        f"{ms(ts_add99)} ms",
        f"≤ {GOAL_ADDED_P99_MS} ms",
        None if ts_add99 is None else ts_add99 / 1000 <= GOAL_ADDED_P99_MS,
    )
    share = None if floor is None else throughput_ratio(ts, floor)
    if floor is not None and share is not None:
        goal(
            f"c64 req/s vs {floor.name}",
            f"{share:.0%}",
            f"≥ {GOAL_THROUGHPUT_OF_FLOOR:.0%}",
            share >= GOAL_THROUGHPUT_OF_FLOOR,
        )
    if lite is not None and lite.samples and ts_rps is not None:
        times = ts_rps / (lite.median("c64", "rps") or 1)
        lower = (ts_p99 or 0) < (lite.median("c64", "p99_us") or 0)
        goal(
            "c64 req/s vs litellm, lower p99",
            f"{times:.0f}×, p99 {ms(ts_p99, 2)} vs {ms(lite.median('c64', 'p99_us'), 2)} ms",
            f"≥ {GOAL_THROUGHPUT_OF_LITELLM:.0f}×, lower",
            times >= GOAL_THROUGHPUT_OF_LITELLM and lower,
        )
    # Shadowing's goals are the issue's, with the others of the run (`issue_goals`).
    ttft_added = added(ts, direct, "ttft", "p50_us")
    goal(
        "added TTFT p50",
        f"{ms(ttft_added)} ms" if ttft_added is not None else ts.ttft_note or "–",
        f"≤ {GOAL_ADDED_TTFT_MS} ms",
        None if ttft_added is None else ttft_added / 1000 <= GOAL_ADDED_TTFT_MS,
    )
    return ratios, goals


def show(results: Results, info: dict[str, Any]) -> None:
    for workload, outcomes in results.items():
        title = f"{workload} ({WORKLOADS[workload].route}): medians over rounds; added = target − direct"
        console.print(rich_table(title, COLUMNS, rows(outcomes), text_columns={"target"}))
        spreads = spread_rows(outcomes)
        if spreads:
            title = f"{workload}, per round: median (min–max) over rounds"
            console.print(rich_table(title, SPREAD_COLUMNS, spreads, text_columns={"target"}))
        ratios, goals = headline(outcomes) if workload == "chat" else ([], [])
        if ratios:
            console.print(rich_table(f"{workload}: headline ratios", RATIO_COLUMNS, ratios))
        if goals:
            console.print(rich_table(f"{workload}: goals", GOAL_COLUMNS, goals))
    goals = issue_goals(results)
    if goals:
        title = "Goals of the issues: median (min–max) over rounds, judged on the median"
        console.print(rich_table(title, GOAL_COLUMNS, goals))
    for name, note in info["notes"].items():
        console.print(f"[dim]{name}: {note}[/]")
    for workload, outcomes in results.items():
        for o in outcomes.values():
            if o.ttft_note:
                console.print(f"[dim]{workload} {o.name}: {o.ttft_note}[/]")


GOAL_COLUMNS = ["goal", "measured", "target", ""]


def _added_rounds(results: Results, workload: str, target: str, part: str = "c1") -> list[float]:
    """Round by round, `target` − direct on `workload` (µs): empty when either is missing."""
    outcomes = results.get(workload, {})
    mine, direct = outcomes.get(target), outcomes.get("direct")
    if mine is None or direct is None:
        return []
    return per_round(mine, direct, part, "p50_us", as_ratio=False)


def _rps_rounds(
    results: Results, workload: str, target: str, reference: str, part: str = "c64"
) -> list[float]:
    """Round by round, `target`'s c64 req/s ÷ `reference`'s on `workload` (`part`: each alone,
    or "side", the two side by side)."""
    outcomes = results.get(workload, {})
    mine, other = outcomes.get(target), outcomes.get(reference)
    if mine is None or other is None:
        return []
    return per_round(mine, other, part, "rps", as_ratio=True)


def _paired(a: list[float], b: list[float], combine: Any) -> list[float]:
    return [combine(x, y) for x, y in zip(a, b, strict=False) if y]


def issue_goals(results: Results) -> list[list[str]]:
    """The goals of the turn, Messages and shadow issues, each as median (min–max) over rounds
    of a figure computed round by round (added latencies against the same round's direct,
    throughput against the same round's reference), judged on the median."""
    rows: list[list[str]] = []

    def goal(name: str, values: list[float], render: Any, target: str, ok: Any) -> None:
        # `ok` None: a figure shown beside a goal's, not judged itself.
        if not values:
            return
        middle = statistics.median(values)
        verdict = "–" if ok is None else "met" if ok(middle) else "MISSED"
        rows.append([name, spread(values, render), target, verdict])

    def times(r: float) -> str:
        return f"{r:.2f}×"

    def share(r: float) -> str:
        return f"{r:.0%}"

    def signed_ms(us: float) -> str:
        return f"{us / 1000:+.3f}"

    ts = "toolsentry"
    chat_added = _added_rounds(results, "chat", ts)
    for workload, versus, label in RATIO_GOALS:
        ratio_rounds = _paired(
            _added_rounds(results, workload, ts, "interleaved"),
            _added_rounds(results, versus, ts, "interleaved"),
            lambda x, y: x / y,
        )
        goal(
            f"{label}: added c1 p50 ÷ chat's on the same body size (requests interleaved)",
            ratio_rounds,
            times,
            f"≤ {GOAL_PROTOCOL_ADDED:.1f}×",
            lambda m: m <= GOAL_PROTOCOL_ADDED,
        )
    for workload in ("chat", "responses", "messages", "chat-large", "messages-large"):
        goal(
            f"{workload}: c64 req/s ÷ pass-aiohttp",
            _rps_rounds(results, workload, ts, "pass-aiohttp"),
            share,
            f"≥ {GOAL_PROTOCOL_THROUGHPUT:.0%}",
            lambda m: m >= GOAL_PROTOCOL_THROUGHPUT,
        )
    goal(
        "messages-large (Claude Code, 75 kB): added c1 p50 ms",
        _added_rounds(results, "messages-large", ts),
        ms,
        f"≤ {GOAL_LARGE_ADDED_MS:.1f} ms",
        lambda m: m / 1000 <= GOAL_LARGE_ADDED_MS,
    )
    goal(
        "chat: c64 req/s ÷ before the refactor (--baseline)",
        _rps_rounds(results, "chat", ts, BASELINE),
        times,
        f"≥ {GOAL_NO_SLOWER:.2f}× (no slower, 5% for noise)",
        lambda m: m >= GOAL_NO_SLOWER,
    )
    goal(
        "chat: added c1 p50 ÷ before the refactor (--baseline)",
        _paired(chat_added, _added_rounds(results, "chat", BASELINE), lambda x, y: x / y),
        times,
        f"≤ {1 / GOAL_NO_SLOWER:.2f}× (no slower, 5% for noise)",
        lambda m: m <= 1 / GOAL_NO_SLOWER,
    )
    for workload in ("chat", "responses", "messages"):
        goal(
            f"{workload}: added TTFT p50 ms",
            _added_rounds(results, workload, ts, "ttft"),
            ms,
            f"< {GOAL_ADDED_TTFT_MS:.1f} ms",
            lambda m: m / 1000 < GOAL_ADDED_TTFT_MS,
        )
    goal(
        "shadowing on (every request): added c1 p50 − off, ms",
        _paired(_added_rounds(results, "chat", SHADOW), chat_added, lambda x, y: x - y),
        signed_ms,
        f"≤ {GOAL_SHADOW_ADDED_P50_MS} ms",
        lambda m: m / 1000 <= GOAL_SHADOW_ADDED_P50_MS,
    )
    goal(
        "shadowing on: c64 req/s ÷ off, the two side by side on one core",
        _rps_rounds(results, SIDE_BY_SIDE_WORKLOAD, SHADOW, ts, part="side"),
        share,
        f"≥ {GOAL_SHADOW_THROUGHPUT:.0%}",
        lambda m: m >= GOAL_SHADOW_THROUGHPUT,
    )
    goal(
        "shadowing on: c64 req/s ÷ off, each alone in turn (not judged)",
        _rps_rounds(results, "chat", SHADOW, ts),
        share,
        "(judged side by side)",
        None,
    )
    return rows


def rich_table(
    title: str,
    header: Sequence[str],
    body: Iterable[Sequence[str | None]],
    *,
    text_columns: Collection[str] | None = None,
) -> Table:
    """A table for the terminal; with `text_columns`, those are left-aligned and the rest
    (figures) right-aligned."""
    table = Table(title=title)
    for column in header:
        if text_columns is None:
            table.add_column(column)
        else:
            text = column in text_columns
            table.add_column(column, justify="left" if text else "right", no_wrap=text)
    for row in body:
        table.add_row(*row)
    return table


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in body]
    return "\n".join(lines)


def machine() -> str:
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} CPUs (`nproc`), {model}, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def results_header() -> str:
    return (
        "# Benchmark results\n\n"
        f"Created {dt.date.today().isoformat()} on {machine()}.\n\n"
        "The machine is shared with other work, so every comparison runs side by side in one run\n"
        "and the ratios are the figures to trust; absolute numbers drift from run to run.\n\n"
        "Commands (from the repository root, with the project's virtualenv active):\n\n"
        "```\n"
        "python -m bench.overhead          # proxy overhead: direct, toolsentry, pass-throughs, LiteLLM\n"
        "python -m bench.validate          # validator choice and the guard's per-call cost\n"
        "make bench                        # both\n"
        "```\n\n"
        "Sections below are written by the scripts (between their markers) or by hand.\n"
    )


def section(results: Results, info: dict[str, Any], argv: list[str]) -> str:
    notes = [f"- {name}: {note}" for name, note in info["notes"].items()]
    notes += [
        f"- {workload} {o.name}: {o.ttft_note}"
        for workload, outcomes in results.items()
        for o in outcomes.values()
        if o.ttft_note
    ]
    sizes = ", ".join(
        f"{name} {len(WORKLOADS[name].body()) / 1000:.1f} kB on `{WORKLOADS[name].route}`"
        for name in results
    )
    parts = [
        SECTION_BEGIN,
        "## Proxy overhead (bench/overhead.py)",
        "",
        f"{dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M')} UTC, {machine()}; wrk {wrk_version()}.",
        f"Command: `{' '.join(['python -m bench.overhead', *argv])}`; load average at start "
        f"{info['load']}, at the end {info.get('load_end', '?')}, {info.get('seconds', 0):.0f} s",
        "(other work on the machine: the higher it is, the more the absolute figures stretch).",
        f"Placement: {info['placement']}. Concurrency 1 and {HIGH_CONCURRENCY} from wrk (one thread),",
        f"{info['duration']} s each, {info['rounds']} rounds in rotating order, medians shown; added = target − direct",
        "of the same round. TTFT: streamed requests one at a time, first content byte (bench/ttft.py).",
        f"Bodies (bench/bodies.py): {sizes}.",
        "",
    ]
    goals = issue_goals(results)
    if goals:
        parts += [
            "Goals of the issues, each a median (min–max) over rounds of a figure computed round",
            "by round, judged on the median:",
            "",
            markdown_table(GOAL_COLUMNS, goals),
            "",
        ]
    for workload, outcomes in results.items():
        parts += [
            f"### {workload} (`{WORKLOADS[workload].route}`)",
            "",
            markdown_table(COLUMNS, rows(outcomes)),
            "",
        ]
        spreads = spread_rows(outcomes)
        if spreads:
            parts += [
                "Per round, median (min–max) over rounds (each round against its own direct and",
                "aiohttp pass-through):",
                "",
                markdown_table(SPREAD_COLUMNS, spreads),
                "",
            ]
        ratios, goals = headline(outcomes) if workload == "chat" else ([], [])
        if ratios:
            parts += [markdown_table(list(RATIO_COLUMNS), ratios), ""]
        if goals:
            parts += [markdown_table(GOAL_COLUMNS, goals), ""]
    if notes:
        parts += [*notes, ""]
    parts.append(SECTION_END)
    return "\n".join(parts)


def wrk_version() -> str:
    done = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
    first = (done.stdout or done.stderr).strip().splitlines()
    return first[0].split(" [")[0].removeprefix("wrk ") if first else "?"


def write_results(path: Path, text: str) -> None:
    current = path.read_text() if path.exists() else results_header()
    if SECTION_BEGIN in current and SECTION_END in current:
        before, rest = current.split(SECTION_BEGIN, 1)
        after = rest.split(SECTION_END, 1)[1]
        current = before + text + after
    else:
        current = current.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(current)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
