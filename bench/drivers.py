"""The benchmarks' request drivers: one module, one mode per way of putting load on a server.

- `run_wrk` (and `side_by_side`, several at once): wrk with bench/wrk_post.lua, throughput and
  latency percentiles under load;
- `KeepAlive`: a blocking keep-alive socket, one request at a time, the answer framed by its
  Content-Length (interleaved latencies: two targets measured milliseconds apart);
- `first_token_latencies` (`run_ttft` in a pinned process): a blocking socket reading a streamed
  answer of any of the three protocols to the first token and to its end;
- `StreamTimer`: an asyncio keep-alive connection timing every event of a chat stream;
- `AsgiDriver`: no socket at all, one POST handed to an ASGI app in process, so that what is
  measured is the app's own code.

The clients the benchmarks *compare* (aiohttp, httpx, the proxy's own upstream client, the openai
SDK of a live run) are not drivers and stay with the benchmark that measures them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
from starlette.types import ASGIApp, Message

from bench.fake_upstream import FIRST_TOKEN
from bench.processes import ROOT, Server, pinned

LUA = ROOT / "bench" / "wrk_post.lua"
HIGH_CONCURRENCY = 64
"""The concurrency of every benchmark's load (wrk's connections)."""
_MARK = FIRST_TOKEN.encode()
_END = re.compile(rb"\[DONE\]|response\.completed|message_stop")

# -- wrk ------------------------------------------------------------------------------------------


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def run_wrk(
    url: str, body_file: Path, connections: int, seconds: float, cpus: str, threads: int = 1
) -> dict[str, float]:
    """One wrk run (`threads` threads); returns its summary (latencies in µs) plus requests/s."""
    argv = pinned(
        cpus,
        [
            "wrk",
            f"-t{threads}",
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


def wrk_version() -> str:
    done = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
    first = (done.stdout or done.stderr).strip().splitlines()
    return first[0].split(" [")[0].removeprefix("wrk ") if first else "?"


def side_by_side(
    servers: Sequence[Server],
    route: str,
    body_file: Path,
    seconds: float,
    cpus: str,
    connections: int = HIGH_CONCURRENCY,
) -> list[float]:
    """The requests/s of each of `servers` (running), all under load at once: a wrk of its own
    each at `connections` for `seconds`, after two seconds of warm-up, also all at once (a
    shadowing proxy's first seconds at c64 open its connections to the reference)."""
    with concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:

        def run(duration: float) -> list[dict[str, float]]:
            return list(
                pool.map(
                    lambda server: run_wrk(
                        server.url_for(route), body_file, connections, duration, cpus
                    ),
                    servers,
                )
            )

        run(2)  # warm-up
        return [measured["rps"] for measured in run(seconds)]


# -- one request at a time ---------------------------------------------------------------------


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


class StreamError(Exception):
    """The server did not answer with a complete stream."""


def _connect(host: str, port: int) -> socket.socket:
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def first_token(sock: socket.socket, request: bytes) -> tuple[float, bool]:
    """Send one request; return (seconds to the first token, whether the connection stays open)."""
    start = time.perf_counter()
    sock.sendall(request)
    buffer = b""
    first: float | None = None
    while b"\r\n\r\n" not in buffer:
        data = sock.recv(65536)
        if not data:
            raise StreamError("connection closed before the response headers")
        buffer += data
    head, _, body = buffer.partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1]
    headers = head.lower()
    if status != b"200":
        # Read the error body (it may follow the headers in a later packet) to say why.
        for line in headers.split(b"\r\n"):
            if line.startswith(b"content-length:"):
                while len(body) < min(int(line.split(b":", 1)[1]), 300):
                    data = sock.recv(65536)
                    if not data:
                        break
                    body += data
        raise StreamError(f"status {status.decode()}: {body[:300].decode(errors='replace')}")
    chunked = b"transfer-encoding: chunked" in headers
    length: int | None = None
    for line in headers.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    while True:
        if first is None and _MARK in body:
            first = time.perf_counter() - start
        # A chat stream ends with `[DONE]`, Responses with `response.completed`, Messages with
        # `message_stop`.
        if chunked and body.endswith(b"0\r\n\r\n") and _END.search(body):
            break
        if length is not None and len(body) >= length:
            break
        data = sock.recv(65536)
        if not data:
            if length is None and not chunked:
                break
            raise StreamError("connection closed inside the stream")
        body += data
    if first is None:
        raise StreamError(f"the stream never carried the first token: {body[:300]!r}")
    keep = b"connection: close" not in headers and (chunked or length is not None)
    return first, keep


def post_request(url: str, body: bytes, headers: str = "") -> tuple[str, int, bytes]:
    """(host, port, the bytes of a keep-alive POST of the JSON `body` to `url`); `headers` are
    more header lines, each ending in CRLF."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    head = (
        f"POST {target} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"{headers}content-length: {len(body)}\r\n\r\n"
    )
    return host, port, head.encode() + body


def first_token_latencies(url: str, body: bytes, requests: int) -> dict[str, float]:
    """Run `requests` streamed requests one after another; return percentiles in microseconds."""
    host, port, request = post_request(url, body, "accept: text/event-stream\r\n")
    sock = _connect(host, port)
    samples: list[float] = []
    try:
        for _ in range(requests):
            seconds, keep = first_token(sock, request)
            samples.append(seconds * 1e6)
            if not keep:
                sock.close()
                sock = _connect(host, port)
    finally:
        sock.close()
    samples.sort()
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return {"n": len(samples), "p50_us": cuts[49], "p90_us": cuts[89], "p99_us": cuts[98]}


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
class Timed:
    ttft: float  # seconds from the request sent to the first content delta
    total: float  # seconds from the request sent to the end of the body
    latencies: list[float]  # per stamped chunk: arrival minus the upstream's stamp, seconds


class StreamTimer:
    """One keep-alive HTTP/1.1 connection (asyncio streams) that reads a chunked chat SSE body,
    timing the first content delta and every delta against the upstream's stamp `t`."""

    def __init__(self, port: int, path: str = "/v1/chat/completions") -> None:
        self.port = port
        self.path = path
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, body: dict[str, Any]) -> Timed:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self._reader, self._writer
        assert reader is not None
        data = orjson.dumps(body)
        head = (
            f"POST {self.path} HTTP/1.1\r\nhost: 127.0.0.1:{self.port}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(data)}\r\n"
            "x-session-id: bench\r\n\r\n"
        ).encode()
        start = time.monotonic_ns()
        writer.write(head + data)
        status_line = await reader.readuntil(b"\r\n")
        if b" 200 " not in status_line:
            raise RuntimeError(f"bench request failed: {status_line!r}")
        chunked, length = False, 0
        while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
            chunked |= line.lower().startswith(b"transfer-encoding: chunked")
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        if not chunked:  # a non-streamed answer
            await reader.readexactly(length)
            total = (time.monotonic_ns() - start) / 1e9
            return Timed(total, total, [])
        ttft, latencies, pending = 0, [], b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            payload = (await reader.readexactly(size + 2))[:-2]
            now = time.monotonic_ns()
            if size == 0:
                break
            pending += payload
            *events, pending = pending.split(b"\n\n")
            for event in events:
                if not event.startswith(b"data: {"):
                    continue
                parsed = orjson.loads(event[6:])
                delta = (parsed.get("choices") or [{}])[0].get("delta") or {}
                if delta.get("content") and not ttft:
                    ttft = now - start
                if delta.get("content"):
                    latencies.append((now - parsed["t"]) / 1e9)
        return Timed(ttft / 1e9, (time.monotonic_ns() - start) / 1e9, latencies)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()


# -- in process ----------------------------------------------------------------------------------


class AsgiDriver:
    """In process, no socket: sends one request with body `raw` to `path` per `request()`; the statuses answered are
    kept, and `check` says whether every one was `expected`."""

    def __init__(self, app: ASGIApp, raw: bytes, path: str = "/v1/chat/completions") -> None:
        self.app = app
        self.raw = raw
        self.path = path
        self.headers = [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(raw)).encode()),
        ]
        self.statuses: list[int] = []

    async def request(self) -> None:
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": self.path,
            "raw_path": self.path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": self.headers,
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8000),
            "state": {},
        }
        sent = False
        done = asyncio.Event()

        async def receive() -> Message:
            nonlocal sent
            if sent:  # as a server does: the client is there until its response has ended
                await done.wait()
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": self.raw, "more_body": False}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.statuses.append(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        await self.app(scope, receive, send)
        done.set()

    def check(self, expected: int = 200) -> None:
        """Raise unless every request so far was answered `expected`."""
        if set(self.statuses) != {expected}:
            raise RuntimeError(f"the app answered {sorted(set(self.statuses))}, not {expected}")
