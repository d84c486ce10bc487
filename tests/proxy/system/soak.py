"""Soak: many requests through a real proxy process in front of a scripted upstream process.

A deterministic mix of valid, repairable (an unknown tool the re-ask fixes) and unrepairable
(an unknown tool every time) calls, spread over many sessions. At the end every session's
counts and the proxy's `/metrics` must equal the scripted truth exactly; the proxy's resident
memory is sampled throughout. Half of each kind asks for `stream: true`; a streamed answer's
tool call is read from its deltas and its accounting from the `: x-toolsentry {...}` comment
before `[DONE]`, and must match the scripted truth as exactly as a JSON answer's.

    python -m bench.soak run [--requests 20000] [--concurrency 100] [--store memory]
                             [--results bench/RESULTS.md]
    python -m bench.soak upstream --port N     (the scripted upstream; used by `run`)

It lives with the tests because its subject is a correctness property (tests/proxy/system/
test_soak.py runs it small); `python -m bench.soak` runs this module as a program of its own, so
that neither tree imports the other.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from proxy.testing import LoopbackServer, ScriptedUpstream, completion, free_port, tool_call

REPO = Path(__file__).resolve().parents[3]
MODEL = "soak-model"
SESSIONS = 100
RETRIES = 2  # per request, on a connection error (the OpenAI SDK's default)
KINDS = ("valid", "repairable", "unrepairable")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "description": "Look up an order.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
                "additionalProperties": False,
            },
        },
    }
]
GOOD_CALL = ("get_order_details", {"order_id": "#W1"})
BAD_CALL: tuple[str, dict[str, Any]] = ("cancel_everything", {})


def kind_of(i: int) -> str:
    """Request i's kind: 60 % valid, 25 % repairable, 15 % unrepairable, interleaved."""
    slot = i % 20
    return "valid" if slot < 12 else "repairable" if slot < 17 else "unrepairable"


def streams(i: int) -> bool:
    """Whether request i asks for `stream: true`: every other block of 20, so half of each kind."""
    return (i // 20) % 2 == 1


def session_of(i: int) -> str:
    return f"soak-{i % SESSIONS}"


def request_body(kind: str, *, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a retail agent."},
            {"role": "user", "content": f"kind={kind}"},
        ],
        "tools": TOOLS,
    }
    if stream:
        body["stream"] = True
    return body


def read_stream(body: bytes) -> tuple[list[str], dict[str, Any] | None, list[str]]:
    """A streamed answer's tool-call names (from the deltas), its `: x-toolsentry` accounting
    (None when absent) and its problems: error events, a missing `[DONE]`."""
    names: list[str] = []
    accounting: dict[str, Any] | None = None
    problems: list[str] = []
    done = False
    for line in body.decode().splitlines():
        if line.startswith(": x-toolsentry "):
            accounting = orjson.loads(line.removeprefix(": x-toolsentry "))
        elif line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            event = orjson.loads(line.removeprefix("data: "))
            if "error" in event:
                problems.append(f"error event {event['error']}")
            for choice in event.get("choices") or []:
                for call in (choice.get("delta") or {}).get("tool_calls") or []:
                    name = (call.get("function") or {}).get("name")
                    if name:
                        names.append(name)
    if not done:
        problems.append("no [DONE]")
    return names, accounting, problems


# -- the upstream process ------------------------------------------------------------------------


def upstream_reply(body: dict[str, Any]) -> dict[str, Any]:
    """The upstream's answer: the kind is in the first user message; a re-ask ends in a
    corrective `role: tool` message."""
    kind = body["messages"][1]["content"].removeprefix("kind=")
    reask = body["messages"][-1]["role"] == "tool"
    good = kind == "valid" or (kind == "repairable" and reask)
    name, arguments = GOOD_CALL if good else BAD_CALL
    return completion(tool_calls=[tool_call(name, arguments)], model=MODEL)


def serve_upstream(port: int) -> None:
    """Serve the scripted upstream until stdin closes; then print how many calls it answered."""
    calls = 0

    def handler(body: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        script.requests.clear()  # a soak must not measure the upstream's own bookkeeping
        script.request_headers.clear()
        script.paths.clear()
        return upstream_reply(body)

    script = ScriptedUpstream(handler=handler, models=(MODEL,))
    with LoopbackServer(script.app, port=port):
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        sys.stdin.read()
    sys.stdout.write(f"calls {calls}\n")


# -- the run -------------------------------------------------------------------------------------


@dataclass
class SoakReport:
    requests: int
    concurrency: int
    store: str
    seconds: float
    statuses: Counter[int]
    sent: Counter[str]  # requests per kind
    upstream_calls: int
    mismatches: list[str]
    rss_kib: list[tuple[int, int]] = field(default_factory=list)  # (requests done, VmRSS KiB)
    load_average: float = 0.0  # the machine's 1-minute load average when the load ended
    streamed: Counter[str] = field(default_factory=Counter)  # `stream: true` requests per kind
    retried: list[str] = field(default_factory=list)  # connection errors retried, one line each

    @property
    def exact(self) -> bool:
        return not self.mismatches

    def rss_at(self, fraction: float) -> int:
        """The RSS sampled when `fraction` of the requests had completed (KiB)."""
        wanted = self.requests * fraction
        for done, rss in self.rss_kib:
            if done >= wanted:
                return rss
        return self.rss_kib[-1][1]

    @property
    def peak_rss_kib(self) -> int:
        return max(rss for _, rss in self.rss_kib)


def rss_kib(pid: int) -> int:
    """VmRSS of a process, in KiB (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) if match else 0


def metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.match(r"^(\w+)\{([^}]*)\} (\S+)$", line)
        if match and match.group(1) == name and ",".join(sorted(match.group(2).split(","))) == want:
            return float(match.group(3))
    return 0.0


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"proxy did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


async def _load(
    url: str, requests: int, concurrency: int, proxy_pid: int, report: SoakReport
) -> None:
    gate = asyncio.Semaphore(concurrency)
    done = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def sample() -> None:
        while True:
            report.rss_kib.append((done, rss_kib(proxy_pid)))
            await asyncio.sleep(0.25)

    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def exchange(i: int, kind: str, stream: bool) -> tuple[httpx.Response, bytes]:
            # A connection error is retried, as the OpenAI SDK does: under a stalled machine the
            # server's keep-alive timeout can close a pooled connection as a request goes out on
            # it. A retry of a request the proxy had already seen would break the exact counts.
            for attempt in range(RETRIES + 1):
                request = client.build_request(
                    "POST",
                    "/v1/chat/completions",
                    json=request_body(kind, stream=stream),
                    headers={"x-session-id": session_of(i)},
                )
                try:
                    response = await client.send(request, stream=True)
                    try:
                        return response, await response.aread()
                    finally:
                        await response.aclose()
                except httpx.TransportError as exc:
                    if attempt == RETRIES:
                        raise
                    report.retried.append(f"request {i}: {type(exc).__name__} {exc}")
            raise AssertionError("unreachable")

        async def one(i: int) -> None:
            nonlocal done
            kind, stream = kind_of(i), streams(i)
            async with gate:
                response, body = await exchange(i, kind, stream)
            done += 1
            report.statuses[response.status_code] += 1
            report.sent[kind] += 1
            report.streamed[kind] += int(stream)
            if response.status_code != 200:
                report.mismatches.append(f"request {i}: {response.status_code} {body[:500]!r}")
                return
            expected = BAD_CALL[0] if kind == "unrepairable" else GOOD_CALL[0]
            channels = [] if kind == "valid" else ["unknown_tool"]
            if stream:
                names, accounting, problems = read_stream(body)
                violations = None if accounting is None else accounting.get("violations")
                if names != [expected] or violations != channels or problems:
                    report.mismatches.append(
                        f"request {i} ({kind}, streamed): {names}, {accounting}, {problems}"
                    )
                return
            message = orjson.loads(body)["choices"][0]["message"]
            call = message["tool_calls"][0]["function"]["name"]
            header = response.headers["x-toolsentry-violations"]
            if call != expected or header != ",".join(channels):
                report.mismatches.append(f"request {i} ({kind}): {call}, [{header}]")

        sampler = asyncio.create_task(sample())
        try:
            await asyncio.gather(*(one(i) for i in range(requests)))
        finally:
            sampler.cancel()
        report.rss_kib.append((done, rss_kib(proxy_pid)))


def _check_truth(url: str, report: SoakReport) -> None:
    per_session: dict[str, Counter[str]] = {}
    for i in range(report.requests):
        per_session.setdefault(session_of(i), Counter())[kind_of(i)] += 1
    with httpx.Client(base_url=url, timeout=30) as http:
        for session, kinds in per_session.items():
            got = http.get(f"/v1/sessions/{session}").json()
            unknown = kinds["repairable"] + kinds["unrepairable"]
            want = {
                "errors": kinds["unrepairable"],
                "repairs": kinds["repairable"],
                "requests": sum(kinds.values()),
                "channels": {"unknown_tool": unknown} if unknown else {},
            }
            have = {key: got.get(key) for key in want}
            if have != want:
                report.mismatches.append(f"session {session}: {have} != {want}")
        text = http.get("/metrics").text
    sent = report.sent
    truth = {
        ("toolsentry_requests_total", (("status", "200"),)): report.requests,
        ("toolsentry_violations_total", (("channel", "unknown_tool"),)): sent["repairable"]
        + sent["unrepairable"],
        ("toolsentry_repairs_total", (("channel", "unknown_tool"), ("result", "success"))): sent[
            "repairable"
        ],
        ("toolsentry_repairs_total", (("channel", "unknown_tool"), ("result", "failure"))): sent[
            "unrepairable"
        ],
        ("toolsentry_tool_calls_total", (("outcome", "valid"),)): sent["valid"],
        ("toolsentry_tool_calls_total", (("outcome", "repaired"),)): sent["repairable"],
        ("toolsentry_tool_calls_total", (("outcome", "invalid"),)): sent["unrepairable"],
    }
    for (name, labels), want_value in truth.items():
        value = metric(text, name, api="chat", model=MODEL, **dict(labels))
        if value != want_value:
            report.mismatches.append(f"{name}{dict(labels)} = {value}, truth {want_value}")
    calls = sent["valid"] + 2 * sent["repairable"] + 3 * sent["unrepairable"]
    if report.upstream_calls != calls:
        report.mismatches.append(f"upstream answered {report.upstream_calls} calls, truth {calls}")


def run_soak(
    requests: int, concurrency: int, *, store: str = "memory", workdir: Path | None = None
) -> SoakReport:
    """Start an upstream process and a proxy process, drive the load, check the truth.

    Returns the report; `report.mismatches` lists every count that differs from the truth.
    Raises RuntimeError when a process does not start.
    """
    workdir = workdir or Path(tempfile.mkdtemp(prefix="toolsentry-soak-"))
    upstream_port, proxy_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLSENTRY_")}
    upstream = subprocess.Popen(
        [sys.executable, "-m", "tests.proxy.system.soak", "upstream", "--port", str(upstream_port)],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    log_path = workdir / "proxy.log"
    proxy: subprocess.Popen[bytes] | None = None
    report = SoakReport(requests, concurrency, store, 0.0, Counter(), Counter(), 0, [])
    try:
        assert upstream.stdout is not None
        if upstream.stdout.readline().strip() != b"ready":
            raise RuntimeError("the scripted upstream did not start")
        with log_path.open("wb") as log:
            command = [sys.executable, "-m", "proxy.cli", "serve", "--port", str(proxy_port)]
            options = ["--upstream", f"http://127.0.0.1:{upstream_port}/v1", "--store", store]
            proxy = subprocess.Popen(
                # Every unrepairable call reaches its client (the scripted truth the counts
                # are checked against), whatever the default for undeclared tools.
                [*command, *options, "--max-errors", "1000000", "--on-unrepaired", "passthrough"],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{proxy_port}"
        _wait_ready(url, proxy, log_path)
        started = time.perf_counter()
        asyncio.run(_load(url, requests, concurrency, proxy.pid, report))
        report.seconds = time.perf_counter() - started
        report.load_average = os.getloadavg()[0]
        assert upstream.stdin is not None
        upstream.stdin.close()
        tail = upstream.stdout.read().decode().split()
        report.upstream_calls = int(tail[-1]) if tail[-2:-1] == ["calls"] else -1
        _check_truth(url, report)
    finally:
        if proxy is not None and proxy.poll() is None:
            proxy.terminate()
            proxy.wait(timeout=30)
        if upstream.poll() is None:
            if upstream.stdin is not None and not upstream.stdin.closed:
                upstream.stdin.close()
            try:
                upstream.wait(timeout=30)
            except subprocess.TimeoutExpired:
                upstream.kill()
                upstream.wait()
        if upstream.stdout is not None:
            upstream.stdout.close()
    return report


def describe(report: SoakReport) -> str:
    """The figures as a Markdown section headed "Soak"."""
    mib = 1024
    warm = report.rss_at(0.1)
    half = report.rss_at(0.5)
    end = report.rss_kib[-1][1]
    sent = report.sent
    lines = [
        "## Soak",
        "",
        f"`python -m bench.soak run --requests {report.requests} --concurrency "
        f"{report.concurrency} --store {report.store}` — one proxy process (`toolsentry serve`, "
        "repair on, max_reasks 2) in front of one scripted upstream process, all on loopback, "
        f"{SESSIONS} sessions; half of each kind streamed (`stream: true`, checked through the "
        "`: x-toolsentry` comment before `[DONE]`). "
        f"Machine: {platform.machine()}, {os.cpu_count()} cores shared with other work (load "
        f"average {report.load_average:.1f} at the end of the run; the load generator runs on "
        f"the same cores), Python {platform.python_version()}.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| requests (valid / repairable / unrepairable) | {report.requests:,} "
        f"({sent['valid']:,} / {sent['repairable']:,} / {sent['unrepairable']:,}) |",
        f"| of which streamed (valid / repairable / unrepairable) | "
        f"{sum(report.streamed.values()):,} ({report.streamed['valid']:,} / "
        f"{report.streamed['repairable']:,} / {report.streamed['unrepairable']:,}) |",
        f"| upstream calls | {report.upstream_calls:,} |",
        f"| HTTP statuses | {dict(sorted(report.statuses.items()))} |",
        f"| connection errors retried by the client (as the OpenAI SDK does) | "
        f"{len(report.retried)} |",
        f"| counts equal to the scripted truth | {'yes, exactly' if report.exact else 'NO'} "
        f"({len(report.mismatches)} mismatches: sessions, /metrics, upstream calls) |",
        f"| wall time | {report.seconds:.1f} s ({report.requests / report.seconds:,.0f} requests/s) |",
        f"| proxy RSS after 10 % / 50 % / 100 % of requests | {warm / mib:.1f} / {half / mib:.1f}"
        f" / {end / mib:.1f} MiB |",
        f"| proxy RSS peak | {report.peak_rss_kib / mib:.1f} MiB |",
        f"| RSS growth over the second half | {(end - half) / mib:+.1f} MiB |",
        "",
    ]
    return "\n".join(lines)


def write_section(path: Path, section: str) -> None:
    """Replace the "## Soak" section of `path` (or append it), leaving other sections alone.

    The section ends at the next `## ` heading or `<!-- ` marker line (another tool's section)."""
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(r"^## Soak\n.*?(?=^## |^<!-- |\Z)", re.MULTILINE | re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1)
    else:
        text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + section
    path.write_text(text.rstrip("\n") + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the soak and print the figures")
    run.add_argument("--requests", type=int, default=20_000)
    run.add_argument("--concurrency", type=int, default=100)
    run.add_argument("--store", default="memory")
    run.add_argument("--results", type=Path, help="write the figures into this Markdown file")
    upstream = commands.add_parser("upstream", help="serve the scripted upstream")
    upstream.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    if args.command == "upstream":
        serve_upstream(args.port)
        return
    report = run_soak(args.requests, args.concurrency, store=args.store)
    section = describe(report)
    sys.stdout.write(section + "\n")
    for mismatch in report.mismatches[:20]:
        sys.stdout.write(f"mismatch: {mismatch}\n")
    for retried in report.retried[:20]:
        sys.stdout.write(f"retried: {retried}\n")
    if args.results is not None:
        write_section(args.results, section)
    sys.exit(0 if report.exact else 1)


if __name__ == "__main__":
    main()
