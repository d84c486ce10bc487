"""A pool of keep-alive HTTP/1.1 connections (`proxy.upstream_http1`'s) to one upstream origin.

- `Pool.send()` sends a request on an idle connection (or a new one, up to `limit`; with `fresh`,
  always a new one) and returns an `AwaitedResponse`, read by a task; `Pool.release()` gives the
  connection back when the body was read to its end and the server keeps it alive, and closes it
  otherwise.
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
  a request's instructions. A stream whose reader is behind is not silent (see the connection's
  back-pressure).
- Each response's body is capped in bytes (`max_response_bytes` for one read whole and for any
  error body, `max_stream_bytes` for a stream) and every try in duration (`total_timeout` from
  its request, and a stream's `max_stream_seconds`: the one that ends first; checked by the
  silence sweep). Past a cap the response fails (`TooLarge`, `Overdue`, `TooLong`) and its
  connection is closed.
- A request that finds all `limit` connections busy waits for one at most `pool_timeout`
  seconds, then fails (`PoolExhausted`); `exhausted` says whether a request would wait now.

The connections are opened by the pool's `Origin` (`proxy.upstream_origin`), which also says
what a request's head carries for a forward proxy (`Origin.forward`); what the pool and
its responses raise is drawn in `proxy.upstream_errors`.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial

from proxy.upstream_errors import PoolExhausted, TooLong
from proxy.upstream_http1 import (
    UNCAPPED,
    AwaitedResponse,
    Connection,
    Delivery,
    ForwardedConnection,
    Response,
    encode_head,
)
from proxy.upstream_origin import Origin

# Request heads remembered per pool (see `Pool.head`); a trace's `traceparent` makes every head
# new, so the memo is emptied when full rather than grown.
_MAX_HEADS = 256


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
        max_response_bytes: int = UNCAPPED,
        max_stream_bytes: int = UNCAPPED,
        max_stream_seconds: float = math.inf,
        total_timeout: float = math.inf,
        pool_timeout: float = math.inf,
    ) -> None:
        self.origin = origin
        self.total_timeout = total_timeout
        self.pool_timeout = pool_timeout
        self.max_response_bytes = max_response_bytes
        self.max_stream_bytes = max_stream_bytes
        self.max_stream_seconds = max_stream_seconds
        self.loop = asyncio.get_running_loop()
        self.limit = limit
        self.keepalive = keepalive
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.host = origin.host_header
        # Through a forward proxy a plain request names its whole URL and carries the proxy's
        # credentials, and a 407 is the proxy's: decided here, once, and paid for only when a
        # head is first encoded (`head`). A direct origin's connections and heads are as ever.
        self._target_prefix, self._proxy_headers = origin.forward
        self._connection_type: Callable[[Pool], Connection] = (
            partial(ForwardedConnection, proxy=str(origin.proxy))
            if self._target_prefix
            else Connection
        )
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

    @property
    def exhausted(self) -> bool:
        """Whether a request would wait for a connection now: all `limit` are open, none idle."""
        return self._open >= self.limit and not self._idle

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
        """Set `response`'s caps: the try's deadline (`total_timeout`, or a stream's
        `max_stream_seconds` when that ends first) and a stream's or a whole body's bytes; an
        error body is read whole, so it has the lower of the two."""
        response.error_limit = self.max_response_bytes
        now = self.loop.time()
        response.deadline = now + self.total_timeout
        if streamed:
            response.limit = self.max_stream_bytes
            if self.max_stream_seconds < self.total_timeout:
                response.deadline = now + self.max_stream_seconds
                response.overdue = TooLong
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
            if self._target_prefix:
                target = self._target_prefix + target
                headers = {**headers, **self._proxy_headers}
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
        if self._open >= self.limit:
            # Waiting for a connection to come free has a deadline of its own: four clients
            # that left against an upstream dripping its answers held every later request, and
            # /readyz, for as long as the drips went on.
            deadline = self.loop.time() + self.pool_timeout
            while self._open >= self.limit:
                await self._wait_for_slot(deadline)
                if self._idle:
                    return await self._connection()
        # The slot is this attempt's until a connection is made; the connection then holds it
        # until it is lost (also when the connect timeout cancels the attempt after that).
        self._open += 1
        made: list[Connection] = []

        def protocol() -> Connection:
            made.append(self._connection_type(self))
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

    async def _wait_for_slot(self, deadline: float) -> None:
        """Wait until a connection is given back or lost. Raises PoolExhausted at `deadline`."""
        waiter = self.loop.create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout_at(deadline):
                await waiter
        except TimeoutError:
            if waiter.done() and not waiter.cancelled():
                self._wake_one()  # woken as its time ran out: the wake goes to the next one
            raise PoolExhausted(
                f"all {self.limit} connections stayed busy for {self.pool_timeout:g} s"
            ) from None
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def lost(self, connection: Connection) -> None:
        """`connection` closed: its slot is free."""
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
