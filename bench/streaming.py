"""What does the proxy add to a streamed chat completion? Measures it, proxy against direct.

Three processes on loopback: a fast fake streaming upstream (a bare ASGI app under uvicorn,
uvloop + httptools), the proxy in front of it (`create_app` under the same server options as
`toolsentry serve`), and this client, a raw-socket HTTP/1.1 client on a keep-alive connection
per path that decodes the chunked body itself and timestamps every SSE event as it arrives.
Requests alternate between the two paths so that drift in the machine's load hits both alike.

- time to first token: from the request's first byte sent to the first content delta received;
- added latency per chunk: each upstream chunk carries the upstream's `time.monotonic_ns()` when
  it was written (a top-level field the proxy passes through; the clock is system-wide), so a
  chunk's delivery latency is its arrival minus that stamp, measured while the upstream paces
  its chunks like a model decoding;
- relay cost per chunk: a burst of chunks sent back to back, stream time divided by the count;
- a tool call: content then one tool call held, validated (valid) and re-emitted; total time.

    python -m bench.streaming [--requests 100] [--out bench/results/streaming.md]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.tables import markdown_table

ROOT = Path(__file__).resolve().parent.parent
MODEL = "bench-model"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
                "additionalProperties": False,
            },
        },
    }
]


# ---------------------------------------------------------------- the fake upstream (own process)


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "t": time.monotonic_ns(),
        "choices": [choice],
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


async def upstream_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A streaming chat server: `max_tokens` content chunks, `bench_gap_ms` apart, then a finish;
    with `bench_tool_call`, one tool call after the content."""
    if scope["type"] != "http":
        return
    raw = b""
    while True:
        message = await receive()
        raw += message.get("body", b"")
        if not message.get("more_body"):
            break
    request = orjson.loads(raw) if raw else {}
    count, gap = int(request.get("max_tokens", 20)), float(request.get("bench_gap_ms", 0)) / 1000
    if not request.get("stream"):
        await _answer_plain(send, count)
        return
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})

    async def emit(data: bytes) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": True})

    await emit(_chunk({"role": "assistant", "content": ""}))
    for i in range(count):
        if gap:
            await asyncio.sleep(gap)
        await emit(_chunk({"content": f"tok{i} "}))
    finish = "stop"
    if request.get("bench_tool_call"):
        head = {"index": 0, "id": "call_1", "type": "function"}
        await emit(_chunk({"tool_calls": [head | {"function": {"name": "get_order_details"}}]}))
        args = '{"order_id": "#W1"}'
        await emit(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": args}}]}))
        finish = "tool_calls"
    await emit(_chunk({}, finish) + b"data: [DONE]\n\n")
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _answer_plain(send: Any, count: int) -> None:
    message = {"role": "assistant", "content": "".join(f"tok{i} " for i in range(count))}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
    body = orjson.dumps(
        {"id": "chatcmpl-bench", "object": "chat.completion", "created": 0, "model": MODEL}
        | {"choices": [choice], "usage": {"prompt_tokens": 1, "completion_tokens": count}}
    )
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _serve(app: Any, port: int) -> None:
    import uvicorn

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
    )


def _serve_proxy(port: int, upstream_port: int) -> None:
    from proxy.app import create_app
    from proxy.config import Settings, UpstreamConfig
    from proxy.logs import configure_logging

    configure_logging("warning")
    upstream = UpstreamConfig(name="bench", base_url=f"http://127.0.0.1:{upstream_port}/v1")
    _serve(create_app(Settings(upstreams=[upstream])), port)


# ---------------------------------------------------------------- the client


@dataclass
class Timed:
    ttft: float  # seconds from the request sent to the first content delta
    total: float  # seconds from the request sent to the end of the body
    latencies: list[float]  # per stamped chunk: arrival minus the upstream's stamp, seconds


class RawClient:
    """One keep-alive HTTP/1.1 connection; reads a chunked SSE body, timing every event."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, body: dict[str, Any]) -> Timed:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self._reader, self._writer
        assert reader is not None
        data = orjson.dumps(body)
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{self.port}\r\n"
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


# ---------------------------------------------------------------- the measurement


def _request(tokens: int, gap_ms: float, *, tool_call: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Where is order #W1?"}],
        "tools": TOOLS,
        "stream": True,
        "max_tokens": tokens,
        "bench_gap_ms": gap_ms,
    }
    if tool_call:
        body["bench_tool_call"] = True
    return body


@dataclass
class Row:
    what: str
    unit: str
    direct: float
    proxy: float

    @property
    def added(self) -> float:
        return self.proxy - self.direct

    @property
    def ratio(self) -> float:
        return self.proxy / self.direct if self.direct else float("nan")


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _p90(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else float("nan")


async def _alternate(
    direct: RawClient, proxy: RawClient, body: dict[str, Any], requests: int
) -> tuple[list[Timed], list[Timed]]:
    for client in (direct, proxy):  # warm the connections and the proxy's upstream pool
        for _ in range(3):
            await client.post(body)
    out: tuple[list[Timed], list[Timed]] = ([], [])
    for i in range(requests):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for which in order:
            out[which].append(await (direct, proxy)[which].post(body))
    return out


async def measure(direct_port: int, proxy_port: int, requests: int) -> list[Row]:
    direct, proxy = RawClient(direct_port), RawClient(proxy_port)
    rows: list[Row] = []
    ms, us = 1e3, 1e6

    def add(
        what: str,
        unit: str,
        scale: float,
        d: list[Timed],
        p: list[Timed],
        f: Callable[[list[Timed]], float],
    ) -> None:
        rows.append(Row(what, unit, f(d) * scale, f(p) * scale))

    try:
        paced = _request(40, 1.0)
        d, p = await _alternate(direct, proxy, paced, requests)
        add("time to first token, median", "ms", ms, d, p, lambda t: _median([x.ttft for x in t]))
        add("time to first token, p90", "ms", ms, d, p, lambda t: _p90([x.ttft for x in t]))

        def lat(t: list[Timed]) -> list[float]:
            return [x for timed in t for x in timed.latencies]

        add("chunk delivery latency, median", "µs", us, d, p, lambda t: _median(lat(t)))
        add("chunk delivery latency, p90", "µs", us, d, p, lambda t: _p90(lat(t)))

        burst_tokens = 400
        d, p = await _alternate(direct, proxy, _request(burst_tokens, 0), max(10, requests // 4))
        add(
            f"relay cost per chunk ({burst_tokens} back to back)",
            "µs",
            us,
            d,
            p,
            lambda t: _median([x.total - x.ttft for x in t]) / burst_tokens,
        )

        plain = _request(5, 0) | {"stream": False}
        d, p = await _alternate(direct, proxy, plain, requests)
        add(
            "non-streamed request, total (reference)",
            "ms",
            ms,
            d,
            p,
            lambda t: _median([x.total for x in t]),
        )
        streamed = _request(5, 0)
        d, p = await _alternate(direct, proxy, streamed, requests)
        add(
            "streamed request (5 chunks), total",
            "ms",
            ms,
            d,
            p,
            lambda t: _median([x.total for x in t]),
        )
        tool = _request(5, 0, tool_call=True)
        d, p = await _alternate(direct, proxy, tool, requests)
        add(
            "content + one valid tool call, total",
            "ms",
            ms,
            d,
            p,
            lambda t: _median([x.total for x in t]),
        )
    finally:
        await direct.close()
        await proxy.close()
    return rows


def render(rows: list[Row], requests: int, seconds: float) -> str:
    lines = [
        "# Streaming: what the proxy adds",
        "",
        f"`python -m bench.streaming --requests {requests}` — {platform.python_implementation()} "
        f"{platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
        f"{requests} requests per path and scenario, alternating; run took {seconds:.0f} s.",
        "Fake upstream, proxy and client are separate processes on loopback (uvloop + httptools).",
        "",
        markdown_table(
            ["measure", "unit", "direct", "proxy", "added", "proxy / direct"],
            [
                [
                    r.what,
                    r.unit,
                    f"{r.direct:.1f}",
                    f"{r.proxy:.1f}",
                    f"{r.added:+.1f}",
                    f"{r.ratio:.2f}×",
                ]
                for r in rows
            ],
            right=range(2, 6),
        ),
        "",
        "Paced scenario: 40 content chunks 1 ms apart after the role chunk. Chunk delivery",
        "latency: arrival at the client minus the upstream's write stamp of that chunk.",
        "Relay cost: stream time after the first token, over the chunk count, upstream writing",
        "as fast as it can. Non-streamed and streamed requests: five tokens, no pacing. Tool",
        "call: five content chunks, then one tool call the proxy holds, validates against its",
        "schema and re-emits before the finish.",
    ]
    return "\n".join(lines) + "\n"


def _start(args: list[str], port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.streaming", *args], cwd=ROOT, stdin=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"bench server {args} exited with {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return process
        time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"bench server {args} did not start")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role")
    serve_upstream = sub.add_parser("upstream", help="(internal) serve the fake upstream")
    serve_upstream.add_argument("--port", type=int, required=True)
    serve_proxy = sub.add_parser("proxy", help="(internal) serve the proxy")
    serve_proxy.add_argument("--port", type=int, required=True)
    serve_proxy.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "streaming.md")
    args = parser.parse_args(argv)
    if args.role == "upstream":
        _serve(upstream_app, args.port)
        return
    if args.role == "proxy":
        _serve_proxy(args.port, args.upstream_port)
        return

    upstream_port, proxy_port = _free_port(), _free_port()
    started = time.monotonic()
    processes = [_start(["upstream", "--port", str(upstream_port)], upstream_port)]
    try:
        processes.append(
            _start(
                ["proxy", "--port", str(proxy_port), "--upstream-port", str(upstream_port)],
                proxy_port,
            )
        )
        rows = asyncio.run(measure(upstream_port, proxy_port, args.requests))
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=10)
    text = render(rows, args.requests, time.monotonic() - started)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"written to {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
