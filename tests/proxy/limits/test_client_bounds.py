"""What a client connection may hold, and for how long, against a real `toolsentry serve`: an idle
connection, one that sends its head a byte at a time and one that sends its body a byte at a
time are each closed by their timeout (`client_idle_timeout`, `client_header_timeout`,
`client_body_timeout`), and connections past `max_client_connections` make room by closing idle
ones, while real requests are answered all along.

Raw sockets on loopback; every timeout is a second, and nothing is asserted about how long
anything took: a connection is closed, a request answered.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.testing import LoopbackServer
from tests.processes import served_with
from tests.proxy.limits.hostile import Hostile

REPO = Path(__file__).resolve().parents[3]
WAIT = 20.0  # the most a test waits for what it expects; it never measures it
REQUEST = {"model": "hostile", "messages": [{"role": "user", "content": "hi"}]}


@contextmanager
def served(tmp_path: Path, **settings: Any) -> Iterator[tuple[Hostile, int]]:
    """A real `toolsentry serve` with `settings`, in front of a hostile upstream; its port."""
    script = Hostile(mode="fine")
    with LoopbackServer(script.app) as upstream:
        upstreams = [{"name": "hostile", "base_url": f"{upstream.url}/v1"}]
        settings = {"upstreams": upstreams, "retries": 0, **settings}
        with served_with(settings, tmp_path) as (port, _):
            try:
                yield script, port
            finally:
                script.release.set()  # held requests end before the proxy stops


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[int]:
    timeouts = {"client_idle_timeout": 1, "client_header_timeout": 1, "client_body_timeout": 1}
    with served(tmp_path, **timeouts) as (_, port):
        yield port


def answered(port: int) -> bool:
    """Whether a real request, on a connection of its own, is answered 200."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    return httpx.post(url, json=REQUEST, timeout=WAIT).status_code == 200


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=WAIT)


def what_comes_back(client: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (raises TimeoutError when it
    keeps it open for WAIT seconds)."""
    received = b""
    while chunk := client.recv(65536):
        received += chunk
    return received


def dripping(client: socket.socket, byte: bytes) -> threading.Thread:
    """A thread that sends `byte` every 50 ms until the connection is closed."""

    def drip() -> None:
        try:
            while True:
                client.sendall(byte)
                time.sleep(0.05)
        except OSError:
            return

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    return thread


def test_a_connection_that_never_sends_a_byte_is_closed_while_requests_are_answered(
    proxy: int,
) -> None:
    with connect(proxy) as idle:
        assert answered(proxy)
        assert what_comes_back(idle) == b""


def test_a_request_head_sent_a_byte_at_a_time_is_answered_408_and_closed(proxy: int) -> None:
    with connect(proxy) as slow:
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\nx-slow: ")
        dripping(slow, b"a")
        assert answered(proxy)
        back = what_comes_back(slow)
    assert back.startswith(b"HTTP/1.1 408"), back[:200]
    assert b"headers did not arrive" in back


def test_a_request_body_sent_a_byte_at_a_time_is_answered_408_and_closed(proxy: int) -> None:
    with connect(proxy) as slow:
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\n"
            b"content-type: application/json\r\ncontent-length: 100000\r\n\r\n"
        )
        slow.sendall(head + b'{"model": "hostile", "pad": "')
        dripping(slow, b"x")
        assert answered(proxy)
        back = what_comes_back(slow)
    assert back.startswith(b"HTTP/1.1 408"), back[:200]
    assert b"body did not arrive" in back


def closed(client: socket.socket) -> bool:
    """Whether the server closed `client`'s connection (it sends nothing unasked)."""
    client.setblocking(False)
    try:
        return client.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def eventually(check: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def test_connections_past_the_limit_close_idle_ones_and_requests_are_still_answered(
    tmp_path: Path,
) -> None:
    limit, opened = 8, 20
    with served(tmp_path, max_client_connections=limit, client_idle_timeout=600) as (_, port):
        idle = [connect(port) for _ in range(opened)]
        try:
            assert answered(port)
            # Each connection past the limit closed one that had no request under way.
            assert eventually(lambda: sum(map(closed, idle)) >= opened - limit)
            assert answered(port)
        finally:
            for client in idle:
                client.close()


def test_a_connection_past_the_limit_when_every_one_is_busy_is_answered_503(
    tmp_path: Path,
) -> None:
    with served(tmp_path, max_client_connections=2) as (script, port):
        script.mode = "held"
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        busy = [
            threading.Thread(target=httpx.post, args=(url,), kwargs={"json": REQUEST}, daemon=True)
            for _ in range(2)
        ]
        for thread in busy:
            thread.start()
        assert eventually(lambda: script.requests == 2)
        with connect(port) as late:
            back = what_comes_back(late)
        assert back.startswith(b"HTTP/1.1 503"), back[:200]
        assert b"retry-after: 1" in back
        script.release.set()
        for thread in busy:
            thread.join(WAIT)
        script.mode = "fine"
        assert answered(port)


def test_a_keep_alive_connection_outlasts_the_sdk_clients_own_keep_alive(tmp_path: Path) -> None:
    """Under the default idle timeout, a connection reused after the openai and anthropic SDKs'
    keep-alive expiry (httpx's, 5 s) is still open: at equal timeouts the client reuses the
    connection while the proxy closes it, and the request fails with a connection error."""
    import anthropic._constants
    import openai._constants

    expiry = max(
        openai._constants.DEFAULT_CONNECTION_LIMITS.keepalive_expiry or 0,
        anthropic._constants.DEFAULT_CONNECTION_LIMITS.keepalive_expiry or 0,
    )
    request = b"GET /healthz HTTP/1.1\r\nhost: proxy\r\n\r\n"
    with served(tmp_path) as (_, port), connect(port) as client:
        client.sendall(request)
        assert one_response(client).startswith(b"HTTP/1.1 200")
        time.sleep(expiry + 0.5)
        client.sendall(request)
        assert one_response(client).startswith(b"HTTP/1.1 200")


def one_response(client: socket.socket) -> bytes:
    """One whole response read from `client` (its head, then content-length bytes of body);
    b"" when the server closed the connection instead."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = client.recv(65536)
        if not chunk:
            return received
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = client.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body
