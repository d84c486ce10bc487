"""Headers at the edge: the proxy's own and the hop-by-hop ones never reach the upstream, a
request's headers are bounded (431), a request id is bounded before it is logged, and an
upstream's interim `100 Continue` is never taken for its answer.

Each of these failed before: `x-admin-key`, `expect`, `proxy-*` and `te` went upstream; a 100 kB
header was read, and a 100 kB `x-request-id` written into the log; `Expect: 100-continue` from a
client made the uvicorn upstream answer `100 Continue`, which the proxy's client took as the
answer (502); an upstream's `103 Early Hints` likewise.
"""

from __future__ import annotations

import socketserver
import threading
import time
from collections.abc import Iterator

import orjson
import pytest

from proxy.protocols.base import API
from proxy.testing import answer, render
from tests.proxy.security.support import (
    ADMIN_KEY,
    CLIENT_KEY,
    TURN_ROUTES,
    UPSTREAM_KEY,
    Proxy,
    RecordingUpstream,
    send,
    turn_body,
)

INTERNAL = {
    "x-admin-key": ADMIN_KEY,
    "x-toolsentry-max-errors": "3",
    "x-toolsentry-repair": "off",
    "x-toolsentry-anything": "1",
    "proxy-authorization": "Basic c2VjcmV0",
    "proxy-connection": "keep-alive",
    "te": "trailers",
    "keep-alive": "timeout=5",
    "trailer": "x-checksum",
    "x-api-key": CLIENT_KEY,
}
# Named by `connection`: hop-by-hop for this request only.
NAMED = {"connection": "keep-alive, x-hop-secret", "x-hop-secret": "1"}
KEPT = {"x-custom": "kept", "x-request-id": "req-123"}


@pytest.mark.parametrize("path", [*TURN_ROUTES, "/tokenize", "/v1/completions"])
def test_internal_and_hop_by_hop_headers_never_reach_the_upstream(
    edge: Proxy, upstream: RecordingUpstream, path: str
) -> None:
    body = turn_body(path) if path in TURN_ROUTES else {"model": "m", "prompt": "x"}
    reply = send(edge.port, "POST", path, body, headers={**INTERNAL, **NAMED, **KEPT})
    assert reply.status == 200, reply.body
    [got] = upstream.received
    names = {name for name, _ in got.headers}
    leaked = names & {*INTERNAL, "x-hop-secret"}
    assert not leaked
    assert not any(name.startswith(("x-toolsentry-", "proxy-")) for name in names)
    assert got.header("authorization") == f"Bearer {UPSTREAM_KEY}"
    for name, value in KEPT.items():
        assert got.header(name) == value


def test_oversized_request_headers_answer_431_and_stay_out_of_the_log(
    edge: Proxy, upstream: RecordingUpstream
) -> None:
    huge = "r" * 100_000
    for key in (None, CLIENT_KEY):
        reply = send(
            edge.port,
            "POST",
            "/v1/chat/completions",
            turn_body("/v1/chat/completions"),
            headers={"x-request-id": huge},
            key=key,
        )
        assert reply.status == 431
        assert reply.json()["error"]["type"] == "invalid_request_error"
    assert upstream.received == []
    assert huge not in edge.log()
    assert max(map(len, edge.log().splitlines())) < 4096


@pytest.mark.parametrize("odd", ["x" * 129, "id with spaces", 'quote"and\\slash', "é-id"])
def test_a_long_or_odd_request_id_is_replaced_and_its_length_logged(
    edge: Proxy, upstream: RecordingUpstream, odd: str
) -> None:
    reply = send(
        edge.port,
        "POST",
        "/v1/chat/completions",
        turn_body("/v1/chat/completions"),
        headers={"x-request-id": odd.encode().decode("latin-1")},
    )
    assert reply.status == 200
    [got] = upstream.received
    replaced = got.header("x-request-id")
    assert replaced is not None
    assert replaced != odd
    assert len(replaced) == 32
    lines = [orjson.loads(line) for line in edge.log().splitlines() if replaced in line]
    noted = [line for line in lines if line.get("event") == "request_id_replaced"]
    assert noted
    assert noted[0]["length"] == len(odd.encode())


@pytest.mark.parametrize("path", [*TURN_ROUTES, "/tokenize"])
def test_expect_100_continue_gets_the_upstreams_answer(
    edge: Proxy, upstream: RecordingUpstream, path: str
) -> None:
    body = turn_body(path) if path in TURN_ROUTES else {"model": "m", "prompt": "x"}
    reply = send(edge.port, "POST", path, body, headers={"expect": "100-continue"})
    assert reply.status == 200, reply.body
    assert reply.checked or path not in TURN_ROUTES
    [got] = upstream.received
    assert got.header("expect") is None


class _Hinting(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        while True:
            length = 0
            line = self.rfile.readline()
            if not line:
                return
            while line not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
                line = self.rfile.readline()
            request = orjson.loads(self.rfile.read(length)) if length else {}
            body = orjson.dumps(render(answer("hinted"), API.CHAT, request))
            # Each answer written on its own, a pause apart: the client reads the interim ones
            # apart from the final one, as it would from a server that thinks meanwhile.
            for piece in (
                b"HTTP/1.1 100 Continue\r\n\r\n",
                b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n",
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body),
            ):
                self.wfile.write(piece)
                self.wfile.flush()
                time.sleep(0.1)


class InterimHints(socketserver.ThreadingTCPServer):
    """A raw HTTP/1.1 upstream that sends `100 Continue` and `103 Early Hints` before each
    final answer (a chat completion), on keep-alive connections."""

    daemon_threads = True
    block_on_close = False

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Hinting)
        self.port = self.server_address[1]
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    def __enter__(self) -> InterimHints:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(10)


@pytest.fixture
def hinting() -> Iterator[InterimHints]:
    with InterimHints() as server:
        yield server


def test_interim_answers_from_an_upstream_are_skipped(
    hinting: InterimHints, tmp_path_factory: pytest.TempPathFactory
) -> None:
    proxy = Proxy(f"http://127.0.0.1:{hinting.port}", tmp_path_factory.mktemp("hints"))
    try:
        for _ in range(3):  # and the connection stays usable after them
            reply = send(
                proxy.port, "POST", "/v1/chat/completions", turn_body("/v1/chat/completions")
            )
            assert reply.status == 200, reply.body
            assert reply.checked
            assert reply.json()["choices"][0]["message"]["content"] == "hinted"
            assert "link" not in reply.headers
    finally:
        proxy.stop()
