"""The RedisStore's connection to Redis: one connection shared by every call of the store, made
by redis-py, then read and written as a plain asyncio protocol: the calls of one turn of the
event loop written together (auto-pipelining), replies parsed by hiredis as they arrive,
scripts run by their SHA.

redis-py's client costs more per command than the command's round trip: an observability
record, a retry wrapper, a pool guarded by a lock and a condition that also reads the socket to
check it, a task for each write's timeout, one connection (and one write and one read on both
sides) per command in flight. Measured in-process (bench.hotpath --stores, 16 requests in
flight; bench/results/sessions-redis.md), a chat request on Redis cost 248 µs of the proxy's CPU
with that client and its scripts against 124 here (memory: 68-76), and redis-server 38 µs against
23. The connection and its handshake (AUTH, SELECT, TLS) stay redis-py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from proxy.errors import ConfigError
from proxy.session.stores import without_password

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection, ConnectionPool


def command(*parts: str) -> bytes:
    """One command in Redis's wire form (RESP), ready to write."""
    return pack(parts)


def pack(parts: Sequence[str | bytes]) -> bytes:
    """A command of `parts` (strings as UTF-8) in Redis's wire form."""
    texts = [part for part in parts if type(part) is str]
    if len(texts) == len(parts):
        body = _bulk(texts)
        if body.isascii():
            # ASCII (the store's ids, keys and figures): formatted as one text and encoded
            # once, a third faster than encoding part by part (`pack_bytes`; a test packs both).
            return (f"*{len(texts)}\r\n" + body).encode()
    return pack_bytes(parts)


_BULK_HEADS = tuple(f"${size}\r\n" for size in range(1024))
"""The head of a bulk string of each size up to 1023: most of a part's formatting, done once."""


def _bulk(texts: Iterable[str]) -> str:
    """`texts` as RESP bulk strings, each length counted in characters (bytes, where ASCII)."""
    try:
        # A head looked up rather than formatted with the length's digits each time.
        return "".join([f"{_BULK_HEADS[len(text)]}{text}\r\n" for text in texts])
    except IndexError:  # a part too long for the table
        return "".join([f"${len(text)}\r\n{text}\r\n" for text in texts])


def pack_bytes(parts: Iterable[str | bytes]) -> bytes:
    """`pack`, part by part: any text, any bytes."""
    out = []
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"*%d\r\n" % len(out) + b"".join(out)


def lua_string(text: str) -> str:
    """`text` as a Lua string literal, every byte escaped (safe for any prefix)."""
    return '"' + "".join(f"\\{byte}" for byte in text.encode()) + '"'


class Script:
    """A Lua script, run with EVALSHA by its SHA-1 (loaded on the server where it is missing)."""

    __slots__ = ("_head", "sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
        self._head = f"$7\r\nEVALSHA\r\n${len(self.sha)}\r\n{self.sha}\r\n"

    def packed(self, keys: Sequence[str], args: Sequence[str]) -> bytes:
        """The EVALSHA command of this script with `keys` and `args` (as `pack` packs it)."""
        body = _bulk((*keys, *args))
        if not body.isascii():
            return pack_bytes(("EVALSHA", self.sha, str(len(keys)), *keys, *args))
        # The command's name and SHA formatted once, each part's head looked up (`_bulk`), the
        # lengths counted as characters (ASCII: bytes): 1.6 µs for the apply script's 14 parts
        # against 2.5 through `pack` (timeit, this machine).
        count = str(len(keys))
        size = len(keys) + len(args) + 3
        return f"*{size}\r\n{self._head}${len(count)}\r\n{count}\r\n{body}".encode()


class StaleConnection(Exception):
    """A write went to a connection that had been idle and turned out closed (a restart, the
    server's idle timeout), before any reply: nothing ran, so the commands may go again."""


class Connections:
    """One connection to the Redis of `url`, made on first use and shared by every call: the
    commands of all calls made in one turn of the event loop go out in one write, and their
    replies come back in order, each handed to its call as it is read (auto-pipelining; see
    `Pipe`). A call waits up to
    `timeout_s` for its reply; past it the connection is closed (a reply may still be due on
    it), the call and those waiting with it fail, and the next call opens a new one. Failures
    are redis-py's errors (RedisError subclasses: ConnectionError, TimeoutError, ResponseError).

    Under load this is what makes Redis cheap: one write and one read per batch of requests on
    both sides instead of one per request (bench.hotpath --stores --concurrency 16).

    Raises:
        ConfigError: the URL cannot be parsed, or the `redis` or `hiredis` package is not
            installed.
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        try:
            import hiredis  # noqa: F401 - replies are parsed with its reader (`Pipe`)
            import redis.asyncio
            import redis.exceptions
        except ImportError as exc:
            raise ConfigError(
                f"session store {without_password(url)!r} needs the redis and hiredis "
                "packages: pip install 'toolsentry[redis]'"
            ) from exc
        try:
            # Only to parse the URL and make connections (the handshake: TLS, AUTH, SELECT).
            self._factory: ConnectionPool = redis.asyncio.ConnectionPool.from_url(
                url,
                decode_responses=True,
                socket_timeout=None,  # the call's own deadline covers the write and the read
                socket_connect_timeout=timeout_s,
            )
        except ValueError as exc:
            raise ConfigError(f"invalid session store {without_password(url)!r}: {exc}") from exc
        self._timeout = timeout_s
        self._pipe: Pipe | None = None
        self._response_error = redis.exceptions.ResponseError
        self._no_script = redis.exceptions.NoScriptError
        self.errors: type[Exception] = redis.exceptions.RedisError
        """What every failure here is an instance of (redis-py's root error)."""

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[str]) -> Any:
        """Run `script` with `keys` and `args`; its reply. Raises redis-py's errors (a script
        error as ResponseError)."""
        packed = script.packed(keys, args)
        try:
            reply = (await self._open_pipe().exchange((packed,)))[0]
        except StaleConnection as exc:
            reply = (await self._again((packed,), exc))[0]
        if isinstance(reply, self._response_error):
            if not isinstance(reply, self._no_script):
                raise reply
            # A server that restarted or was flushed forgets loaded scripts: load it, again.
            await self.call(command("SCRIPT", "LOAD", script.source))
            return await self.call(packed)
        return reply

    async def call(self, packed: bytes) -> Any:
        """Send one packed command; its reply (an error reply raised as ResponseError)."""
        return (await self.call_many((packed,)))[0]

    async def call_many(self, commands: Sequence[bytes]) -> list[Any]:
        """Send `commands` together; their replies, in order (a pipeline, not a transaction).
        Commands written to a connection found closed before it answered go again, once."""
        if not commands:
            return []
        try:
            replies = await self._open_pipe().exchange(commands)
        except StaleConnection as exc:
            replies = await self._again(commands, exc)
        for reply in replies:
            if isinstance(reply, self._response_error):
                raise reply
        return replies

    async def _again(self, commands: Sequence[bytes], stale: StaleConnection) -> list[Any]:
        """`commands` sent again, on a new connection, after `stale`."""
        from redis.exceptions import ConnectionError as RedisConnectionError

        try:
            return await self._open_pipe().exchange(commands)
        except StaleConnection as again:
            raise RedisConnectionError(str(again)) from stale

    def _open_pipe(self) -> Pipe:
        pipe = self._pipe
        if pipe is None or pipe.closed:
            connection: AbstractConnection = self._factory.make_connection()  # type: ignore[no-untyped-call]
            pipe = self._pipe = Pipe(connection, self._timeout)
        return pipe

    async def close(self) -> None:
        """Close the connection; the store is unusable afterwards."""
        if self._pipe is not None:
            await self._pipe.close()


class Pipe(asyncio.Protocol):
    """One connection's commands and replies, as the protocol of its transport: once redis-py
    has made the connection (TLS, AUTH, SELECT), the pipe takes its transport over and is
    handed each read as it arrives, parsed by hiredis, each reply to the call it answers in
    order (a cancelled call's read and dropped). A call on an idle connection writes its
    commands at once; calls made while replies are due queue theirs, written together once the
    loop's turn is over.

    redis-py's own reading costs a task woken per batch of replies and, per reply, its
    connection's, parser's and stream reader's coroutines; as the transport's protocol the pipe
    costs none of them (bench.hotpath --stores: bench/results/sessions-redis.md).
    """

    def __init__(self, connection: AbstractConnection, timeout_s: float) -> None:
        self.connection = connection
        self.closed = False
        self._timeout = timeout_s
        self._transport: asyncio.WriteTransport | None = None
        self._parser: Any = None  # hiredis's Reader, made with the transport's takeover
        self._outbox: list[bytes] = []
        self._queued: list[tuple[asyncio.Future[list[Any]], int]] = []
        # Written, replies due: the call's future, its reply count, whether the write found
        # the connection idle, when it was written (the loop's clock).
        self._due: deque[tuple[asyncio.Future[list[Any]], int, bool, float]] = deque()
        self._replies: list[Any] = []  # those of the oldest call due, while it has not all
        self._timer: asyncio.TimerHandle | None = None
        self._answered = False
        self._flushing = False  # a write (or the connection's making) is on its way
        self._connecting: asyncio.Task[None] | None = None
        self._closing: asyncio.Task[None] | None = None
        self._lost: asyncio.Future[None] | None = None

    def exchange(self, commands: Sequence[bytes]) -> asyncio.Future[list[Any]]:
        """The replies to `commands`, once they come, error replies as ResponseError objects
        in their place. A future, not a coroutine: the caller awaits it, one frame less.

        The future fails with StaleConnection (see there), or redis-py's ConnectionError or
        TimeoutError (no reply in `timeout_s`: the connection is closed, for a reply may still
        come on it).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        self._outbox.extend(commands)
        self._queued.append((future, len(commands)))
        if not self._flushing:
            self._flushing = True
            if self._transport is None:
                self._connecting = loop.create_task(self._connect())
            elif not self._due:
                self._flush()  # idle: nothing to batch with
            else:
                # Once this turn of the loop is over: the calls made meanwhile join the write.
                loop.call_soon(self._flush)
        return future

    async def _connect(self) -> None:
        """Make the connection (redis-py's handshake), take its transport over, write what is
        queued."""
        import hiredis
        from redis._parsers.base import BaseParser
        from redis.exceptions import ConnectionError, InvalidResponse

        connection = self.connection
        try:
            await connection.connect()  # type: ignore[no-untyped-call]
            # The stream redis-py made the connection with (a private attribute of its asyncio
            # connection; every Redis test goes through it): its transport, and no reply is
            # due on it (the handshake's have been read).
            writer = getattr(connection, "_writer", None)
            if writer is None:  # a redis-py that no longer keeps it: said, not an AttributeError
                raise ConnectionError(
                    f"redis {redis_version()} keeps no stream on its asyncio connection "
                    "(Connection._writer), which the session store takes over; install a "
                    "redis release that does (redis 8.2 does)"
                )
            transport: asyncio.WriteTransport = writer.transport
            encoder = connection.encoder
            self._parser = hiredis.Reader(
                protocolError=InvalidResponse,
                replyError=BaseParser.parse_error,
                notEnoughData=_NOT_ENOUGH_DATA,
                encoding=encoder.encoding if encoder.decode_responses else None,
                errors=encoder.encoding_errors,
            )
            self._lost = asyncio.get_running_loop().create_future()
            transport.set_protocol(self)
            self._transport = transport
        except BaseException as exc:
            self._connecting = None
            self._fail(exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._connecting = None
        self._flush()

    def _flush(self) -> None:
        """Write what is queued, in one write."""
        self._flushing = False
        if self.closed or not self._outbox:
            return
        assert self._transport is not None
        data, queued = b"".join(self._outbox), self._queued
        self._outbox, self._queued = [], []
        idle, sent_at = not self._due, asyncio.get_running_loop().time()
        self._due.extend([(future, count, idle, sent_at) for future, count in queued])
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_at(sent_at + self._timeout, self._watch)
        try:
            self._transport.write(data)
        except Exception as exc:
            self._fail(exc)

    def data_received(self, data: bytes) -> None:
        """Hand each complete reply to the call it answers."""
        parser, due = self._parser, self._due
        parser.feed(data)
        while (reply := parser.gets()) is not _NOT_ENOUGH_DATA:
            if not due:
                from redis.exceptions import ConnectionError as RedisConnectionError

                error = RedisConnectionError(f"Redis sent a reply nobody asked for: {reply!r}")
                self._fail(error)
                return
            replies = self._replies
            replies.append(reply)
            future, count = due[0][:2]
            if len(replies) == count:
                due.popleft()
                self._answered = True
                self._replies = []
                if not future.done():
                    future.set_result(replies)

    def connection_lost(self, exc: Exception | None) -> None:
        from redis.exceptions import ConnectionError as RedisConnectionError

        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)
        self._fail(exc or RedisConnectionError("Redis closed the connection"))

    def _watch(self) -> None:
        """Fail the pipe once the oldest write waits for its replies `timeout_s`; one timer for
        every call, re-armed as the replies come (a timer per call costs as much as the call)."""
        self._timer = None
        if self.closed or not self._due:
            return
        loop = asyncio.get_running_loop()
        deadline = self._due[0][3] + self._timeout
        if loop.time() < deadline:
            self._timer = loop.call_at(deadline, self._watch)
            return
        from redis.exceptions import TimeoutError as RedisTimeoutError

        self._fail(RedisTimeoutError(f"no reply from Redis in {self._timeout} s"))

    def _fail(self, exc: BaseException, *, disconnect: bool = True) -> None:
        """Close the pipe: every call waiting on it fails (with StaleConnection where nothing
        it sent can have run), and the connection is dropped."""
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import RedisError

        if self.closed:
            return
        self.closed = True
        error = (
            exc
            if isinstance(exc, RedisError)
            else RedisConnectionError(f"Redis connection failed: {exc!r}")
        )
        stale = StaleConnection(f"Redis closed an idle connection: {error}")
        for future, _ in self._queued:
            if not future.done():  # never written: it may go again where the connection served
                future.set_exception(stale if self._answered else error)
        for future, _, idle, _ in self._due:
            if not future.done():
                retry = idle and self._answered and isinstance(error, RedisConnectionError)
                future.set_exception(stale if retry else error)
        self._queued.clear()
        self._due.clear()
        self._outbox.clear()
        if self._timer is not None:
            self._timer.cancel()
        connecting = self._connecting
        if connecting is not None and connecting is not asyncio.current_task():
            connecting.cancel()
        if self._transport is not None:
            self._transport.abort()  # nothing more is written or read: no flush to wait for
        if disconnect:  # redis-py's connection forgets its streams (and closes one not taken)
            self._closing = asyncio.get_running_loop().create_task(
                self.connection.disconnect(nowait=True)
            )

    async def close(self) -> None:
        """Fail what is waiting and close the connection."""
        from redis.exceptions import ConnectionError as RedisConnectionError

        connecting = self._connecting
        self._fail(RedisConnectionError("the session store was closed"), disconnect=False)
        if connecting is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await connecting
        if self._closing is not None:
            await self._closing
        # Not waiting for the close in redis-py's way: its stream no longer hears of it.
        await self.connection.disconnect(nowait=self._lost is not None)
        if self._lost is not None:
            await self._lost


_NOT_ENOUGH_DATA = object()
"""What hiredis's reader gives while a reply is incomplete (False and None are replies)."""


def redis_version() -> str:
    """The installed redis-py's version, for an error message."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("redis")
    except PackageNotFoundError:
        return "(version unknown)"
