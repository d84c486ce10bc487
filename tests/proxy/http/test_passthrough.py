"""The raw pass-through: other endpoints reach the upstream as sent, and their answers stream
back as they arrive, within the body size limit checked while the body is read."""

from __future__ import annotations

import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from proxy.testing import LoopbackServer
from tests.proxy.conftest import RunningProxy

WAIT = 10.0  # how long the slow upstream waits for the test before it ends its stream anyway


class SlowCompletions:
    """A `/v1/completions` upstream that streams one event, then waits for `release`."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.finished = threading.Event()
        self.bodies: list[bytes] = []
        self.app = Starlette(routes=[Route("/v1/completions", self.completions, methods=["POST"])])

    async def completions(self, request: Request) -> StreamingResponse:
        self.bodies.append(await request.body())

        async def events() -> AsyncIterator[bytes]:
            yield b'data: {"choices": [{"text": "first"}]}\n\n'
            await anyio.to_thread.run_sync(self.release.wait, WAIT)
            yield b'data: {"choices": [{"text": "second"}]}\n\ndata: [DONE]\n\n'
            self.finished.set()

        return StreamingResponse(events(), media_type="text/event-stream")


def read_response(sock: socket.socket) -> bytes:
    """One HTTP response with a content-length, read off a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


@pytest.fixture
def slow() -> Iterator[tuple[SlowCompletions, LoopbackServer]]:
    upstream = SlowCompletions()
    with LoopbackServer(upstream.app) as server:
        yield upstream, server


def test_a_streamed_completion_reaches_the_client_while_the_upstream_is_still_sending(
    make_proxy: Callable[..., RunningProxy], slow: tuple[SlowCompletions, LoopbackServer]
) -> None:
    upstream, server = slow
    proxy = make_proxy(upstreams=[{"name": "slow", "base_url": f"{server.url}/v1"}])
    body = {"model": "m", "prompt": "hi", "stream": True}
    with (
        proxy.http() as http,
        http.stream("POST", "/v1/completions", json=body) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = response.iter_raw()
        first = next(chunks)
        assert b'"first"' in first
        assert not upstream.finished.is_set()  # the client has it before the upstream is done
        upstream.release.set()
        rest = b"".join(chunks)
    assert rest.endswith(b"data: [DONE]\n\n")
    assert upstream.bodies == [b'{"model":"m","prompt":"hi","stream":true}']


def test_a_body_over_the_limit_is_refused_before_the_rest_of_it_is_sent(
    make_proxy: Callable[..., RunningProxy], slow: tuple[SlowCompletions, LoopbackServer]
) -> None:
    upstream, server = slow
    proxy = make_proxy(
        upstreams=[{"name": "slow", "base_url": f"{server.url}/v1"}], max_body_bytes=4096
    )
    host, port = proxy.server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=WAIT) as sock:
        head = (
            "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            "transfer-encoding: chunked\r\n\r\n"
        )
        piece = b"x" * 5000
        sock.sendall(head.encode() + b"%x\r\n" % len(piece) + piece + b"\r\n")
        # The body is not finished: a proxy that read it all before checking would wait here.
        answer = read_response(sock)
    assert answer.startswith(b"HTTP/1.1 413")
    assert b"invalid_request_error" in answer
    assert upstream.bodies == []
