"""The upstream's HTTP/1.1 connections against real sockets: servers on loopback that answer with
exactly the bytes a test scripts (keep-alive, gzip, silence, junk, a close at the worst moment)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from proxy import upstream_http1
from proxy.config_upstream import UpstreamConfig
from proxy.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeoutError,
)
from proxy.otlp import SpanKind, SpanRecord, new_id
from proxy.tracing import RequestTrace
from proxy.upstream import HttpUpstream, Sent
from proxy.upstream_response import UpstreamResponse
from tests.proxy.certificates import self_signed

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body (content-length framed); b"" when the client went away."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return b""
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


def reply(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", *headers, f"content-length: {len(body)}", "", ""]
    return "\r\n".join(lines).encode() + body


class Server:
    """A loopback TCP server running `handler` per connection; counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.open = 0
        self.most_open = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            await self.handler(reader, writer)
        finally:
            self.open -= 1
            writer.close()

    @contextlib.asynccontextmanager
    async def running(self, base_path: str = "/v1", **config: float) -> AsyncIterator[HttpUpstream]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        base_url = f"http://127.0.0.1:{port}{base_path}"
        upstream = HttpUpstream(
            UpstreamConfig(name="s", base_url=base_url, **config),  # type: ignore[arg-type]
            api_key=None,
            retries=0,
        )
        try:
            yield upstream
        finally:
            await upstream.close()
            server.close()
            await server.wait_closed()


async def test_a_gzip_body_is_decoded() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply(gzip.compress(b'{"ok":true}'), "content-encoding: gzip"))
        await writer.drain()

    async with Server(handler).running() as upstream:
        response = await upstream.request("POST", "chat/completions", body=b"{}", headers={})
    assert response.json() == {"ok": True}


async def test_framing_headers_are_read_whatever_their_case_on_a_kept_alive_connection() -> None:
    # Capitalised names (as many servers write them): a gzip body framed by its length, then a
    # chunked one, both on the connection the first left reusable, then one with no length.
    packed = gzip.compress(b'{"n":1}')

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(packed)}\r\n\r\n"
        writer.write(head.encode() + packed)
        await read_request(reader)
        writer.write(
            b'HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n7\r\n{"n":2}\r\n0\r\n\r\n'
        )
        await read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nX-Content-Length: 7\r\n\r\n{"n":3}')
        await writer.drain()

    server = Server(handler)
    async with server.running() as upstream:
        answers = [
            await upstream.request("POST", "chat/completions", body=b"{}", headers={})
            for _ in range(3)
        ]
    assert [a.json() for a in answers] == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert answers[0].headers == {"content-encoding": "gzip", "content-length": str(len(packed))}
    assert answers[2].headers == {"x-content-length": "7"}
    assert server.connections == 1  # the third answer ended with the connection, as it must


async def test_a_body_in_an_encoding_never_asked_for_is_an_invalid_response() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply(b"\x00\x01", "content-encoding: br"))
        await writer.drain()

    async with Server(handler).running() as upstream:
        with pytest.raises(UpstreamProtocolError, match=r"'s' sent an invalid response.*'br'"):
            await upstream.request("POST", "chat/completions", body=b"{}", headers={})


def closing_its_first_connection_unanswered() -> Server:
    """A server whose first connection answers one request, then closes on reading the second
    without a byte of answer (what a server does when its keep-alive ends just as a request
    arrives); a later connection answers `{"n":1}` first, then `{"n":2}` to every request."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = server.connections == 1
        await read_request(reader)
        writer.write(reply(b'{"n":1}'))
        await writer.drain()
        if first:
            await read_request(reader)
            return  # closed, unanswered
        while await read_request(reader):
            writer.write(reply(b'{"n":2}'))
            await writer.drain()

    server = Server(handler)
    return server


async def test_a_reused_connection_closed_as_the_request_goes_out_is_replaced_once() -> None:
    server = closing_its_first_connection_unanswered()
    async with server.running() as upstream:
        assert (await upstream.request("POST", "x", body=b"{}", headers={})).json() == {"n": 1}
        assert (await upstream.request("POST", "x", body=b"{}", headers={})).json() == {"n": 1}
        assert (await upstream.request("POST", "x", body=b"{}", headers={})).json() == {"n": 2}
    assert server.connections == 2


async def test_a_new_connection_closed_before_an_answer_is_not_sent_again() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)  # and close

    server = Server(handler)
    async with server.running() as upstream:
        with pytest.raises(
            UpstreamConnectError, match="'s' closed the connection before answering"
        ):
            await upstream.request("POST", "x", body=b"{}", headers={})
    assert server.connections == 1


async def test_a_silent_server_times_out_and_so_does_a_stream_that_goes_quiet() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        if b'"stream"' in request:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
            await writer.drain()
        await asyncio.sleep(5)

    async with Server(handler).running(timeout=0.3) as upstream:
        with pytest.raises(UpstreamTimeoutError, match="'s' timed out"):
            await upstream.request("POST", "x", body=b"{}", headers={})
        async with upstream.stream("x", body=b'{"stream":true}', headers={}) as opened:
            assert await anext(opened.chunks) == b"hello"
            with pytest.raises(UpstreamTimeoutError, match="'s' timed out"):
                await anext(opened.chunks)


async def test_bytes_that_are_not_http_are_an_invalid_response() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with Server(handler).running() as upstream:
        with pytest.raises(UpstreamProtocolError, match="'s' sent an invalid response"):
            await upstream.request("POST", "x", body=b"{}", headers={})


def test_a_header_with_a_line_break_is_refused_before_anything_is_written() -> None:
    with pytest.raises(ValueError, match="'x-evil'"):
        upstream_http1.encode_head("POST", "/v1/x", "h", {"x-evil": "1\r\nx-injected: 2"}, 2)
    head = upstream_http1.encode_head("POST", "/v1/x", "h:8", {"x-a": "1"}, 2)
    assert head == b"POST /v1/x HTTP/1.1\r\nhost: h:8\r\nx-a: 1\r\ncontent-length: 2\r\n\r\n"


async def test_no_more_than_max_connections_are_open_and_every_request_is_answered() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader):
            await asyncio.sleep(0.05)
            writer.write(reply(b'{"ok":1}'))
            await writer.drain()

    server = Server(handler)
    async with server.running(max_connections=2) as upstream:
        answers = await asyncio.gather(
            *(upstream.request("POST", "x", body=b"{}", headers={}) for _ in range(8))
        )
    assert [a.status for a in answers] == [200] * 8
    assert server.most_open == 2
    assert server.connections == 2


async def test_a_reader_that_stops_stops_the_socket_and_then_gets_every_byte() -> None:
    # 32 MB offered as fast as the socket takes it. While the reader stops, the client stops
    # reading the socket once it holds about a megabyte, so the server's writes stall (its
    # progress is what it got written); when the reader goes on, every byte arrives in order.
    piece = bytes(range(256)) * 256
    payload = piece * 512
    written = [0]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(f"HTTP/1.1 200 OK\r\ncontent-length: {len(payload)}\r\n\r\n".encode())
        for start in range(0, len(payload), len(piece)):
            writer.write(payload[start : start + len(piece)])
            await writer.drain()
            written[0] = start + len(piece)

    seen = hashlib.sha256()
    async with (
        Server(handler).running(timeout=5) as upstream,
        upstream.stream("x", body=b"{}", headers={}) as opened,
    ):
        seen.update(await anext(opened.chunks))
        await asyncio.sleep(0.5)
        stalled_at = written[0]
        async for chunk in opened.chunks:
            seen.update(chunk)
    assert stalled_at < len(payload) // 2
    assert seen.hexdigest() == hashlib.sha256(payload).hexdigest()


async def test_connection_close_and_a_head_request_are_not_kept_alive() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        if request.startswith(b"HEAD"):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n")
        else:
            writer.write(reply(b"{}", "connection: close"))
        await writer.drain()
        await asyncio.sleep(0.2)

    server = Server(handler)
    async with server.running() as upstream:
        await upstream.request("POST", "x", body=b"{}", headers={})
        head = await upstream.request("HEAD", "x", body=None, headers={})
        assert (head.status, head.body) == (200, b"")
        await upstream.request("POST", "x", body=b"{}", headers={})
        assert upstream.pool().idle == 0
    assert server.connections == 3


async def test_a_connection_whose_body_ended_with_it_gives_its_place_in_the_pool_back() -> None:
    # One connection allowed: each answer ends when the server closes, and the next request
    # needs the place the closed connection held.
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{"n":1}')
        await writer.drain()

    server = Server(handler)
    async with server.running(max_connections=1, pool_timeout=5) as upstream:
        answers = [await upstream.request("GET", "x", body=None, headers={}) for _ in range(3)]
        async with upstream.stream("x", body=None, headers={}, method="GET") as opened:
            streamed = b"".join([chunk async for chunk in opened.chunks])
    assert [a.json() for a in answers] == [{"n": 1}] * 3
    assert streamed == b'{"n":1}'
    assert server.connections == 4


async def test_a_base_urls_query_is_on_every_request_line_merged_with_a_requests_own() -> None:
    lines: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while request := await read_request(reader):
            lines.append(request.partition(b"\r\n")[0])
            writer.write(reply(b"{}"))
            await writer.drain()

    async with Server(handler).running("/openai/v1?api-version=2024-10-21") as upstream:
        await upstream.request("POST", "chat/completions", body=b"{}", headers={})
        async with upstream.stream("chat/completions", body=b"{}", headers={}) as opened:
            assert [chunk async for chunk in opened.chunks] == [b"{}"]
        await upstream.request("GET", "models?limit=2&api-version=1", body=None, headers={})
        await upstream.request("GET", "/health", body=None, headers={})
    assert lines == [
        b"POST /openai/v1/chat/completions?api-version=2024-10-21 HTTP/1.1",
        b"POST /openai/v1/chat/completions?api-version=2024-10-21 HTTP/1.1",
        b"GET /openai/v1/models?api-version=2024-10-21&limit=2 HTTP/1.1",
        b"GET /openai/health?api-version=2024-10-21 HTTP/1.1",
    ]


async def test_a_redirect_is_the_answer_passed_back_never_followed() -> None:
    requests: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while request := await read_request(reader):
            requests.append(request)
            writer.write(
                reply(
                    b'{"moved":true}',
                    "location: /v2/chat/completions",
                    status="307 Temporary Redirect",
                )
            )
            await writer.drain()

    async with Server(handler).running() as upstream:
        plain = await upstream.request("POST", "chat/completions", body=b"{}", headers={})
        async with upstream.stream("chat/completions", body=b"{}", headers={}) as opened:
            streamed = (opened.status, opened.headers, [c async for c in opened.chunks])
    assert (plain.status, plain.headers["location"], plain.json()) == (
        307,
        "/v2/chat/completions",
        {"moved": True},
    )
    assert streamed[0] == 307
    assert streamed[1]["location"] == "/v2/chat/completions"
    assert streamed[2] == [b'{"moved":true}']
    assert len(requests) == 2  # one each: nothing went to the location


async def test_a_body_without_length_or_chunks_ends_when_the_server_closes() -> None:
    # HTTP/1.0-style framing: the body is what comes before the close; a stream framed that way
    # is read to the end, and a length-framed body cut short is still a broken one.
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await read_request(reader)
        if b"cut" in request:
            writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"partial":')
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: 1\n\n")
            await writer.drain()
            writer.write(b"data: 2\n\n")
        await writer.drain()

    # The close ends the body cleanly: no callback of the connection's fails meanwhile.
    failures: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: failures.append(context))
    async with Server(handler).running() as upstream:
        whole = await upstream.request("POST", "x", body=b"{}", headers={})
        assert whole.body == b"data: 1\n\ndata: 2\n\n"
        async with upstream.stream("x", body=b"{}", headers={}) as opened:
            assert b"".join([chunk async for chunk in opened.chunks]) == whole.body
        with pytest.raises(UpstreamProtocolError, match="'s' broke off its response"):
            await upstream.request("POST", "x", body=b'"cut"', headers={})
    assert failures == []


async def test_an_https_upstream_is_verified_against_the_trusted_certificates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Trusted (SSL_CERT_FILE names the server's certificate): answered over TLS, kept alive.
    # Not trusted: a connect error that says why, never a request sent in the clear.
    cert_file, key_file = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    server = Server(_echo_forever)
    listening = await asyncio.start_server(server._serve, "127.0.0.1", 0, ssl=context)
    port = listening.sockets[0].getsockname()[1]
    config = UpstreamConfig(name="tls", base_url=f"https://127.0.0.1:{port}/v1")
    try:
        monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))
        trusting = HttpUpstream(config, api_key=None, retries=0)
        monkeypatch.delenv("SSL_CERT_FILE")
        untrusting = HttpUpstream(config, api_key=None, retries=0)
        try:
            for _ in range(2):
                answer = await trusting.request("POST", "x", body=b"{}", headers={})
                assert answer.json() == {"ok": 1}
            with pytest.raises(UpstreamConnectError, match="certificate verify failed"):
                await untrusting.request("POST", "x", body=b"{}", headers={})
        finally:
            await trusting.close()
            await untrusting.close()
    finally:
        listening.close()
        await listening.wait_closed()
    assert server.connections == 1  # kept alive for both trusted requests; the refused handshake
    # never reached the handler


async def _echo_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while await read_request(reader):
        writer.write(reply(b'{"ok":1}'))
        await writer.drain()


async def test_a_body_read_whole_is_not_held_back_by_the_streams_back_pressure() -> None:
    # A non-streamed answer far above the stream's high-water mark (logprobs make such bodies):
    # read whole, nothing consumes its pieces until the end, so the socket must keep being read.
    payload = b'{"x":"' + b"a" * (3 << 20) + b'"}'

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply(payload))
        await writer.drain()

    async with Server(handler).running(timeout=5) as upstream:
        response = await upstream.request("POST", "x", body=b"{}", headers={})
    assert response.body == payload


# -- a request whose answer goes to a callback (HttpUpstream.send) -------------------------------


class Answers:
    """What `HttpUpstream.send` hands its callback, and a future set at the first."""

    def __init__(self) -> None:
        self.got: list[UpstreamResponse | UpstreamError] = []
        self.first: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def __call__(self, sent: Sent, result: UpstreamResponse | UpstreamError) -> None:
        self.got.append(result)
        if not self.first.done():
            self.first.set_result(None)

    async def one(self) -> UpstreamResponse | UpstreamError:
        await asyncio.wait_for(self.first, 10)
        (result,) = self.got
        return result


async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer every request on the connection with its own body."""
    while request := await read_request(reader):
        writer.write(reply(request.partition(b"\r\n\r\n")[2]))
        await writer.drain()


async def test_a_request_sent_on_an_idle_connection_is_answered_through_the_callback() -> None:
    server = Server(keep_alive)
    async with server.running() as upstream:
        answers = Answers()
        # No idle connection yet: nothing is sent, and the caller makes one with `request`.
        assert upstream.send("POST", "x", body=b"{}", headers={}, done=answers) is None
        await upstream.request("POST", "x", body=b"{}", headers={})
        before = len(asyncio.all_tasks())
        sent = upstream.send("POST", "x", body=b'{"n":2}', headers={"x-a": "1"}, done=answers)
        assert sent is not None
        assert len(asyncio.all_tasks()) == before  # no task waits for it
        answer = await answers.one()
        assert isinstance(answer, UpstreamResponse)
        assert (answer.status, answer.json()) == (200, {"n": 2})
        assert upstream.pool().idle == 1  # the connection went back to the pool
    assert server.connections == 1


async def test_an_answer_through_the_callback_has_its_headers_and_a_gzip_body_decoded() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while request := await read_request(reader):
            body = request.partition(b"\r\n\r\n")[2]
            if body == b'{"zip":"bad"}':
                writer.write(reply(b"not gzip", "content-encoding: gzip"))
            elif body == b'{"zip":1}':
                packed = gzip.compress(b'{"ok":true}')
                writer.write(reply(packed, "content-encoding: gzip", "x-a: 1", "X-A: 2"))
            else:
                writer.write(reply(body))
            await writer.drain()

    async with Server(handler).running() as upstream:
        await upstream.request("POST", "x", body=b"{}", headers={})
        answers = Answers()
        assert upstream.send("POST", "x", body=b'{"zip":1}', headers={}, done=answers)
        answer = await answers.one()
        assert isinstance(answer, UpstreamResponse)
        assert answer.json() == {"ok": True}
        assert (answer.headers["content-encoding"], answer.headers["x-a"]) == ("gzip", "1, 2")
        broken = Answers()
        assert upstream.send("POST", "x", body=b'{"zip":"bad"}', headers={}, done=broken)
        failed = await broken.one()
        assert isinstance(failed, UpstreamProtocolError)
        assert "a body that does not decode" in str(failed)
        assert upstream.pool().idle == 0  # that connection was closed


async def test_a_traced_try_adds_its_traceparent_to_its_own_request_only() -> None:
    # The headers a request is sent with are worked out once per (path, headers) and shared:
    # a traced try's traceparent must not stay behind in them for the next request.
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while request := await read_request(reader):
            seen.append(request.partition(b"\r\n\r\n")[0].lower())
            writer.write(reply(b"{}"))
            await writer.drain()

    server = SpanRecord("chat m", SpanKind.SERVER, new_id(128), 0, {})
    async with Server(handler).running() as upstream:
        headers = {"x-a": "1"}
        await upstream.request("POST", "x", body=b"{}", headers=headers)
        answers = Answers()
        trace = RequestTrace(None, server, "chat", "m").beside("shadow")
        assert upstream.send("POST", "x", body=b"{}", headers=headers, done=answers, trace=trace)
        await answers.one()
        await upstream.request("POST", "x", body=b"{}", headers=headers)
    assert [b"traceparent:" in head for head in seen] == [False, True, False]
    assert all(b"x-a: 1" in head for head in seen)


async def test_a_callback_that_raises_is_reported_and_the_connection_kept() -> None:
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))

    def fails(sent: Sent, result: UpstreamResponse | UpstreamError) -> None:
        raise KeyError("the caller's bug")

    server = Server(keep_alive)
    async with server.running() as upstream:
        await upstream.request("POST", "x", body=b"{}", headers={})
        assert upstream.send("POST", "x", body=b"{}", headers={}, done=fails) is not None
        for _ in range(100):
            if errors:
                break
            await asyncio.sleep(0.01)
        assert isinstance(errors[0]["exception"], KeyError)
        assert (await upstream.request("POST", "x", body=b"{}", headers={})).status == 200
    assert server.connections == 1


async def test_a_sent_request_whose_idle_connection_closed_unanswered_goes_once_more() -> None:
    server = closing_its_first_connection_unanswered()
    async with server.running() as upstream:
        await upstream.request("POST", "x", body=b"{}", headers={})
        answers = Answers()
        sent = upstream.send("POST", "x", body=b'{"again":1}', headers={}, done=answers)
        assert sent is not None
        answer = await answers.one()
        assert isinstance(answer, UpstreamResponse)
        assert answer.json() == {"n": 1}  # the new connection's first answer
    assert server.connections == 2


async def test_a_request_sent_from_an_answers_callback_is_still_timed() -> None:
    # The callback runs as the response completes, its connection already back in the pool: a
    # request it sends at once goes out on that connection, and the server's silence on it
    # must be caught like any other's.
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):
            await read_request(reader)
            writer.write(reply(b"{}"))
            await writer.drain()
        await read_request(reader)
        await asyncio.sleep(5)  # the third request is never answered

    server = Server(handler)
    async with server.running(timeout=0.3) as upstream:
        await upstream.request("POST", "x", body=b"{}", headers={})
        answers = Answers()

        def again(sent: Sent, result: UpstreamResponse | UpstreamError) -> None:
            assert isinstance(result, UpstreamResponse)
            assert upstream.send("POST", "x", body=b"{}", headers={}, done=answers) is not None

        assert upstream.send("POST", "x", body=b"{}", headers={}, done=again) is not None
        got = await answers.one()
        assert isinstance(got, UpstreamTimeoutError)
    assert server.connections == 1


@pytest.mark.parametrize(
    ("answer", "error", "match"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{", UpstreamProtocolError, "broke off"),
        (b"", UpstreamTimeoutError, "timed out"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{", None, ""),  # cancelled first
    ],
    ids=["broken-off", "silent", "cancelled"],
)
async def test_a_sent_request_that_fails_hands_over_its_error_or_nothing_once_cancelled(
    answer: bytes, error: type[UpstreamError] | None, match: str
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(reply(b"{}"))
        await read_request(reader)
        writer.write(answer)
        await writer.drain()
        await asyncio.sleep(0.2 if answer else 5)

    server = Server(handler)
    async with server.running(timeout=0.3) as upstream:
        await upstream.request("POST", "x", body=b"{}", headers={})
        answers = Answers()
        sent = upstream.send("POST", "x", body=b"{}", headers={}, done=answers)
        assert sent is not None
        if error is None:
            await asyncio.sleep(0.05)
            sent.cancel()
            await asyncio.sleep(0.5)
            assert answers.got == []
            assert upstream.pool().idle == 0  # not read to its end: closed, not pooled
            return
        got = await answers.one()
        assert isinstance(got, error)
        assert match in str(got)
