"""The upstream client: one pool of keep-alive connections per upstream, retries.

The connections are `proxy.upstream_http1`'s (HTTP/1.1 written in one call, answers parsed by
httptools), pooled by `proxy.upstream_pool`: measured on this project's machines, aiohttp's
client cost five to six times their CPU per plain request (bench/results/upstreamclient.md), most
of the proxy's overhead at its rates (httpx's pool was slower still: bench/RESULTS.md).

`HttpUpstream` has one send path, as httpx has one `send` over a transport, in three modes:

- `request`: the response read whole by the awaiting task;
- `stream`: the response's body read as it arrives;
- `send`: no task awaits it; the answer, read whole, goes to a callback (`Sent`).

Every mode sends a try the same way (`HttpUpstream._open`: the request on a pooled connection, up
to its response's head; a reused connection the server closed unanswered replaced once, on a new
connection), opens the try's trace span the same way and maps the exceptions of the pool, the
socket and asyncio to `Upstream*` errors at one boundary, `_Try` (`proxy.upstream_errors`'
`translate` says how). `request` and `stream` retry connect errors, timeouts and 502/503/504
before the first byte; `send` never retries.

Where a connection goes and how it is opened (TCP with Happy Eyeballs for a name, TLS with the
upstream's `tls` options, a Unix socket, a forward proxy from the environment) is
`proxy.upstream_origin.Origin`'s alone, and what a request's target and credentials are, its
`BaseURL`'s: `HttpUpstream.__init__` reads the upstream's base URL once (`base_for`), and
`Origin.connect` opens the connections. Redirects are not followed: a 3xx is the answer, passed
back as it is (the upstream's URL comes only from configuration). What an upstream answers is
`proxy.upstream_response`'s; which upstream serves a model, `proxy.upstream_router`'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol, TypeVar

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from proxy import __version__
from proxy.config_upstream import UpstreamConfig
from proxy.errors import UpstreamConnectError, UpstreamError, UpstreamTimeoutError
from proxy.headers import HEADER_PREFIX
from proxy.tracing import CURRENT as CURRENT_TRACE
from proxy.tracing import AttemptSpan, RequestTrace
from proxy.upstream_errors import ClosedEarly, translate
from proxy.upstream_http1 import AwaitedResponse, Connection, Delivery, Response
from proxy.upstream_origin import base_for
from proxy.upstream_pool import Pool
from proxy.upstream_response import UpstreamResponse, UpstreamStream

RETRYABLE_STATUS = frozenset({502, 503, 504})
_MAX_CACHED_URLS = 64
_MAX_CACHED_REQUESTS = 256
_T = TypeVar("_T")

# Hop-by-hop and length headers are the transport's business, never forwarded either way; nor
# are `expect` (the proxy reads the whole body itself: an upstream's `100 Continue` is for it
# alone) and the proxy's own admin credential.
_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "expect",
        "x-admin-key",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
        "accept-encoding",
        "content-encoding",
    }
)


Done = Callable[["Sent", "UpstreamResponse | UpstreamError"], None]
"""The callback `HttpUpstream.send` hands its answer to: the request's `Sent`, then the response
or the `UpstreamError` it ended in."""


class Upstream(Protocol):
    """What the service and the shadow need from an upstream; `HttpUpstream` is the implementation.

    `headers` are the client's headers as they may be forwarded (`chat_request_headers`,
    `forwardable_headers`); the upstream adds its own key and a JSON content type by default.
    """

    name: str

    @property
    def exhausted(self) -> bool:
        """Whether a request would wait for a connection now (`/readyz` reports it)."""
        ...

    async def request(
        self, method: str, path: str, *, body: bytes | None, headers: Mapping[str, str]
    ) -> UpstreamResponse: ...

    def stream(
        self, path: str, *, body: bytes | None, headers: Mapping[str, str], method: str = "POST"
    ) -> AbstractAsyncContextManager[UpstreamStream]: ...

    def send(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None,
        headers: Mapping[str, str],
        done: Done,
        trace: RequestTrace | None = None,
        idle_only: bool = True,
    ) -> Sent | None: ...

    async def close(self) -> None: ...


USER_AGENT = f"toolsentry/{__version__}"

# A client's own credentials never go upstream: the upstream's key comes from configuration.
_CLIENT_KEYS = frozenset({"authorization", "x-api-key", "x-admin-key"})

# The proxy's own per-request controls (x-toolsentry-max-errors, x-toolsentry-repair).


def forwardable_headers(
    headers: Mapping[str, str], *, also_drop: frozenset[str] = frozenset()
) -> dict[str, str]:
    """Headers that may cross the proxy, in either direction, names lower-cased.

    Drops hop-by-hop ones (also those the `connection` header names, and every `proxy-*`),
    `expect`, `authorization`, `x-api-key` and `x-admin-key` (the upstream's key comes only from
    configuration), the proxy's own `x-toolsentry-*` controls, and `also_drop`. One pass over
    `headers`.
    """
    out: dict[str, str] = {}
    connection: str | None = None
    for name, value in headers.items():
        key = name.lower()
        if key == "connection":
            connection = value
        if (
            key in _HOP_HEADERS
            or key in _CLIENT_KEYS
            or key in also_drop
            or key.startswith((HEADER_PREFIX, "proxy-"))
        ):
            continue
        out[key] = value
    if connection:
        for token in connection.split(","):
            out.pop(token.strip().lower(), None)
    return out


# A chat completion's body may be re-encoded by the proxy, which sets its type and length.
_CHAT_ONLY_DROPPED = frozenset({"content-type"})


def chat_request_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's request headers to send upstream with a chat completion.

    All of them (`x-request-id`, custom headers, …) but what `forwardable_headers` drops and
    `content-type` (the proxy sets it for the body it sends).
    """
    return forwardable_headers(headers, also_drop=_CHAT_ONLY_DROPPED)


class _Prepared:
    """A request's URL, its target (path and query, quoted) and the headers it goes with, worked
    out once per (path, headers) and shared between requests: never changed (a traced try
    copies the headers before it adds its `traceparent`). `untraced` is the `_Try` of every
    untraced try of it, made once: it has no span, so nothing in it changes."""

    __slots__ = ("headers", "target", "untraced", "url")

    def __init__(self, name: str, url: str, target: str, headers: dict[str, str]) -> None:
        self.url = url
        self.target = target
        self.headers = headers
        self.untraced = _Try(name, self, None)

    def attempt(self, trace: RequestTrace | None) -> _Try:
        """A try of this request, a span of `trace` when there is one."""
        return self.untraced if trace is None else _Try(self.untraced.name, self, trace)


class _Try:
    """One try of a request: the headers it goes out with, its span in the request's trace, and
    the one boundary where what the pool, the socket or asyncio raise becomes an `Upstream*`
    error.

    Traced, the try's headers are a copy with its `traceparent` added (`_Prepared.attempt`).
    Its span ends once (`end`): with its status, or with the error it ended in. As a context manager it is this
    client's `map_httpcore_exceptions`: an exception of the network's or the upstream's leaving
    the block ends the span and goes up as its `Upstream*` error (`translate`); an `Upstream*`
    error and anything it does not know (a bug, a cancellation) go up as they are.
    """

    __slots__ = ("_span", "headers", "name", "traced", "url")

    def __init__(self, name: str, prepared: _Prepared, trace: RequestTrace | None) -> None:
        self.name = name
        self.url = prepared.url
        self.traced = trace is not None
        self._span: AttemptSpan | None = None
        if trace is None:
            self.headers = prepared.headers
        else:
            self.headers = dict(prepared.headers)
            self._span = trace.upstream_try(name, prepared.url, self.headers)

    def end(self, *, status: int | None = None, error: str | None = None) -> None:
        """End the try's span (once; later calls do nothing)."""
        span, self._span = self._span, None
        if span is not None:
            span.finish(status=status, error=error)

    def failed(self, exc: BaseException) -> UpstreamError:
        """The try ended in `exc`: its span ended with it, and its `Upstream*` error. Raises `exc`
        itself when it is not a failure of the network's or the upstream's (see `translate`)."""
        self.end(error=exc.__class__.__name__)
        return translate(exc, self.name, self.url)

    def __enter__(self) -> _Try:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, traceback: object) -> None:
        if isinstance(exc, Exception):
            mapped = self.failed(exc)
            if mapped is not exc:
                try:
                    raise mapped from exc
                finally:  # the raise's traceback holds this frame: no cycle through its locals
                    del mapped, exc, traceback


class HttpUpstream:
    """One upstream server behind a pool of keep-alive HTTP/1.1 connections
    (`proxy.upstream_pool`): the one send path of the module doc, with its three modes."""

    def __init__(
        self,
        config: UpstreamConfig,
        *,
        api_key: str | None,
        retries: int,
        proxies: Mapping[str, str] | None = None,
    ) -> None:
        self.name = config.name
        self.config = config
        self._api_key = api_key
        self._retries = retries
        # Where the connections go and how they are opened (see `Origin`: TLS options, Unix
        # sockets, `proxies` from `environment_proxies`, None for none), and what every
        # request's target starts with.
        self._base = base_for(config, proxies)
        self._origin = self._base.origin
        self._pool: Pool | None = None
        self._urls: dict[str, tuple[str, str]] = {}
        self._requests: dict[tuple[object, ...], _Prepared] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # `send`'s, when it cannot use a callback

    def pool(self) -> Pool:
        """The connection pool, made on first use so it binds to the server's running loop."""
        pool = self._pool
        if pool is None or pool.closed:
            pool = self._pool = Pool(
                self._origin,
                limit=self.config.max_connections,
                keepalive=self.config.keepalive_timeout,
                connect_timeout=self.config.connect_timeout,
                read_timeout=self.config.timeout,
                max_response_bytes=self.config.max_response_bytes,
                max_stream_bytes=self.config.max_stream_bytes,
                max_stream_seconds=self.config.max_stream_seconds,
                total_timeout=self.config.total_timeout,
                pool_timeout=self.config.pool_timeout,
            )
        return pool

    @property
    def exhausted(self) -> bool:
        """Whether every connection the upstream may have is busy: a request would wait."""
        return self._pool is not None and not self._pool.closed and self._pool.exhausted

    # -- the three modes

    async def request(
        self, method: str, path: str, *, body: bytes | None, headers: Mapping[str, str]
    ) -> UpstreamResponse:
        """Send one request and read the whole response.

        Retries connect errors, timeouts and 502/503/504 before the first byte; when retries run
        out on a status, that response is returned. Raises UpstreamTimeoutError,
        UpstreamConnectError or UpstreamError naming this upstream.
        """
        prepared = self._prepared(path, headers, body is not None)
        trace = CURRENT_TRACE.get()
        try:
            if not self._retries:  # one try: nothing for the retry policy to do
                return await self._whole(method, prepared, body, prepared.attempt(trace))
            return await self._attempts(
                lambda: self._whole(method, prepared, body, prepared.attempt(trace))
            )
        except _Retryable as exc:
            return exc.response

    @asynccontextmanager
    async def stream(
        self, path: str, *, body: bytes | None, headers: Mapping[str, str], method: str = "POST"
    ) -> AsyncIterator[UpstreamStream]:
        """Open a request whose response is read as it arrives (a POST unless `method` says
        otherwise); retries happen only until the response headers arrive.

        Connect errors, timeouts and 502/503/504 are retried; when retries run out on a status,
        that response is handed over with its body. Leaving the context closes the
        response: a body read to its end returns the connection to the pool, any other is cut.
        Raises UpstreamConnectError or UpstreamTimeoutError when no response came; errors while
        reading `chunks` are translated too (UpstreamError and subclasses).
        """
        prepared = self._prepared(path, headers, body is not None)
        trace = CURRENT_TRACE.get()
        held: _Head | None = None
        try:
            held = await self._attempts(lambda: self._head(method, prepared, body, trace))
        except _Retryable as exc:
            refused = exc.response
            opened = UpstreamStream(refused.status, refused.headers, _replay(refused.body))
        else:
            response, attempt = held[2], held[3]
            opened = UpstreamStream(response.status, response.headers, _body(response, attempt))
        try:
            yield opened
        finally:
            await opened.chunks.aclose()
            if held is not None:
                pool, connection, response, attempt = held
                pool.release(connection, response)
                if attempt.traced:
                    attempt.end(status=response.status)

    def send(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None,
        headers: Mapping[str, str],
        done: Done,
        trace: RequestTrace | None = None,
        idle_only: bool = True,
    ) -> Sent | None:
        """Send one request with no task waiting for it: its response read whole and handed to
        `done(sent, response)` — or the UpstreamError it ended in — once, unless `sent.cancel()`
        came first. `trace`: the request's trace the try is a span of.

        On an idle pooled connection the request goes out now and the connection's own callbacks
        read the answer (no task, no future). With none idle, `idle_only` returns None, nothing
        sent; else a task sends it as `request` does and hands the answer over the same way.
        No retries: a 502/503/504 is handed over as it is; a reused connection the server
        closed before answering a byte is replaced once, as every mode does (`_open`).
        """
        pool = self.pool()
        connection = pool.idle_connection()
        if connection is None and idle_only:
            return None
        prepared = self._prepared(path, headers, body is not None)
        sent = Sent(self, pool, method, prepared, body, done, trace)
        if connection is None:
            sent.in_task(fresh=False)
        else:
            pool.deliver(sent, connection, method, prepared.target, sent.attempt.headers, body)
        return sent

    async def close(self) -> None:
        """Close the pooled connections; `send`'s tasks still under way are cancelled."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    # -- one try, as every mode sends it

    async def _open(
        self,
        pool: Pool,
        method: str,
        prepared: _Prepared,
        body: bytes | None,
        attempt: _Try,
        fresh: bool,
        streamed: bool = False,
    ) -> tuple[Connection, AwaitedResponse]:
        """Send one try on a connection of `pool` (`fresh`: a new one) and wait for its
        response's head; the caller maps what it raises (`with attempt`) and releases the
        connection. A reused connection the server closed before answering a byte (it was
        closing it as the request went out) is the one failure sent again, once, on a new
        connection: here, for every mode."""
        while True:
            connection, response = await pool.send(
                method, prepared.target, attempt.headers, body, fresh, streamed
            )
            try:
                await response.head()
            except BaseException as exc:
                pool.release(connection, response)
                if fresh or not _closed_unanswered(exc, connection):
                    raise
                fresh = True
            else:
                return connection, response

    async def _whole(
        self,
        method: str,
        prepared: _Prepared,
        body: bytes | None,
        attempt: _Try,
        fresh: bool = False,
    ) -> UpstreamResponse:
        """One try, its response read whole. Raises _Retryable for a 502/503/504."""
        pool = self.pool()
        start = time.perf_counter()
        with attempt:
            connection, response = await self._open(pool, method, prepared, body, attempt, fresh)
            try:
                data = await response.read()
            finally:
                pool.release(connection, response)
        answer = _answer(attempt, response, data, start)
        if answer.status in RETRYABLE_STATUS:
            raise _Retryable(answer)
        return answer

    async def _head(
        self, method: str, prepared: _Prepared, body: bytes | None, trace: RequestTrace | None
    ) -> _Head:
        """One try of a stream, up to its response's head. Raises _Retryable for a 502/503/504,
        read whole: a refusal's body is short, and reading it returns the connection."""
        attempt = prepared.attempt(trace)
        pool = self.pool()
        start = time.perf_counter()
        with attempt:
            connection, response = await self._open(
                pool, method, prepared, body, attempt, False, streamed=True
            )
            if response.status not in RETRYABLE_STATUS:
                return pool, connection, response, attempt
            try:
                data = await response.read()
            finally:
                pool.release(connection, response)
        raise _Retryable(_answer(attempt, response, data, start))

    async def _attempts(self, send: Callable[[], Awaitable[_T]]) -> _T:
        """`send()`, and again under the retry policy while it fails in a way worth retrying.

        Raises the last failure: UpstreamConnectError, UpstreamTimeoutError, or _Retryable
        carrying the last refusal (the caller decides what a refusal becomes).
        """
        # Most requests succeed at once: only a failed first attempt pays for tenacity's machinery
        # (it cost about 8% of the proxy's CPU per request when every request went through it).
        try:
            return await send()
        except (UpstreamConnectError, UpstreamTimeoutError, _Retryable) as exc:
            first_failure: Exception = exc
        async for attempt in self._retrying():
            with attempt:
                if attempt.retry_state.attempt_number == 1:
                    raise first_failure
                return await send()
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    def _retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            stop=stop_after_attempt(self._retries + 1),
            wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
            retry=retry_if_exception_type((UpstreamConnectError, UpstreamTimeoutError, _Retryable)),
            reraise=True,
        )

    # -- what a request's path and headers become

    def _prepared(self, path: str, headers: Mapping[str, str], has_body: bool) -> _Prepared:
        """The request's URL, target and headers (`_Prepared`), worked out once per (path,
        headers): a client's requests mostly repeat them."""
        key = (path, has_body, *headers.items())
        known = self._requests.get(key)
        if known is None:
            url, target = self._url(path)
            known = _Prepared(self.name, url, target, self._headers(headers, has_body))
            if len(self._requests) >= _MAX_CACHED_REQUESTS:  # a header that differs every time
                self._requests.clear()
            self._requests[key] = known
        return known

    def _url(self, path: str) -> tuple[str, str]:
        # The URL and its request target (path and query, quoted), worked out once per path.
        known = self._urls.get(path)
        if known is None:
            known = self._base.target(path)
            if len(self._urls) < _MAX_CACHED_URLS:  # raw pass-through paths come from clients
                self._urls[path] = known
        return known

    def _headers(self, headers: Mapping[str, str], has_body: bool) -> dict[str, str]:
        # Callers filter what may be forwarded (chat_request_headers, forwardable_headers) once
        # per client request; a re-ask reuses it. The credential rule is kept here all the same,
        # and so are the transport's own headers (the pool writes host and content-length).
        out = dict(headers)  # names lower-case, as both filters give them
        out.pop("authorization", None)
        out.pop("host", None)
        out.pop("content-length", None)
        if has_body:
            out.setdefault("content-type", "application/json")
        out.setdefault("user-agent", USER_AGENT)
        if self._api_key:  # the configured key wins over credentials in the base URL
            out["authorization"] = f"Bearer {self._api_key}"
        elif self._base.authorization is not None:
            out["authorization"] = self._base.authorization
        return out


_Head = tuple[Pool, Connection, AwaitedResponse, _Try]
"""A stream's try with its response's head read: the connection is released, and the try's span
ended, when the stream is closed."""


def _closed_unanswered(error: BaseException, connection: Connection) -> bool:
    """Whether a try failed only because the server closed the idle connection it was reusing as
    the request went out: nothing was answered, so the request goes once more, on a new one."""
    return isinstance(error, ClosedEarly) and connection.reused


def _answer(attempt: _Try, response: Response, data: bytes, start: float) -> UpstreamResponse:
    """A try's whole answer; its span ends with its status."""
    answer = UpstreamResponse(response.status, None, data, time.perf_counter() - start, response)
    if attempt.traced:
        attempt.end(status=answer.status)
    return answer


async def _body(response: AwaitedResponse, attempt: _Try) -> AsyncGenerator[bytes, None]:
    with attempt:
        try:
            async for chunk in response.chunks():
                yield chunk
        except Exception as exc:  # the try had its head: it ends in the error with its status
            attempt.end(status=response.status, error=exc.__class__.__name__)
            raise


class Sent(Delivery):
    """A request `HttpUpstream.send` sent, and its answer: read by its connection's callbacks
    (`delivered`), or — with no idle connection, or to send it again on a new connection — by a
    task of the upstream's (`in_task`); handed to the callback once, either way."""

    __slots__ = (
        "_body",
        "_done",
        "_method",
        "_pool",
        "_prepared",
        "_start",
        "_task",
        "_trace",
        "_upstream",
        "attempt",
    )

    def __init__(
        self,
        upstream: HttpUpstream,
        pool: Pool,
        method: str,
        prepared: _Prepared,
        body: bytes | None,
        done: Done,
        trace: RequestTrace | None,
    ) -> None:
        super().__init__()
        self._upstream = upstream
        self._pool = pool
        self._method = method
        self._prepared = prepared
        self._body = body
        self._done: Done | None = done
        self._trace = trace
        self.attempt = prepared.attempt(trace)  # the try under way
        self._start = time.perf_counter()
        self._task: asyncio.Task[None] | None = None

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task that sends the request, when no connection's callbacks read its answer."""
        return self._task

    def cancel(self) -> None:
        """Give up on the answer: the callback is never called, the connection is closed."""
        self._done = None
        if self._task is not None:
            self._task.cancel()
        elif self.abandon():  # still on its connection
            self._pool.release(self._connection, self)  # not read to its end: closed
        self.attempt.end(error="CancelledError")  # unless it ended already

    def delivered(self) -> None:
        """The connection's callback: the response is complete, or failed."""
        connection = self._connection
        self._pool.release(connection, self)
        error = self._error
        if error is None:
            if self.attempt.traced:
                self.attempt.end(status=self.status)
            elapsed = time.perf_counter() - self._start
            self._report(UpstreamResponse(self.status, None, self.body(), elapsed, self))
        elif _closed_unanswered(error, connection):
            self.attempt.end(error=error.__class__.__name__)
            self.attempt = self._prepared.attempt(self._trace)
            self.in_task(fresh=True)
        else:
            self._report(self.attempt.failed(error))

    def in_task(self, *, fresh: bool) -> None:
        """Send the request (its try `attempt`) from a task of the upstream's, as `request` sends
        one try (`fresh`: on a new connection); its answer is handed over as the callbacks'
        would be."""
        self.abandon()  # no connection's callback reads it from now on
        task = self._pool.loop.create_task(self._awaited(fresh))
        self._task = task
        tasks = self._upstream._tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _awaited(self, fresh: bool) -> None:
        upstream = self._upstream
        try:
            result: UpstreamResponse | UpstreamError = await upstream._whole(
                self._method, self._prepared, self._body, self.attempt, fresh
            )
        except _Retryable as exc:
            result = exc.response
        except UpstreamError as exc:
            result = exc
        self._report(result)

    def _report(self, result: UpstreamResponse | UpstreamError) -> None:
        done, self._done = self._done, None
        if done is None:
            return
        try:
            done(self, result)
        except Exception as exc:  # the caller's fault, not the connection's: reported as a task's
            self._pool.loop.call_exception_handler(
                {"message": "exception in the callback of an upstream's answer", "exception": exc}
            )


class _Retryable(Exception):
    """A 502/503/504 answer: retried, and returned as it is when retries run out."""

    def __init__(self, response: UpstreamResponse) -> None:
        super().__init__(response.status)
        self.response = response


async def _replay(body: bytes) -> AsyncGenerator[bytes, None]:
    yield body
