"""Time to first token of a streamed answer (any of the three protocols), one request at a time
over one connection.

A blocking socket, no HTTP library: it sends the request, notes when the upstream's first content
(`FIRST_TOKEN` of bench/fake_upstream.py) arrives, then reads the stream to its end before the
next request. Prints one JSON line with percentiles in microseconds.

    python -m bench.ttft --url http://127.0.0.1:9102/v1/chat/completions --body body.json -n 300
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import sys
import time
from urllib.parse import urlsplit

import orjson

from bench.fake_upstream import FIRST_TOKEN

_MARK = FIRST_TOKEN.encode()
_END = re.compile(rb"\[DONE\]|response\.completed|message_stop")


class StreamError(Exception):
    """The server did not answer with a complete stream."""


def _connect(host: str, port: int) -> socket.socket:
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def one(sock: socket.socket, request: bytes) -> tuple[float, bool]:
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


def measure(url: str, body: bytes, requests: int) -> dict[str, float]:
    """Run `requests` streamed requests one after another; return percentiles in microseconds."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    request = (
        f"POST {target} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"accept: text/event-stream\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body
    sock = _connect(host, port)
    samples: list[float] = []
    try:
        for _ in range(requests):
            seconds, keep = one(sock, request)
            samples.append(seconds * 1e6)
            if not keep:
                sock.close()
                sock = _connect(host, port)
    finally:
        sock.close()
    samples.sort()
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return {"n": len(samples), "p50_us": cuts[49], "p90_us": cuts[89], "p99_us": cuts[98]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--body", required=True, help="file with the JSON request body")
    parser.add_argument("-n", "--requests", type=int, default=300)
    args = parser.parse_args()
    with open(args.body, "rb") as file:
        body = file.read()
    try:
        result: dict[str, object] = dict(measure(args.url, body, args.requests))
    except (StreamError, OSError) as exc:
        result = {"error": str(exc)}
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    main()
