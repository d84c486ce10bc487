"""HTTP/1.1 to one upstream server: a pool of keep-alive connections whose responses httptools parses.

The proxy asks one thing of HTTP: send a request to an OpenAI-compatible server and read its
response, whole or as it arrives. A general client (aiohttp's) pays for what the proxy never uses
— cookies, redirects, proxies, auth helpers, a header multidict per message — and measured on this
project's machines it cost five to six times the CPU per plain request (about 200 µs against
about 30 µs, and twice as much per streamed one: bench/results/upstreamclient.md) of writing the
request in one call on a pooled connection and feeding the answer to httptools' C parser (the
parser uvicorn serves with). At the proxy's rates that difference was most of its overhead, so
this module keeps only the part the proxy needs:

- `Pool.send()` sends a request on an idle connection (or a new one, up to `limit`; with `fresh`,
  always a new one) and returns an `AwaitedResponse`, read by a task: `head()` is the status and
  headers, and the body is read whole (`read()`) or chunk by chunk (`chunks()`); `Pool.release()`
  gives the connection back when the body was read to its end and the server keeps it alive,
  and closes it otherwise.
- `Pool.deliver()` sends a request on an idle connection (`Pool.idle_connection()`) with no task
  waiting for it: the response, read whole, goes to its `Delivery`'s `delivered()`, from the
  connection's own callbacks.
- A connection idle for longer than `keepalive` is closed instead of reused (below the server's own
  keep-alive, so a request never goes out on a connection the server is closing). A connection
  says whether it was `reused`: when a reused one closes before answering a byte (`ClosedEarly`),
  `proxy.upstream` sends the request once more, on a `fresh` one.
- `read_timeout` bounds the silence between two reads, as a socket read timeout does: one timer
  per pool sweeps the busy connections a few times per timeout (a silence is caught within a
  quarter of the timeout, at most a second, after it), where a timer per request cost a tenth of
  a request's instructions. A stream whose reader falls behind stops reading the
  socket (back-pressure) rather than buffering, and its silence does not count meanwhile.
- gzip and deflate bodies are decoded (the proxy asks for neither; a server may send them anyway).
- 1xx interim answers (`100 Continue`, `103 Early Hints`) are skipped: the answer is the final one.
- A body is capped in bytes, decoded ones (`Pool`'s `max_response_bytes` for one read whole and
  for any error body, `max_stream_bytes` for a stream): a compressed body is decoded no further
  than the cap, so a compression bomb costs the cap, not its decoded size. A stream is capped in
  duration too (`max_stream_seconds`, checked by the silence sweep). Past a cap the response
  fails (`TooLarge`, `TooLong`) and its connection is closed.

How the connections are opened (TCP, TLS) is `Origin`'s alone (`Origin.of`, `Origin.connect`):
proxies, TLS options and Unix sockets go there.

Errors, all translated into the proxy's `Upstream*` errors by `proxy.upstream` (`_Try`):

    OSError (refused, reset, unreachable, TLS), TimeoutError (connect or read timeout)
    ├── ClosedEarly      the connection closed before the response's first byte
    ResponseError
    ├── BrokenOff        the connection ended, or failed, in the middle of the response
    ├── InvalidResponse  bytes that are not an HTTP/1.1 response (or an encoding not asked for)
    ├── TooLarge         a body over its cap in bytes
    └── TooLong          a stream past its cap in seconds
"""

from __future__ import annotations

import asyncio
import copy
import math
import operator
import ssl
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Final, cast
from urllib.parse import urlsplit

import httptools

# A stream's reader this far behind stops the socket being read until it catches up.
_HIGH_WATER = 1 << 20
_LOW_WATER = 1 << 18
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Request heads remembered per pool (see `Pool.head`); a trace's `traceparent` makes every head
# new, so the memo is emptied when full rather than grown.
_MAX_HEADS = 256
_UNCAPPED = 1 << 62  # a body cap that never binds


class ClosedEarly(ConnectionError):
    """The server closed the connection before the first byte of its response."""


class ResponseError(Exception):
    """The server's response could not be read to its end."""


class BrokenOff(ResponseError):
    """The connection ended, or failed, in the middle of the response."""


class InvalidResponse(ResponseError):
    """What the server sent is not an HTTP/1.1 response this client reads."""


class TooLarge(ResponseError):
    """The body went over its cap in bytes (decoded)."""


class TooLong(ResponseError):
    """The streamed body went on past its cap in seconds."""


ERRORS: tuple[type[Exception], ...] = (ClosedEarly, BrokenOff, InvalidResponse, TooLarge, TooLong)
"""Every exception class of this module's own that `Pool.send` and a response raise; they raise
OSError and TimeoutError besides."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where the requests go: scheme, host, port, and the TLS context for https."""

    scheme: str
    host: str
    port: int
    tls: ssl.SSLContext | None

    @classmethod
    def of(cls, url: str) -> Origin:
        """The origin of an absolute http(s) URL. Raises ValueError for any other."""
        parts = urlsplit(url)
        if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or _DEFAULT_PORTS[parts.scheme]
        tls = ssl.create_default_context() if parts.scheme == "https" else None
        return cls(parts.scheme, parts.hostname, port, tls)

    async def connect(
        self, loop: asyncio.AbstractEventLoop, protocol: Callable[[], Connection]
    ) -> Connection:
        """Open a connection to this origin, `protocol()` reading it: the one place that says
        how the upstream is reached (TCP, TLS over it for https). Environment proxies (a CONNECT
        tunnel first), TLS options (the context `of` makes) and Unix sockets
        (`loop.create_unix_connection`) belong here and in `of`; nothing above `Pool` changes.
        Raises OSError (refused, unreachable, TLS) as the socket does."""
        _, connection = await loop.create_connection(
            protocol,
            self.host,
            self.port,
            ssl=self.tls,
            server_hostname=self.host if self.tls else None,
        )
        return connection

    @property
    def host_header(self) -> str:
        """The `host` header's value: the port only when it is not the scheme's default."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == _DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


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
        "head_only",
        "limit",
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
        self._headed = False
        self._chunks: deque[bytes] = deque()
        self._paused = False
        self._error: BaseException | None = None
        self._decoder: zlib._Decompress | None = None
        self._ends_at_close = False
        # The caps (`Pool.send` sets them): body bytes (decoded), and for an error status the
        # lower `error_limit`; the loop time a stream must have ended by. `taken`: bytes so far.
        self.limit = self.error_limit = _UNCAPPED
        self.deadline = math.inf
        self.taken = 0

    def _fail(self, error: BaseException) -> None:
        if self.complete or self._error is not None:
            return
        self._error = error
        self._wake()

    @property
    def headers(self) -> dict[str, str]:
        """The head's headers, names lower-case, repeated ones joined with ", " (decoded when
        first read: most responses are read for their status and body only)."""
        headers = self._headers
        if headers is None:
            headers = self._headers = {}
            for name, value in self.raw_headers:
                key = name.decode("latin-1").lower()
                text = value.decode("latin-1")
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

    def __init__(self, pool: Pool) -> None:
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
        self._response.got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.broken(InvalidResponse("an upgrade to another protocol, never asked for"))
        except httptools.HttpParserError as exc:
            self.broken(InvalidResponse(f"bytes that are not an HTTP/1.1 response: {exc}"))

    def eof_received(self) -> bool:
        return False  # the transport closes itself; connection_lost says what it ended

    def connection_lost(self, exc: Exception | None) -> None:
        self._drop_parser()
        self.closed = True
        self.reusable = False
        self._pool.unwatch(self)
        response = self._response
        if response is not None and not response.complete:
            if response.ends_at_close and exc is None:
                response.on_message_complete()
            elif response.got_bytes:
                error: BaseException = BrokenOff(
                    "the connection closed in the middle of the response"
                    + (f" ({exc.__class__.__name__}: {exc})" if exc else "")
                )
            else:
                error = ClosedEarly(
                    "the connection closed before a response"
                    + (f" ({exc.__class__.__name__}: {exc})" if exc else "")
                )
            response._fail(error)
        self._pool._lost(self)

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
        """The sweep found `response` past its deadline (`max_stream_seconds`): failed, the
        connection closed, unwatched."""
        response._fail(TooLong("a streamed body past its limit in seconds"))
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


class Pool:
    """Keep-alive connections to one origin: at most `limit` open, idle ones reused newest first."""

    def __init__(
        self,
        origin: Origin,
        *,
        limit: int,
        keepalive: float,
        connect_timeout: float,
        read_timeout: float,
        max_response_bytes: int = _UNCAPPED,
        max_stream_bytes: int = _UNCAPPED,
        max_stream_seconds: float = math.inf,
    ) -> None:
        self.origin = origin
        self.max_response_bytes = max_response_bytes
        self.max_stream_bytes = max_stream_bytes
        self.max_stream_seconds = max_stream_seconds
        self.loop = asyncio.get_running_loop()
        self.limit = limit
        self.keepalive = keepalive
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.host = origin.host_header
        self._idle: list[Connection] = []
        self._open = 0  # connections being made, busy or idle
        # Connections awaiting a response, and the timer of the sweep that checks their silence.
        self._busy: set[Connection] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self._heads: dict[tuple[object, ...], bytes] = {}
        self._tick = min(read_timeout / 4, 1.0)
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.closed = False

    @property
    def idle(self) -> int:
        """Connections in the pool waiting for a request."""
        return len(self._idle)

    async def send(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        fresh: bool = False,
        streamed: bool = False,
    ) -> tuple[Connection, AwaitedResponse]:
        """Send a request on an idle connection, or a new one (`fresh`: always a new one); the
        connection it went out on, and its response (see `AwaitedResponse`), capped as a stream
        when it is to be read as one (`streamed`), else as a body read whole.

        Raises OSError or TimeoutError when no connection could be made, ValueError for a header
        with a line break, and RuntimeError once the pool is closed.
        """
        head = self.head(method, target, headers, body)
        connection = await (self._new_connection() if fresh else self._connection())
        # A HEAD's response has no body whatever its length says.
        response = AwaitedResponse(connection, self.loop, head_only=method == "HEAD")
        self._cap(response, streamed)
        connection.send(head, body, response)
        return connection, response

    def _cap(self, response: Response, streamed: bool) -> None:
        """Set `response`'s caps: a stream's bytes and deadline, or a whole body's bytes; an
        error body is read whole, so it has the lower of the two."""
        response.error_limit = self.max_response_bytes
        if streamed:
            response.limit = self.max_stream_bytes
            response.deadline = self.loop.time() + self.max_stream_seconds
        else:
            response.limit = self.max_response_bytes

    def idle_connection(self) -> Connection | None:
        """An idle connection to send a request on with `deliver` (None: none is idle)."""
        if self.closed:
            raise RuntimeError("the upstream's connection pool is closed")
        return self._idle_connection()

    def deliver(
        self,
        delivery: Delivery,
        connection: Connection,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
    ) -> None:
        """Send a request on `connection` (from `idle_connection`), its response read whole into
        `delivery` (see `Delivery`).

        Raises ValueError for a header with a line break (the connection stays idle).
        """
        delivery._connection = connection
        self._cap(delivery, streamed=False)
        try:
            head = self.head(method, target, headers, body)
        except ValueError:
            self._idle.append(connection)
            raise
        connection.send(head, body, delivery)

    def head(
        self, method: str, target: str, headers: Mapping[str, str], body: bytes | None
    ) -> bytes:
        """`encode_head` for this pool's host, its line and headers remembered per (method,
        target, headers): an upstream's requests mostly repeat them, only their length differs.
        Raises ValueError for a header with a line break."""
        key = (method, target, *headers.items())
        start = self._heads.get(key)
        if start is None:
            start = encode_head(method, target, self.host, headers, None)[:-2]  # no blank line
            if len(self._heads) >= _MAX_HEADS:
                self._heads.clear()
            self._heads[key] = start
        if body is None:
            return start + b"\r\n"
        return b"%scontent-length: %d\r\n\r\n" % (start, len(body))

    def watch(self, connection: Connection) -> None:
        """Check `connection`'s silence from now on (it sent a request)."""
        self._busy.add(connection)
        if self._sweep is None:
            self._sweep = self.loop.call_later(self._tick, self._check_silences)

    def unwatch(self, connection: Connection) -> None:
        """Stop checking `connection`'s silence (its response ended, or it closed)."""
        self._busy.discard(connection)

    def _check_silences(self) -> None:
        self._sweep = None
        now = self.loop.time()
        for connection in list(self._busy):
            if not connection.check_silence(now, self.read_timeout):
                self._busy.discard(connection)
        if self._busy:
            self._sweep = self.loop.call_later(self._tick, self._check_silences)

    def release(self, connection: Connection, response: Response) -> None:
        """Done with `response`: its connection back to the pool if reusable, else closed."""
        if not connection.done_with(response) or self.closed:
            connection.close()
            return
        connection.idle_since = self.loop.time()
        self._idle.append(connection)
        self._wake_one()

    async def _connection(self) -> Connection:
        return self._idle_connection() or await self._new_connection()

    def _idle_connection(self) -> Connection | None:
        now = self.loop.time()
        while self._idle:
            connection = self._idle.pop()
            if connection.writable and now - connection.idle_since < self.keepalive:
                connection.reused = True
                return connection
            connection.close()  # idle too long, or closed by the server meanwhile
        return None

    async def _new_connection(self) -> Connection:
        if self.closed:
            raise RuntimeError("the upstream's connection pool is closed")
        while self._open >= self.limit:
            waiter = self.loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            if self._idle:
                return await self._connection()
        # The slot is this attempt's until a connection is made; the connection then holds it
        # until it is lost (also when the connect timeout cancels the attempt after that).
        self._open += 1
        made: list[Connection] = []

        def protocol() -> Connection:
            made.append(Connection(self))
            return made[-1]

        try:
            async with asyncio.timeout(self.connect_timeout):
                connection = await self.origin.connect(self.loop, protocol)
        except BaseException:
            if not made or not made[0].was_made:  # else its connection_lost gives the slot back
                self._open -= 1
                self._wake_one()
            raise
        return connection

    def _lost(self, connection: Connection) -> None:
        if not connection.connected:
            return
        connection.connected = False
        self._open -= 1
        if connection in self._idle:
            self._idle.remove(connection)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        """Close every connection; a busy one closes when it is released."""
        self.closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(RuntimeError("the upstream's connection pool is closed"))
        self._waiters.clear()
        await asyncio.sleep(0)  # let the transports' close callbacks run
