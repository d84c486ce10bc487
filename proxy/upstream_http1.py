"""HTTP/1.1 on one keep-alive connection to an upstream server: the request written in one call,
the response parsed by httptools.

The proxy asks one thing of HTTP: send a request to an OpenAI-compatible server and read its
response, whole or as it arrives. A general client (aiohttp's) pays for what the proxy never uses
— cookies, redirects, proxies, auth helpers, a header multidict per message — and measured on this
project's machines it cost five to six times the CPU per plain request (about 200 µs against
about 30 µs, and twice as much per streamed one: bench/results/upstreamclient.md) of writing the
request in one call on a pooled connection and feeding the answer to httptools' C parser (the
parser uvicorn serves with). At the proxy's rates that difference was most of its overhead, so
this module and `proxy.upstream_pool` keep only the part the proxy needs. Here, one connection
and the response read on it:

- A `Connection` carries one request at a time (`encode_head` writes its line and headers). Its
  response is an `AwaitedResponse`, read by a task: `head()` is the status and headers, and the
  body is read whole (`read()`) or chunk by chunk (`chunks()`); or a `Delivery`, read whole with
  no task waiting for it, handed to its `delivered()` from the connection's own callbacks.
- A stream whose reader falls behind stops reading the socket (back-pressure) rather than
  buffering, and its silence does not count meanwhile.
- gzip and deflate bodies are decoded (the proxy asks for neither; a server may send them anyway).
- 1xx interim answers (`100 Continue`, `103 Early Hints`) are skipped: the answer is the final one.
- A body is capped in bytes, decoded ones (the pool sets each response's caps): a compressed body
  is decoded no further than the cap, so a compression bomb costs the cap, not its decoded size.
  Past a cap the response fails (`TooLarge`) and its connection is closed. So does a head past
  `MAX_HEAD_BYTES`.
- Redirects are not followed: a 3xx is an answer like any other (the upstream's URL comes only
  from configuration).

The pool of these connections (reuse, the limit, keep-alive, the silence sweep and a stream's
cap in seconds) is `proxy.upstream_pool`'s; how a connection is opened (TCP, TLS) is
`proxy.upstream_origin.Origin`'s; what one raises, and how that becomes the proxy's `Upstream*`
errors, is drawn in `proxy.upstream_errors`.
"""

from __future__ import annotations

import asyncio
import copy
import math
import operator
import zlib
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Final, Protocol, cast

import httptools

from proxy.upstream_errors import (
    BrokenOff,
    ClosedEarly,
    InvalidResponse,
    Overdue,
    ProxyRefused,
    ResponseError,
    TooLarge,
    TooLong,
)

# A stream's reader this far behind stops the socket being read until it catches up.
_HIGH_WATER = 1 << 20
_LOW_WATER = 1 << 18
UNCAPPED = 1 << 62
"""A body cap that never binds."""
MAX_HEAD_BYTES = 64 * 1024
"""The bytes a response's head (interim answers included) may take in the reads that leave it
unfinished: a head cannot grow without end, and one read (at most the transport's buffer) more
finishes or refuses it. Counting only those reads costs a finished head nothing."""


def encode_head(
    method: str, target: str, host: str, headers: Mapping[str, str], length: int | None
) -> bytes:
    """A request's line and headers as they go on the wire; `length`: the body's, or None for a
    request without a body. Raises ValueError when a name or value holds a line break (it would
    start a header, or a request, of its own)."""
    lines = [f"{method} {target} HTTP/1.1\r\nhost: {host}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in headers.items()]
    if length is not None:
        lines.append(f"content-length: {length}\r\n")
    lines.append("\r\n")
    text = "".join(lines)
    # One count over the whole head instead of a check per header: each line ends in one \n.
    if text.count("\n") != len(headers) + (3 if length is None else 4) or "\r\r" in text:
        bad = next(
            (name for name, value in headers.items() if _breaks(name) or _breaks(value)), target
        )
        raise ValueError(f"a line break in the request's {bad!r}: refused")
    return text.encode("utf-8")


def _breaks(text: str) -> bool:
    return "\r" in text or "\n" in text


_name: Final = operator.itemgetter(0)


class Holder(Protocol):
    """What a connection asks of the pool that holds it (`proxy.upstream_pool.Pool`): its loop,
    to watch the connection's silence while a request is under way and stop, and to hear that
    the connection was lost."""

    loop: asyncio.AbstractEventLoop

    def watch(self, connection: Connection) -> None: ...

    def unwatch(self, connection: Connection) -> None: ...

    def lost(self, connection: Connection) -> None: ...


class Response:
    """A response on one connection as the connection's side reads it: its head decoded, its body
    gathered (decoded when gzip or deflate), its end or its failure. What reads it is a
    subclass: `AwaitedResponse`, a task awaiting the head and the body, or `Delivery`, a callback
    at the end; each says how the reader is woken (`_wake`) and how a piece of the body is taken (`on_body`).
    """

    __slots__ = (
        "_chunks",
        "_connection",
        "_decoder",
        "_ends_at_close",
        "_error",
        "_headed",
        "_headers",
        "_paused",
        "complete",
        "deadline",
        "error_limit",
        "got_bytes",
        "head_bytes",
        "head_only",
        "limit",
        "overdue",
        "raw_headers",
        "status",
        "taken",
    )

    _connection: Connection  # the connection it is read from, from when its request goes out

    def __init__(self, head_only: bool) -> None:
        self.head_only = head_only  # a HEAD request: the response has no body whatever it says
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []  # as the parser hands them over
        self._headers: dict[str, str] | None = None
        self.complete = False
        self.got_bytes = False
        self.head_bytes = 0  # read while the head was unfinished
        self._headed = False
        self._chunks: deque[bytes] = deque()
        self._paused = False
        self._error: BaseException | None = None
        self._decoder: zlib._Decompress | None = None
        self._ends_at_close = False
        # The caps (`Pool.send` sets them): body bytes (decoded), and for an error status the
        # lower `error_limit`; the loop time the try must have ended by, and what it fails with
        # past it. `taken`: bytes so far.
        self.limit = self.error_limit = UNCAPPED
        self.deadline = math.inf
        self.overdue: type[ResponseError] = Overdue
        self.taken = 0

    def _fail(self, error: BaseException) -> None:
        if self.complete or self._error is not None:
            return
        self._error = error
        self._wake()

    @property
    def headers(self) -> dict[str, str]:
        """The head's headers, names lower-case, values without the whitespace around them,
        repeated ones joined with ", " (decoded when first read: most responses are read for
        their status and body only)."""
        headers = self._headers
        if headers is None:
            headers = self._headers = {}
            for name, value in self.raw_headers:
                key = name.decode("latin-1").lower()
                # The parser drops a value's leading whitespace, not its trailing (RFC 9110 §5.5).
                text = value.decode("latin-1").rstrip(" \t")
                known = headers.get(key)
                headers[key] = text if known is None else f"{known}, {text}"
        return headers

    def on_headers_complete(self, status: int) -> None:
        self.status = status
        # The framing headers are looked for in the names joined, in C; most answers have a
        # length and no encoding, and their headers are not decoded here.
        names = b"\n%s\n" % b"\n".join(map(_name, self.raw_headers)).lower()
        if b"\ncontent-encoding\n" in names:
            encoding = self.headers.get("content-encoding", "").strip().lower()
            if encoding in ("gzip", "x-gzip"):
                self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
            elif encoding == "deflate":
                self._decoder = zlib.decompressobj()
            elif encoding != "identity":
                message = f"a body in {encoding!r}, never asked for"
                self._connection.broken(InvalidResponse(message))
                return
        # Neither a length nor chunks: the body runs until the server closes the connection.
        self._ends_at_close = (
            b"\ncontent-length\n" not in names
            and (
                b"\ntransfer-encoding\n" not in names
                or "chunked" not in self.headers.get("transfer-encoding", "").lower()
            )
            and status not in (204, 304)
        )
        self._headed = True
        self._wake()

    def _take(self, body: bytes) -> bytes | None:
        """`body` decoded (gzip, deflate) and counted against the cap; None when it does not
        decode or goes over the cap (the response failed). A compressed piece is decoded no
        further than one byte past the cap: a bomb never expands in memory beyond it."""
        limit = self.limit if self.status < 400 else min(self.limit, self.error_limit)
        if self._decoder is not None:
            try:
                body = self._decoder.decompress(body, limit - self.taken + 1)
            except zlib.error as exc:
                self._connection.broken(InvalidResponse(f"a body that does not decode: {exc}"))
                return None
        self.taken += len(body)
        if self.taken > limit:
            what = "an error body" if self.status >= 400 else "a body"
            self._connection.broken(TooLarge(f"{what} over the limit of {limit} bytes"))
            return None
        return body

    def on_message_complete(self) -> None:
        if self._error is not None:  # failed (over a cap, undecodable): it never completes
            return
        if self._decoder is not None:
            tail = self._decoder.flush()
            if tail:
                self._chunks.append(tail)
        self.complete = True
        self._wake()

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def ends_at_close(self) -> bool:
        """Whether the body is framed by the connection's end (no length, no chunks)."""
        return self._headed and self._ends_at_close

    def _wake(self) -> None:  # pragma: no cover (each reader's own)
        raise NotImplementedError

    def on_body(self, body: bytes) -> None:  # pragma: no cover (each reader's own)
        raise NotImplementedError


class AwaitedResponse(Response):
    """One request's response on one connection, read by a task that awaits its head, then its
    body whole or in chunks.

    Made by `Pool.send`; hand it back with `Pool.release` once done with it (read, failed or
    abandoned): only a response read to its end leaves its connection reusable.
    """

    __slots__ = ("_loop", "_size", "_waiter", "_whole")

    def __init__(self, connection: Connection, loop: asyncio.AbstractEventLoop, head_only: bool):
        super().__init__(head_only)
        self._connection = connection
        self._loop = loop
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._whole = False  # read whole: nothing takes pieces before the end, so no back-pressure

    # -- the reader's side

    async def head(self) -> None:
        """Wait for the status and headers. Raises what ended the response before them."""
        while not self._headed:
            if self._error is not None:
                raise self._failure()
            await self._wait()

    async def read(self) -> bytes:
        """The whole body. Raises what ended the response before its end."""
        self._whole = True
        if self._paused:
            self._paused = False
            self._connection.resume()
        while not self.complete:
            if self._error is not None:
                raise self._failure()
            await self._wait()
        body = b"".join(self._chunks)
        self._chunks.clear()
        return body

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's pieces as they arrive (after `head()`). Raises what ends it early."""
        while True:
            while self._chunks:
                chunk = self._chunks.popleft()
                self._size -= len(chunk)
                if self._paused and self._size <= _LOW_WATER:
                    self._paused = False
                    self._connection.resume()
                yield chunk
            if self.complete:
                return
            if self._error is not None:
                raise self._failure()
            await self._wait()

    def _failure(self) -> BaseException:
        """What ended the response, to raise: a copy, so the raise's traceback (whose frames hold
        this response, and the body read so far) is never attached to `_error`, which this
        response holds: that would be a reference cycle, freed only by the cycle collector."""
        error = self._error
        assert error is not None
        return copy.copy(error)

    async def _wait(self) -> None:
        waiter = self._waiter = self._loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        taken = self._take(body)
        if taken is None:
            return
        body = taken
        self._chunks.append(body)
        self._size += len(body)
        if self._size > _HIGH_WATER and not self._paused and not self._whole:
            self._paused = True
            self._connection.pause()
        self._wake()


class Delivery(Response):
    """A response read whole whose reader is a callback: a subclass's `delivered()` is called
    once, from the connection's callbacks, when the response is complete or has failed (what
    ended it is `_error`), where an `AwaitedResponse` wakes a task that awaits it — no task, no
    future and no object but this one per response.

    Sent with `Pool.deliver`; `delivered` hands it back with `Pool.release` (or `abandon`'s caller
    does).
    """

    __slots__ = ("_over",)

    def __init__(self) -> None:
        super().__init__(head_only=False)
        self._over = False  # `delivered` was called, or will never be

    def body(self) -> bytes:
        """The body as received (whole once `complete`)."""
        return b"".join(self._chunks)

    def abandon(self) -> bool:
        """Never call `delivered`: its caller gave up on the response. Whether it was still
        to be called (the response neither complete nor failed until now)."""
        pending = not self._over
        self._over = True
        return pending

    def delivered(self) -> None:  # pragma: no cover (each subclass's own)
        raise NotImplementedError

    def on_body(self, body: bytes) -> None:
        # No reader to wake before the end, and no back-pressure.
        if (taken := self._take(body)) is not None:
            self._chunks.append(taken)

    def _wake(self) -> None:
        if self._over or (not self.complete and self._error is None):
            return
        self._over = True
        self.delivered()


class Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request at a time, its response fed to httptools."""

    def __init__(self, pool: Holder) -> None:
        self._pool = pool
        self._loop = pool.loop
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._response: Response | None = None
        self._interim = False  # the parser is inside a 1xx interim answer
        self._last_read = 0.0
        self.closed = False
        self.reusable = True
        self.connected = False  # made and not yet lost: it holds one of the pool's slots
        self.was_made = False
        self.reused = False  # taken from the pool's idle connections, not made for its request
        self.idle_since = 0.0

    # -- asyncio's callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is one, not a subclass
        self.connected = self.was_made = True

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        if self._response is None:  # nothing was asked: a server talking out of turn
            self.reusable = False
            self.close()
            return
        response = self._response
        response.got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.broken(InvalidResponse("an upgrade to another protocol, never asked for"))
        except httptools.HttpParserError as exc:
            self.broken(InvalidResponse(f"bytes that are not an HTTP/1.1 response: {exc}"))
        if not response._headed:  # a read that left the head unfinished: it counts
            response.head_bytes += len(data)
            if response.head_bytes > MAX_HEAD_BYTES:
                self.broken(TooLarge(f"a response head over the limit of {MAX_HEAD_BYTES} bytes"))

    def eof_received(self) -> bool:
        return False  # the transport closes itself; connection_lost says what it ended

    def connection_lost(self, exc: Exception | None) -> None:
        self._drop_parser()
        self.closed = True
        self.reusable = False
        self._pool.unwatch(self)
        response = self._response
        if response is not None and not response.complete:
            if response.ends_at_close and exc is None:  # the close is the body's end
                response.on_message_complete()
            else:
                cause = f" ({exc.__class__.__name__}: {exc})" if exc else ""
                response._fail(
                    BrokenOff(f"the connection closed in the middle of the response{cause}")
                    if response.got_bytes
                    else ClosedEarly(f"the connection closed before a response{cause}")
                )
        self._pool.lost(self)

    def _drop_parser(self) -> None:
        """Let go of the parser once nothing more is read: it holds this connection's methods
        (its callbacks), a reference cycle that only the cycle collector would free, with the
        response and the body read so far in it."""
        self.__dict__.pop("_parser", None)

    # -- httptools' callbacks (the parser calls them on this object)

    def on_header(self, name: bytes, value: bytes) -> None:
        response = self._response
        if response is not None:
            response.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        response = self._response
        if response is None:
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            # An interim answer (100 Continue, 103 Early Hints): the parser reads the final one
            # next, on the same connection; its headers are not the final answer's.
            self._interim = True
            response.raw_headers.clear()
            return
        response.on_headers_complete(status)
        if response.head_only:  # no body follows a HEAD's response, whatever its length says
            self.reusable = False
            self._pool.unwatch(self)
            response.on_message_complete()

    def on_body(self, body: bytes) -> None:
        if self._response is not None:
            self._response.on_body(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        response = self._response
        if response is None or response.complete:
            return
        # Unwatched first: a delivery's callback may send the next request on it at once.
        self._pool.unwatch(self)
        if not self._parser.should_keep_alive():
            self.reusable = False
        response.on_message_complete()

    # -- the pool's side

    def send(self, head: bytes, body: bytes | None, response: Response) -> None:
        """Write the request and read its response into `response`."""
        transport = self._transport
        assert transport is not None
        self._response = response
        self._last_read = self._loop.time()
        self._pool.watch(self)
        if body:
            transport.writelines((head, body))
        else:
            transport.write(head)

    def check_silence(self, now: float, timeout: float) -> bool:
        """The pool's sweep: fail the response when the server has been silent for `timeout`
        seconds; whether the connection is still to be watched."""
        response = self._response
        if response is None or response.complete:
            return False
        if now >= response.deadline:
            return self._past_deadline(response)
        if response.paused:  # the reader is behind, not the server: wait for the reader
            self._last_read = now
            return True
        if now - self._last_read < timeout:
            return True
        response._fail(TimeoutError(f"no data from the server for {timeout:g} s"))
        self.reusable = False
        self.close()
        return False

    def _past_deadline(self, response: Response) -> bool:
        """The sweep found `response` past its deadline (`total_timeout`, or a stream's
        `max_stream_seconds`): failed, the connection closed, unwatched."""
        what = response.overdue
        if what is TooLong:
            response._fail(TooLong("a streamed body past its limit in seconds"))
        else:
            response._fail(what("an answer past its try's total_timeout"))
        self.reusable = False
        self.close()
        return False

    def done_with(self, response: Response) -> bool:
        """End `response` on this connection; whether the connection may serve another."""
        if self._response is response:
            self._response = None
        if not response.complete:  # a complete one was unwatched as it completed
            self._pool.unwatch(self)
            self.reusable = False
        return self.reusable and not self.closed

    def broken(self, error: BaseException) -> None:
        """The response cannot be read on: fail it, close the connection."""
        self.reusable = False
        if self._response is not None:
            self._response._fail(error)
        self.close()

    def pause(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.resume_reading()

    @property
    def writable(self) -> bool:
        return self._transport is not None and not self.closed and not self._transport.is_closing()

    def close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()


class ForwardedConnection(Connection):
    """A connection to a forward proxy carrying plain http requests (in absolute form): a 407 is
    the proxy's own answer (credentials missing or refused), failed as `ProxyRefused` naming the
    proxy, never handed on as the upstream's. Direct connections are `Connection`s: they pay
    nothing for this."""

    def __init__(self, pool: Holder, proxy: str) -> None:
        super().__init__(pool)
        self._proxy = proxy

    def on_status(self, reason: bytes) -> None:
        # At the status line, not the end of the head: a proxy refusing a request may close the
        # connection before reading its body, and the reset can cut its answer's head short.
        if self._response is not None and self._parser.get_status_code() == 407:
            self.broken(ProxyRefused(f"the proxy {self._proxy} answered 407: credentials needed"))
            # The rest of the answer is the proxy's: none of it is read into the response.
            self._response = None
