"""The RedisStore's connections to Redis: a bounded set of redis-py connections, each command
written as one packed buffer and its reply read with the connection's parser (hiredis's when
installed), and scripts run by their SHA.

redis-py's client costs more per command than the command's round trip: an observability
record, a retry wrapper, a pool guarded by a lock and a condition that also reads the socket to
check it, a task for each write's timeout. Measured in-process (bench.hotpath --stores), one
chat request on Redis cost 259 µs of the proxy's CPU beyond memory's 62 with that client, of
which this path saves most; the connections, their handshake (AUTH, SELECT, TLS) and their
parsers stay redis-py's.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from proxy.errors import ConfigError
from proxy.session.stores import without_password

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection, ConnectionPool


def command(*parts: str) -> bytes:
    """One command in Redis's wire form (RESP), ready to write."""
    return pack(parts)


def pack(parts: Iterable[str | bytes]) -> bytes:
    """A command of `parts` (strings as UTF-8) in Redis's wire form."""
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

    __slots__ = ("head", "sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
        self.head = b"$7\r\nEVALSHA\r\n$40\r\n" + self.sha.encode() + b"\r\n"

    def packed(self, keys: Sequence[str], args: Sequence[str]) -> bytes:
        """The EVALSHA command of this script with `keys` and `args`."""
        body = pack((str(len(keys)), *keys, *args))
        # pack's count covers its own parts; the two in `head` are added here.
        count, _, rest = body.partition(b"\r\n")
        return b"*%d\r\n" % (int(count[1:]) + 2) + self.head + rest


class Connections:
    """Up to `limit` connections to the Redis of `url`, made on first use. A call waits up to
    `timeout_s` for a free connection and up to `timeout_s` for its reply; past either it raises
    redis-py's TimeoutError or ConnectionError (RedisError subclasses, as every failure here).

    Raises:
        ConfigError: the URL cannot be parsed, or the `redis` package is not installed.
    """

    def __init__(self, url: str, limit: int, timeout_s: float) -> None:
        try:
            import redis.asyncio
        except ImportError as exc:
            raise ConfigError(
                f"session store {without_password(url)!r} needs the redis package: "
                "pip install 'toolsentry[redis]'"
            ) from exc
        try:
            # Only to parse the URL and make connections: this class lends them out.
            self._factory: ConnectionPool = redis.asyncio.ConnectionPool.from_url(
                url,
                decode_responses=True,
                socket_timeout=None,  # the call's own deadline covers the write and the read
                socket_connect_timeout=timeout_s,
            )
        except ValueError as exc:
            raise ConfigError(f"invalid session store {without_password(url)!r}: {exc}") from exc
        self._timeout = timeout_s
        self._idle: list[AbstractConnection] = []
        self._made: list[AbstractConnection] = []
        self._limit = limit
        self._slots: asyncio.Semaphore | None = None

    async def run(self, script: Script, keys: Sequence[str], args: Sequence[str]) -> Any:
        """Run `script` with `keys` and `args`; its reply. Raises redis-py's errors (a script
        error as ResponseError)."""
        from redis.exceptions import NoScriptError

        try:
            return await self.call(script.packed(keys, args))
        except NoScriptError:
            # A server that restarted or was flushed forgets loaded scripts: load it, again.
            await self.call(command("SCRIPT", "LOAD", script.source))
            return await self.call(script.packed(keys, args))

    async def call(self, packed: bytes) -> Any:
        """Send one packed command; its reply (an error reply raised as ResponseError)."""
        return (await self.call_many([packed]))[0]

    async def call_many(self, commands: Sequence[bytes]) -> list[Any]:
        """Send `commands` in one write; their replies, in order (a pipeline, not a transaction).
        A connection that was idle and turns out closed is replaced, once."""
        from redis.exceptions import ConnectionError as RedisConnectionError

        if not commands:
            return []
        slots = self._slots
        if slots is None:
            slots = self._slots = asyncio.Semaphore(self._limit)
        if slots.locked():
            try:
                async with asyncio.timeout(self._timeout):
                    await slots.acquire()
            except TimeoutError:
                raise RedisConnectionError(
                    f"no connection free in {self._timeout} s ({self._limit} in use)"
                ) from None
        else:
            await slots.acquire()
        try:
            reused = bool(self._idle)
            try:
                return await self._exchange(commands)
            except RedisConnectionError:
                if not reused:
                    raise
                # The server may have closed an idle connection (a restart, a timeout): a
                # closed connection ran nothing, so the commands go again on a new one.
                return await self._exchange(commands)
        finally:
            slots.release()

    async def _exchange(self, commands: Sequence[bytes]) -> list[Any]:
        from redis.exceptions import ResponseError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        connection = self._idle.pop() if self._idle else self._make()
        replies: list[Any] = []
        try:
            async with asyncio.timeout(self._timeout):
                await connection.send_packed_command(b"".join(commands), check_health=False)
                error = None
                for _ in commands:
                    try:
                        replies.append(await connection.read_response())
                    except ResponseError as exc:  # an error reply: the connection is fine
                        error = error or exc
                        replies.append(exc)
        except TimeoutError:
            # Cancelled mid-exchange, redis-py has closed the connection (a reply may be due).
            raise RedisTimeoutError(f"no reply from Redis in {self._timeout} s") from None
        finally:
            # A connection an error closed reconnects on its next use.
            self._idle.append(connection)
        if error is not None:
            raise error
        return replies

    def _make(self) -> AbstractConnection:
        connection: AbstractConnection = self._factory.make_connection()  # type: ignore[no-untyped-call]
        self._made.append(connection)
        return connection

    async def close(self) -> None:
        """Close every connection; the store is unusable afterwards."""
        for connection in self._made:
            await connection.disconnect()
        self._idle.clear()
        self._made.clear()
