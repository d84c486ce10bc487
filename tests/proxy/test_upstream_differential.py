"""The upstream client (`proxy.upstream` over `proxy.upstream_http1`) against a reference client,
aiohttp's, on the same scripted exchanges: a server on loopback reads each request and answers
with exactly the bytes a case scripts, then ends the connection as the case says (left open, closed,
or reset). Both clients must see the same answer — status, headers, body decoded — or fail in the
same way, aiohttp's exceptions mapped onto the proxy's upstream error kinds (`aiohttp_kind`).

Each case runs three times: the body read whole by a task (`HttpUpstream.request`), read as a
stream (`HttpUpstream.stream`), and read whole by a kept-alive connection's callbacks
(`HttpUpstream.send`, after a first request left the connection idle), against aiohttp's `read()`
and its chunks; on asyncio's event loop and on uvloop's. Where the proxy's client differs
on purpose, the case says how (`Case.ours`) and why."""

from __future__ import annotations

import asyncio
import gzip
import socket
import struct
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import pytest
import uvloop

from proxy.config_upstream import UpstreamConfig
from proxy.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeoutError,
)
from proxy.upstream import HttpUpstream
from proxy.upstream_response import UpstreamResponse

Mode = Literal["whole", "stream", "delivered"]
End = Literal["keep", "close", "reset"]
Kind = Literal["connect", "protocol", "timeout"]

# The read timeout of both clients: short where a case goes silent (it waits for it), long
# enough elsewhere that a busy machine's pause is never taken for a server's silence.
SILENCE = 0.5
PATIENCE = 30.0
# The header of a request answered 200 before the scripted one, on the same connection.
WARM = b"\r\nx-warm: 1\r\n"


@dataclass(frozen=True)
class Answer:
    """A response as a client saw it: status, headers (names lower-case, repeated ones joined
    with ", ", as `Response.headers` gives them) and the body, decoded."""

    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Failed:
    """A request that ended in an error of one of the proxy's upstream kinds."""

    kind: Kind


Outcome = Answer | Failed


@dataclass(frozen=True)
class Case:
    """A scripted exchange: once the request is read, the server writes each of `pieces` (a
    moment apart, so each arrives on its own) and then ends the connection: `keep` leaves it
    open (until the client closes it), `close` closes it (FIN), `reset` resets it (RST).
    `ours`: the outcome the proxy's client gives where it differs from aiohttp's on purpose,
    and `why`."""

    pieces: tuple[bytes, ...]
    end: End = "keep"
    silent: bool = False  # the server goes quiet: both clients time out
    ours: Outcome | None = None
    why: str = ""


def head(status: str, *headers: str) -> bytes:
    return "".join([f"HTTP/1.1 {status}\r\n", *(f"{h}\r\n" for h in headers), "\r\n"]).encode()


def sized(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    return head(status, *headers, f"content-length: {len(body)}") + body


def chunked(*chunks: bytes, trailer: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n" + trailer + b"\r\n"


JSON = b'{"id":"cmpl-1","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}'
CHUNKED = head("200 OK", "transfer-encoding: chunked", "content-type: text/event-stream")
PACKED = gzip.compress(JSON)
DEFLATED = zlib.compress(JSON)

CASES: dict[str, Case] = {
    # -- statuses and headers
    "200-sized": Case((sized(JSON, "content-type: application/json"),)),
    "404-json": Case((sized(b'{"error":"no"}', status="404 Not Found"),)),
    "500-empty": Case((sized(b"", status="500 Internal Server Error"),)),
    "204-no-body": Case((head("204 No Content", "x-a: 1"),)),
    "599-unknown-status": Case((sized(b"?", status="599 Whatever"),)),
    "no-reason-phrase": Case((b"HTTP/1.1 200\r\ncontent-length: 2\r\n\r\nok",)),
    "307-not-followed": Case(
        (sized(b"", "location: /v2/chat/completions", status="307 Temporary Redirect"),)
    ),
    "repeated-headers": Case(
        (sized(b"{}", "x-a: 1", "set-cookie: a=1", "X-A: 2", "set-cookie: b=2"),)
    ),
    "header-whitespace-and-case": Case(
        (sized(b"{}", "X-Padded: \t v  w \t ", "x-empty:", "CONTENT-TYPE: a/b"),)
    ),
    "many-headers": Case(
        (sized(b"ok", *(f"x-{i}: {i}" for i in range(500))),),
        ours=Answer(200, {**{f"x-{i}": str(i) for i in range(500)}, "content-length": "2"}, b"ok"),
        why="aiohttp refuses more than 128 headers; the proxy's client bounds a head by its bytes",
    ),
    "huge-header": Case((sized(b"ok", "x-big: " + "a" * 1_000_000),), end="close"),
    "100-continue-then-200": Case((b"HTTP/1.1 100 Continue\r\n\r\n", sized(JSON, "x-final: 1"))),
    "103-early-hints-then-200": Case(
        (head("103 Early Hints", "link: </a.css>; rel=preload"), sized(JSON, "x-final: 1"))
    ),
    "connection-close-sized": Case((sized(JSON, "connection: close"),), end="close"),
    "http-1.0-until-close": Case(
        (b"HTTP/1.0 200 OK\r\ncontent-type: a/b\r\n\r\n" + JSON,), end="close"
    ),
    "no-length-until-close": Case((head("200 OK", "x-a: 1"), JSON[:10], JSON[10:]), end="close"),
    "body-longer-than-length": Case(
        (sized(JSON) + b"trailing junk",),
        end="close",
        ours=Answer(200, {"content-length": str(len(JSON))}, JSON),
        why="the answer was whole before the junk came: the proxy's client keeps it and closes "
        "the connection (never reused); aiohttp fails the answer it had",
    ),
    # -- chunked bodies and trailers
    "chunked": Case((CHUNKED + chunked(b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"),)),
    "chunked-in-pieces": Case((CHUNKED, b"9\r\ndata:", b" 1\n\n\r\n", b"0\r\n\r\n")),
    "chunked-empty": Case((CHUNKED + chunked(),)),
    "chunked-extensions-upper-hex": Case((CHUNKED + b"A;name=v\r\n0123456789\r\n0\r\n\r\n",)),
    "chunked-many": Case((CHUNKED + chunked(*(b"x" * n for n in range(1, 200))),)),
    "chunked-trailers": Case((CHUNKED + chunked(b"hello", trailer=b"x-checksum: abc\r\n"),)),
    # -- encodings
    "gzip-sized": Case((sized(PACKED, "content-encoding: gzip"),)),
    "gzip-chunked": Case(
        (
            head("200 OK", "content-encoding: gzip", "transfer-encoding: chunked")
            + chunked(PACKED[:7], PACKED[7:20], PACKED[20:]),
        )
    ),
    "gzip-upper-case": Case((sized(PACKED, "Content-Encoding: GZIP"),)),
    "x-gzip": Case(
        (sized(PACKED, "content-encoding: x-gzip"),),
        ours=Answer(200, {"content-encoding": "x-gzip", "content-length": str(len(PACKED))}, JSON),
        why="x-gzip is gzip (RFC 9110 8.4.1.3); aiohttp hands the compressed bytes over",
    ),
    "deflate": Case((sized(DEFLATED, "content-encoding: deflate"),)),
    "identity": Case((sized(JSON, "content-encoding: identity"),)),
    "gzip-corrupt": Case(
        (sized(PACKED[:10] + b"\x00" * 20 + PACKED[30:], "content-encoding: gzip"),)
    ),
    # -- malformed
    "not-http": Case((b"SSH-2.0-OpenSSH_9.6\r\n\r\n",), end="close"),
    "bad-status-line": Case((b"HTTP/1.1 two hundred OK\r\n\r\n",), end="close"),
    "bad-chunk-size": Case((CHUNKED + b"zz\r\nhello\r\n0\r\n\r\n",), end="close"),
    "length-and-chunked": Case(
        (head("200 OK", "content-length: 5", "transfer-encoding: chunked") + chunked(b"hello"),)
    ),
    "two-lengths-differ": Case(
        (head("200 OK", "content-length: 2", "content-length: 3") + b"abc",), end="close"
    ),
    "space-before-colon": Case((b"HTTP/1.1 200 OK\r\nx-a : 1\r\ncontent-length: 2\r\n\r\nok",)),
    "obs-fold": Case(
        (b"HTTP/1.1 200 OK\r\nx-a: 1\r\n  more\r\ncontent-length: 2\r\n\r\nok",),
        ours=Failed("protocol"),
        why="a gateway may answer 502 to a folded header (RFC 9112 5.2); aiohttp unfolds it",
    ),
    "bare-lf": Case(
        (b"HTTP/1.1 200 OK\nx-a: 1\ncontent-length: 2\n\nok",),
        ours=Failed("protocol"),
        why="a bare LF ending a line may be taken for CRLF (RFC 9112 2.2) or not: the proxy's "
        "parser (llhttp, strict) does not, aiohttp's does",
    ),
    # -- the connection ends early, at each phase
    "close-before-head": Case((), end="close"),
    "reset-before-head": Case((), end="reset"),
    "close-mid-head": Case((b"HTTP/1.1 200 OK\r\ncontent-le",), end="close"),
    "reset-mid-head": Case(
        (b"HTTP/1.1 200 OK\r\ncontent-le",),
        end="reset",
        ours=Failed("protocol"),
        why="aiohttp reports a reset as a socket error whatever had come; the proxy's client "
        "knows the server had begun its answer (a request it answered is never sent again)",
    ),
    "close-mid-body": Case((head("200 OK", "content-length: 100"), JSON[:40]), end="close"),
    "reset-mid-body": Case((head("200 OK", "content-length: 100"), JSON[:40]), end="reset"),
    "close-mid-chunk": Case((CHUNKED, b"a\r\nhel"), end="close"),
    "reset-mid-chunk": Case((CHUNKED, b"a\r\nhel"), end="reset"),
    "close-between-chunks": Case((CHUNKED, b"5\r\nhello\r\n"), end="close"),
    "reset-between-chunks": Case((CHUNKED, b"5\r\nhello\r\n"), end="reset"),
    "close-mid-gzip": Case((sized(PACKED, "content-encoding: gzip")[:-10],), end="close"),
    "reset-after-body": Case((sized(JSON),), end="reset"),
    # -- silence
    "silent-before-head": Case((), silent=True),
    "silent-mid-body": Case((head("200 OK", "content-length: 100"), JSON[:40]), silent=True),
}


# ---------------------------------------------------------------- the scripted server


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head_ = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head_.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head_ + await reader.readexactly(length)


def scripted(
    case: Case,
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while WARM in await read_request(reader):  # leaves the connection idle, kept alive
                writer.write(sized(b"{}"))
                await writer.drain()
            for piece in case.pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.02)  # each piece a read of its own on the client's side
            if case.end == "keep":
                await asyncio.wait_for(reader.read(), 2 * PATIENCE)  # till the client closes
            elif case.end == "reset":
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()  # closed with a linger of 0: an RST, not a FIN
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            writer.close()

    return serve


@asynccontextmanager
async def serving(case: Case) -> AsyncIterator[str]:
    """A server on loopback answering every connection's request as `case` scripts; its URL."""
    server = await asyncio.start_server(scripted(case), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.close()
        await server.wait_closed()


# ---------------------------------------------------------------- the two clients


def joined(raw: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in raw:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = text if key not in headers else f"{headers[key]}, {text}"
    return headers


OUR_KINDS: dict[type[UpstreamError], Kind] = {
    UpstreamConnectError: "connect",
    UpstreamProtocolError: "protocol",
    UpstreamTimeoutError: "timeout",
}


async def ours(url: str, mode: Mode, silence: float) -> Outcome:
    config = UpstreamConfig(name="s", base_url=url, timeout=silence)
    upstream = HttpUpstream(config, api_key=None, retries=0)
    try:
        if mode == "whole":
            response = await upstream.request("POST", "chat/completions", body=b"{}", headers={})
            return Answer(response.status, response.headers, response.body)
        if mode == "delivered":
            return await delivered(upstream)
        async with upstream.stream("chat/completions", body=b"{}", headers={}) as opened:
            body = b"".join([chunk async for chunk in opened.chunks])
            return Answer(opened.status, dict(opened.headers), body)
    except UpstreamError as exc:
        return Failed(OUR_KINDS[type(exc)])
    finally:
        await upstream.close()


async def delivered(upstream: HttpUpstream) -> Outcome:
    await upstream.request("POST", "warm", body=b"{}", headers={"x-warm": "1"})
    answered: asyncio.Future[UpstreamResponse | UpstreamError] = (
        asyncio.get_running_loop().create_future()
    )
    sent = upstream.send(
        "POST",
        "chat/completions",
        body=b"{}",
        headers={},
        done=lambda _, result: answered.set_result(result),
    )
    assert sent is not None  # the warm request left its connection idle
    assert sent.task is None  # read by the connection's callbacks, no task
    result = await answered
    if isinstance(result, UpstreamError):
        raise result
    return Answer(result.status, result.headers, result.body)


def aiohttp_kind(exc: Exception) -> Kind:
    """The proxy's upstream error kind for an exception of aiohttp's client: `connect` when no
    response was begun (refused, reset, closed before a byte), `protocol` when one was begun and
    broke off or is not HTTP, `timeout` when the server went silent. Raises AssertionError for
    one it does not map: a new kind of failure is looked at, not guessed."""
    if isinstance(exc, aiohttp.ServerTimeoutError):  # also a TimeoutError
        return "timeout"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        # Its `message` is the part of a head that came before the close, or only words.
        return "connect" if isinstance(exc.message, str) else "protocol"
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ClientResponseError):
        return "protocol"  # a body cut short or undecodable; a head its parser refused
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ClientOSError):
        return "connect"
    raise AssertionError(f"aiohttp raised {exc!r}, which no upstream error kind maps")


async def reference(url: str, mode: Mode, silence: float) -> Outcome:
    limits = aiohttp.ClientTimeout(sock_read=silence, sock_connect=silence)
    async with aiohttp.ClientSession(timeout=limits) as session:
        try:
            async with session.post(
                f"{url}/chat/completions",
                data=b"{}",
                headers={"content-type": "application/json"},
                allow_redirects=False,  # as the proxy's client: a redirect is the answer
            ) as response:
                if mode != "stream":
                    body = await response.read()
                else:
                    body = b"".join([chunk async for chunk in response.content.iter_any()])
                return Answer(response.status, joined(response.raw_headers), body)
        except aiohttp.ClientError as exc:
            return Failed(aiohttp_kind(exc))


async def exchange(case: Case, mode: Mode) -> tuple[Outcome, Outcome, list[dict[str, Any]]]:
    """Both clients' outcomes of `case`, and what a callback raised out of their sight."""
    heard: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: heard.append(context))
    async with serving(case) as url:
        silence = SILENCE if case.silent else PATIENCE
        mine = await ours(url, mode, silence)
        theirs = await reference(url, mode, silence)
    await asyncio.sleep(0)  # the transports' last callbacks (connection_lost) run
    return mine, theirs, list(heard)  # not what the runner's shutdown cancels afterwards


# Each exchange on both event loops: the proxy serves on uvloop, whose transports report a close
# or a reset in their own way.
RUNNERS: dict[str, Callable[[Coroutine[Any, Any, Any]], Any]] = {
    "asyncio": asyncio.run,
    "uvloop": uvloop.run,
}


@pytest.mark.parametrize("loop", list(RUNNERS))
@pytest.mark.parametrize("mode", ["whole", "stream", "delivered"])
@pytest.mark.parametrize("name", list(CASES))
def test_the_proxys_client_and_aiohttps_see_the_same_exchange(
    name: str, mode: Mode, loop: str
) -> None:
    case = CASES[name]
    mine, theirs, heard = RUNNERS[loop](exchange(case, mode))
    assert heard == []
    if case.ours is None:
        assert mine == theirs
    else:  # a difference on purpose: the proxy's client as the case says, aiohttp otherwise
        assert mine == case.ours, case.why
        assert theirs != case.ours, f"aiohttp agrees now: drop the difference ({case.why})"


def test_every_difference_on_purpose_says_why() -> None:
    assert [name for name, case in CASES.items() if (case.ours is None) != (not case.why)] == []
