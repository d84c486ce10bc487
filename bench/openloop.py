"""A constant-rate (open-loop) load generator: requests go out on a fixed schedule whatever the
server does, and each latency is timed from the request's *scheduled* send time, so a request
that waits for a free connection, or behind a slow server, counts its wait.

A closed loop (wrk) hides queueing: its clients wait for the server. A generator that sends in
bursts (`hey -q` sends each worker's requests every 20 ms) is not constant-rate either. None in
the registries this project reaches (Debian, PyPI, npm) times from the schedule (wrk2 is not in
Debian), so this is the project's own: `--processes` processes (one per load core), each with
its share of `--connections` keep-alive HTTP/1.1 connections on an asyncio loop (uvloop). The
schedule is `send_times`: request i of the run is due at `i / rate`, the processes taking every
`processes`-th request in turn, so the sum of all is one evenly spaced stream. In each process a
thread sleeps (`time.sleep`, sub-millisecond) to each due time and hands the due requests to the
loop, because the loop's own timers wake at millisecond granularity; a connection that is free
takes the next due request, else it waits in line (and its wait counts).

What it prints (one JSON line) also checks the generator itself: how late each request was
handed to the loop against its schedule (`dispatch_lag_us`), and the requests handed over in
each 50 ms window as a share of the rate (`window_min`, `window_max`), so that a run whose
generator could not keep the rate says so. Requests due in `--warmup` seconds are sent but not
counted; requests unanswered `--drain` seconds after the last is due are cut and counted apart.

    python -m bench.openloop --url http://127.0.0.1:9101/v1/chat/completions --body body.json \\
        --rate 2000 --seconds 5 [--warmup 2] [--connections 256] [--processes 1]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import ctypes
import multiprocessing
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import uvloop

from bench.drivers import post_request

WINDOW = 0.05
"""Seconds of the windows whose dispatched requests the constant-rate check counts."""


def send_times(rate: float, seconds: float, process: int = 0, processes: int = 1) -> list[float]:
    """The due times (seconds from the start) of process `process`'s requests: request i of
    the whole run is due at `i / rate` for every i with `i / rate < seconds`, and process p
    sends those with `i % processes == p`. Together the processes send `ceil(rate * seconds)`
    requests, evenly spaced `1 / rate` apart."""
    total = int(-(-rate * seconds // 1))
    return [i / rate for i in range(process, total, processes)]


@dataclass
class Record:
    """One process's run: per counted request its latency from the schedule, and the
    generator's own timing."""

    latencies_us: list[float] = field(default_factory=list)
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    dispatch_lag_us: list[float] = field(default_factory=list)
    dispatched_at: list[float] = field(default_factory=list)  # seconds from the start, counted
    sent: int = 0  # counted requests written
    unanswered: int = 0  # counted requests cut at the end
    warmup_answered: int = 0
    in_window: int = 0  # counted requests answered 200 before the schedule's end
    errors: list[str] = field(default_factory=list)


class Connection:
    """One keep-alive HTTP/1.1 connection posting the same body; an answer is framed by its
    Content-Length (the servers measured answer that way)."""

    def __init__(self, host: str, port: int, request: bytes) -> None:
        self.host, self.port, self.request = host, port, request
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self) -> int:
        """Send the request and read its answer; the status."""
        if self.writer is None or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.reader, self.writer
        writer.write(self.request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        close = False
        for line in head.lower().split(b"\r\n"):
            if line.startswith(b"content-length:"):
                length = int(line[15:])
            elif line.startswith(b"connection:") and b"close" in line:
                close = True
        await reader.readexactly(length)
        if close:
            self.close()
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _run_part(args: dict[str, Any], process: int, start: float) -> Record:
    """One process's share: its connections, its schedule, its record."""
    host, port, request = post_request(args["url"], args["body"])
    warmup, drain = args["warmup"], args["drain"]
    record_end = warmup + args["seconds"]
    due = send_times(args["rate"], warmup + args["seconds"], process, args["processes"])
    record = Record()
    loop = asyncio.get_running_loop()
    line: collections.deque[float] = collections.deque()
    ready = asyncio.Event()

    def hand_over(batch: list[float]) -> None:
        now = time.monotonic()
        for at in batch:
            if at >= warmup:
                record.dispatch_lag_us.append((now - start - at) * 1e6)
                record.dispatched_at.append(now - start)
        line.extend(batch)
        ready.set()

    def dispatcher() -> None:
        # time.sleep is precise to tens of µs, the loop's timers to a millisecond.
        _tight_timer_slack()
        i = 0
        while i < len(due):
            wait = start + due[i] - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            now = time.monotonic() - start
            j = i
            while j < len(due) and due[j] <= now:
                j += 1
            loop.call_soon_threadsafe(hand_over, due[i:j])
            i = j

    async def serve_line(connection: Connection) -> None:
        while True:
            while not line:
                ready.clear()
                await ready.wait()
            at = line.popleft()
            counted = at >= warmup
            record.sent += counted
            try:
                status = await connection.post()
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                connection.close()
                status = 0
                if len(record.errors) < 5:
                    record.errors.append(f"{type(exc).__name__}: {exc}")
            if counted:
                done = time.monotonic() - start
                record.latencies_us.append((done - at) * 1e6)
                record.statuses[status] += 1
                if status == 200 and done <= record_end:
                    record.in_window += 1
            else:
                record.warmup_answered += 1

    connections = [Connection(host, port, request) for _ in range(args["connections"])]
    workers = [asyncio.create_task(serve_line(c)) for c in connections]
    thread = threading.Thread(target=dispatcher, daemon=True)
    await asyncio.sleep(max(0.0, start - time.monotonic()))
    thread.start()
    end = start + warmup + args["seconds"] + drain
    while time.monotonic() < end:
        await asyncio.sleep(0.05)
        answered = len(record.latencies_us) + record.warmup_answered
        if not thread.is_alive() and not line and answered >= len(due):
            break
    record.unanswered = record.sent + len(line) - len(record.latencies_us)
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    for connection in connections:
        connection.close()
    return record


def _tight_timer_slack() -> None:
    """Let this thread's sleeps end within a microsecond of their time (Linux's default slack,
    50 µs, would make every dispatch late by up to that)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)


PR_SET_TIMERSLACK = 29


def _part(args: dict[str, Any], process: int, start: float) -> Record:
    sys.setswitchinterval(2e-5)  # hand the GIL to the dispatcher thread promptly
    return uvloop.run(_run_part(args, process, start))


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def summarize(
    records: Sequence[Record], rate: float, seconds: float, warmup: float
) -> dict[str, Any]:
    """One run's figures over all processes: latency percentiles (µs from the schedule), the
    achieved rate (answered 200s a second over the counted time), and the generator's check."""
    latencies = [v for r in records for v in r.latencies_us]
    statuses: collections.Counter[int] = collections.Counter()
    for r in records:
        statuses.update(r.statuses)
    lags = [v for r in records for v in r.dispatch_lag_us]
    windows = collections.Counter(
        int((t - warmup) / WINDOW) for r in records for t in r.dispatched_at
    )
    full = int(seconds / WINDOW)
    per_window = [windows.get(w, 0) / (rate * WINDOW) for w in range(full)]
    scheduled = len(send_times(rate, warmup + seconds)) - len(send_times(rate, warmup))
    return {
        "rate": rate,
        "seconds": seconds,
        "scheduled": scheduled,
        "sent": sum(r.sent for r in records),
        "answered": len(latencies),
        "ok": statuses.get(200, 0),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "unanswered": sum(r.unanswered for r in records),
        "warmup_answered": sum(r.warmup_answered for r in records),
        # What the server kept up with: answers within the scheduled time, not in the drain.
        "achieved": sum(r.in_window for r in records) / seconds,
        "p50_us": _percentile(latencies, 50),
        "p99_us": _percentile(latencies, 99),
        "p999_us": _percentile(latencies, 99.9),
        "dispatch_lag_p50_us": _percentile(lags, 50),
        "dispatch_lag_p99_us": _percentile(lags, 99),
        "window_min": min(per_window, default=float("nan")),
        "window_max": max(per_window, default=float("nan")),
        "window_median": statistics.median(per_window) if per_window else float("nan"),
        "errors": [e for r in records for e in r.errors][:5],
    }


def run(
    url: str,
    body: bytes,
    *,
    rate: float,
    seconds: float,
    warmup: float = 2.0,
    connections: int = 256,
    processes: int = 1,
    drain: float = 5.0,
) -> dict[str, Any]:
    """Run the schedule against `url` from `processes` processes; `summarize`'s figures."""
    args = {
        "url": url,
        "body": body,
        "rate": rate,
        "seconds": seconds,
        "warmup": warmup,
        "drain": drain,
        "processes": processes,
        "connections": max(1, connections // processes),
    }
    start = time.monotonic() + 0.5  # CLOCK_MONOTONIC is one clock for every process
    if processes == 1:
        records = [_part(args, 0, start)]
    else:
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            records = pool.starmap(_part, [(args, p, start) for p in range(processes)])
    return summarize(records, rate, seconds, warmup)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.openloop", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--url", required=True)
    parser.add_argument("--body", type=Path, required=True, help="file with the JSON body")
    parser.add_argument("--rate", type=float, required=True, help="requests a second")
    parser.add_argument("--seconds", type=float, default=5.0, help="counted seconds [5]")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds not counted [2]")
    parser.add_argument("--connections", type=int, default=256, help="in all [256]")
    parser.add_argument("--processes", type=int, default=1, help="[1]")
    parser.add_argument(
        "--drain", type=float, default=5.0, help="seconds to wait for the last answers [5]"
    )
    args = parser.parse_args(argv)
    result = run(
        args.url,
        args.body.read_bytes(),
        rate=args.rate,
        seconds=args.seconds,
        warmup=args.warmup,
        connections=args.connections,
        processes=args.processes,
        drain=args.drain,
    )
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
