"""The RedisStore's connection to Redis: one redis-py connection shared by every call of the
store, the calls of one turn of the event loop written together (auto-pipelining), replies read
with the connection's parser (hiredis's when installed), scripts run by their SHA.

redis-py's client costs more per command than the command's round trip: an observability
record, a retry wrapper, a pool guarded by a lock and a condition that also reads the socket to
check it, a task for each write's timeout, one connection (and one write and one read on both
sides) per command in flight. Measured in-process (bench.hotpath --stores, 16 requests in
flight; bench/results/sessions-redis.md), a chat request on Redis cost 248 µs of the proxy's CPU
with that client and its scripts against 124 here (memory: 68-76), and redis-server 38 µs against
23. The connection, its handshake (AUTH, SELECT, TLS) and its parser stay redis-py's.
"""

from __future__ import annotations

import asyncio
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
    if len(texts) == len(parts) and "".join(texts).isascii():
        # ASCII (the store's ids, keys and figures): formatted as one text and encoded once,
        # a third faster than encoding part by part (`pack_bytes`; a test packs both ways).
        body = "".join([f"${len(text)}\r\n{text}\r\n" for text in texts])
        return (f"*{len(texts)}\r\n" + body).encode()
    return pack_bytes(parts)


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

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()

    def packed(self, keys: Sequence[str], args: Sequence[str]) -> bytes:
        """The EVALSHA command of this script with `keys` and `args`."""
        return pack(("EVALSHA", self.sha, str(len(keys)), *keys, *args))


class StaleConnection(Exception):
    """A write went to a connection that had been idle and turned out closed (a restart, the
    server's idle timeout), before any reply: nothing ran, so the commands may go again."""


class Connections:
    """One connection to the Redis of `url`, made on first use and shared by every call: the
    commands of all calls made in one turn of the event loop go out in one write, and their
    replies come back in order, read by one task (auto-pipelining). A call waits up to
    `timeout_s` for its reply; past it the connection is closed (a reply may still be due on
    it), the call and those waiting with it fail, and the next call opens a new one. Failures
    are redis-py's errors (RedisError subclasses: ConnectionError, TimeoutError, ResponseError).

    Under load this is what makes Redis cheap: one write and one read per batch of requests on
    both sides instead of one per request (bench.hotpath --stores --concurrency 16).

    Raises:
        ConfigError: the URL cannot be parsed, or the `redis` package is not installed.
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        try:
            import redis.asyncio
            import redis.exceptions
        except ImportError as exc:
            raise ConfigError(
                f"session store {without_password(url)!r} needs the redis package: "
                "pip install 'toolsentry[redis]'"
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
        self.errors: type[Exception] = redis.exceptions.RedisError
        """What every failure here is an instance of (redis-py's root error)."""

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[str]) -> Any:
        """Run `script` with `keys` and `args`; its reply. Raises redis-py's errors (a script
        error as ResponseError)."""
        from redis.exceptions import NoScriptError

        try:
            return (await self.call_many([script.packed(keys, args)]))[0]
        except NoScriptError:
            # A server that restarted or was flushed forgets loaded scripts: load it, again.
            await self.call(command("SCRIPT", "LOAD", script.source))
            return await self.call(script.packed(keys, args))

    async def call(self, packed: bytes) -> Any:
        """Send one packed command; its reply (an error reply raised as ResponseError)."""
        return (await self.call_many([packed]))[0]

    async def call_many(self, commands: Sequence[bytes]) -> list[Any]:
        """Send `commands` together; their replies, in order (a pipeline, not a transaction).
        Commands written to a connection found closed before it answered go again, once."""
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import ResponseError

        if not commands:
            return []
        try:
            replies = await self._open_pipe().exchange(commands)
        except StaleConnection as exc:
            try:
                replies = await self._open_pipe().exchange(commands)
            except StaleConnection as again:
                raise RedisConnectionError(str(again)) from exc
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise reply
        return replies

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


class Pipe:
    """One connection's commands and replies. A call on an idle connection writes its commands
    at once; calls made while replies are due queue theirs, and a write task sends what is
    queued in one write once the loop's turn is over. A read task, alive as long as the
    connection, reads the replies in order and hands each call its own (a cancelled call's are
    read and dropped); it also sees a connection the server closes while idle."""

    def __init__(self, connection: AbstractConnection, timeout_s: float) -> None:
        self.connection = connection
        self.closed = False
        self._timeout = timeout_s
        self._outbox: list[bytes] = []
        self._queued: list[tuple[asyncio.Future[list[Any]], int]] = []
        # Written, replies due: the call's future, its reply count, whether the write found
        # the connection idle, when it was written (the loop's clock).
        self._due: deque[tuple[asyncio.Future[list[Any]], int, bool, float]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._answered = False
        self._writing = False
        self._writer: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closing: asyncio.Task[None] | None = None

    async def exchange(self, commands: Sequence[bytes]) -> list[Any]:
        """The replies to `commands`, error replies as ResponseError objects in their place.

        Raises StaleConnection (see there), or redis-py's ConnectionError or TimeoutError (no
        reply in `timeout_s`: the connection is closed, for a reply may still come on it).
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        self._outbox.extend(commands)
        self._queued.append((future, len(commands)))
        if not self._writing:
            self._writing = True
            if not self._due and self.connection.is_connected:
                # Idle: nothing to batch with, so no task (a task costs as much as the write).
                try:
                    await self._write()
                except BaseException:
                    # Cancelled mid-write: the pipe has failed this call's future; nobody
                    # awaits it now, so its error is taken here (asyncio would log it).
                    if future.done() and not future.cancelled():
                        future.exception()
                    raise
            else:
                # Runs once this turn of the loop is over: the calls made meanwhile join it.
                self._writer = loop.create_task(self._write())
        return await future  # the watchdog fails it when no reply comes in time

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

    async def _write(self) -> None:
        """Write what is queued, and what is queued meanwhile, until nothing is."""
        try:
            if not self.connection.is_connected:
                await self.connection.connect()  # type: ignore[no-untyped-call]
            loop = asyncio.get_running_loop()
            while self._outbox:
                data, queued = b"".join(self._outbox), self._queued
                self._outbox, self._queued = [], []
                idle, sent_at = not self._due, loop.time()
                self._due.extend((future, count, idle, sent_at) for future, count in queued)
                if self._reader is None:
                    self._reader = loop.create_task(self._read())
                if self._timer is None:
                    self._timer = loop.call_at(sent_at + self._timeout, self._watch)
                await self.connection.send_packed_command(data, check_health=False)
        except BaseException as exc:
            self._fail(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._writing = False
            self._writer = None

    async def _read(self) -> None:
        """Read replies for as long as the connection lives, each to the call it answers."""
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import ResponseError

        replies: list[Any] = []
        try:
            while True:
                try:
                    reply = await self.connection.read_response()
                except ResponseError as exc:  # an error reply: the connection is fine
                    reply = exc
                if not self._due:
                    raise RedisConnectionError(f"Redis sent a reply nobody asked for: {reply!r}")
                replies.append(reply)
                future, count = self._due[0][:2]
                if len(replies) == count:
                    self._due.popleft()
                    self._answered = True
                    if not future.done():
                        future.set_result(replies)
                    replies = []
        except BaseException as exc:
            self._fail(exc)
            if not isinstance(exc, Exception):
                raise

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
        for task in (self._writer, self._reader):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        if disconnect:
            self._closing = asyncio.get_running_loop().create_task(
                self.connection.disconnect(nowait=True)
            )

    async def close(self) -> None:
        """Fail what is waiting and close the connection."""
        from redis.exceptions import ConnectionError as RedisConnectionError

        self._fail(RedisConnectionError("the session store was closed"), disconnect=False)
        if self._closing is not None:
            await self._closing
        await self.connection.disconnect()
