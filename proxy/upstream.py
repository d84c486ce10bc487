"""Upstream clients: one pool of keep-alive connections per upstream, routing by model, retries.

The connections are `proxy.http1`'s (HTTP/1.1 written in one call, answers parsed by httptools):
measured on this project's machines, aiohttp's client cost five to six times their CPU per plain
request (bench/results/upstreamclient.md), most of the proxy's overhead at its rates (httpx's
pool was slower still: bench/RESULTS.md). Every exception of the pool, the socket or the TLS layer is translated into an
`Upstream*` error here and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextvars
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)
from yarl import URL

from proxy import __version__
from proxy.config import UpstreamConfig
from proxy.errors import (
    NotFoundError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamStatusError,
    UpstreamTimeoutError,
)
from proxy.http1 import (
    BrokenOff,
    ClosedEarly,
    Connection,
    Delivery,
    Exchange,
    InvalidResponse,
    Origin,
    Pool,
    Response,
)
from proxy.tracing import CURRENT as CURRENT_TRACE
from proxy.tracing import AttemptSpan, RequestTrace

RETRYABLE_STATUS = frozenset({502, 503, 504})
_MAX_CACHED_URLS = 64
_MAX_CACHED_REQUESTS = 256
_T = TypeVar("_T")

# Hop-by-hop and length headers are the transport's business, never forwarded either way.
_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
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


class UpstreamResponse:
    """A complete upstream response: status, headers (lower-case names) and raw body.

    Read from a connection, its headers are the connection's response's (`head`), decoded there
    when first read: most answers are read for their status and body only."""

    __slots__ = ("_head", "_headers", "body", "seconds", "status")

    def __init__(
        self,
        status: int,
        headers: dict[str, str] | None,
        body: bytes,
        seconds: float,
        head: Response | None = None,
    ) -> None:
        self.status = status
        self._headers = headers
        self._head = head
        self.body = body
        self.seconds = seconds

    def __repr__(self) -> str:
        return f"UpstreamResponse(status={self.status}, body={len(self.body)} bytes)"

    @property
    def headers(self) -> dict[str, str]:
        if self._headers is None:
            self._headers = {} if self._head is None else self._head.headers
        return self._headers

    def json(self) -> Any:
        """The body parsed as JSON. Raises UpstreamProtocolError when it is not JSON."""
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError as exc:
            raise UpstreamProtocolError(
                f"upstream answered {self.status} with a body that is not JSON: {exc}"
            ) from exc


@dataclass(slots=True)
class UpstreamStream:
    """An upstream response whose body is read incrementally."""

    status: int
    headers: dict[str, str]
    chunks: AsyncGenerator[bytes, None]


class Upstream(Protocol):
    """What the service needs from an upstream. `AiohttpUpstream` is the implementation.

    `headers` are the client's headers as they may be forwarded (`chat_request_headers`,
    `forwardable_headers`); the upstream adds its own key and a JSON content type by default.
    """

    name: str

    async def request(
        self, method: str, path: str, *, body: bytes | None, headers: Mapping[str, str]
    ) -> UpstreamResponse: ...

    def stream(
        self, path: str, *, body: bytes | None, headers: Mapping[str, str], method: str = "POST"
    ) -> AbstractAsyncContextManager[UpstreamStream]: ...

    async def close(self) -> None: ...


USER_AGENT = f"toolsentry/{__version__}"

# A client's own credentials never go upstream: the upstream's key comes from configuration.
_CLIENT_KEYS = frozenset({"authorization", "x-api-key"})

# The proxy's own per-request controls (x-toolsentry-max-errors, x-toolsentry-repair).
_PROXY_HEADERS = "x-toolsentry-"


def forwardable_headers(
    headers: Mapping[str, str], *, also_drop: frozenset[str] = frozenset()
) -> dict[str, str]:
    """Headers that may cross the proxy, in either direction, names lower-cased.

    Drops hop-by-hop ones (also those the `connection` header names), `authorization` and
    `x-api-key` (the upstream's key comes only from configuration), the proxy's own `x-toolsentry-*` controls,
    and `also_drop`. One pass over `headers`.
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
            or key.startswith(_PROXY_HEADERS)
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


class HttpUpstream:
    """One upstream server behind a pool of keep-alive HTTP/1.1 connections (`proxy.http1`), with
    retries before the first byte."""

    def __init__(self, config: UpstreamConfig, *, api_key: str | None, retries: int) -> None:
        self.name = config.name
        self.config = config
        self._api_key = api_key
        self._retries = retries
        self._origin = Origin.of(config.base_url)
        self._pool: Pool | None = None
        self._urls: dict[str, tuple[str, str]] = {}
        self._requests: dict[tuple[object, ...], tuple[tuple[str, str], dict[str, str]]] = {}

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
            )
        return pool

    def _prepared(
        self, path: str, headers: Mapping[str, str], has_body: bool
    ) -> tuple[tuple[str, str], dict[str, str]]:
        """A request's URL (with its target) and the headers it is sent with, worked out once
        per (path, headers): a client's requests mostly repeat them. The headers are shared
        between requests, so never changed: a try that adds to them (a trace's traceparent)
        copies them first."""
        key = (path, has_body, *headers.items())
        known = self._requests.get(key)
        if known is None:
            known = (self._url(path), self._headers(headers, has_body))
            if len(self._requests) >= _MAX_CACHED_REQUESTS:  # a header that differs every time
                self._requests.clear()
            self._requests[key] = known
        return known

    def _url(self, path: str) -> tuple[str, str]:
        # The URL and its request target (path and query, quoted), worked out once per path.
        known = self._urls.get(path)
        if known is None:
            url = URL(self._url_text(path))
            known = (str(url), url.raw_path_qs)
            if len(self._urls) < _MAX_CACHED_URLS:  # raw pass-through paths come from clients
                self._urls[path] = known
        return known

    def _url_text(self, path: str) -> str:
        # A path with a leading slash is relative to the server root (/tokenize, /health), any
        # other is relative to the OpenAI base URL (chat/completions, models).
        if path.startswith("/"):
            base = self.config.base_url
            return (base[: -len("/v1")] if base.endswith("/v1") else base) + path
        return f"{self.config.base_url}/{path}"

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
        if self._api_key:
            out["authorization"] = f"Bearer {self._api_key}"
        return out

    def _retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            stop=stop_after_attempt(self._retries + 1),
            wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
            retry=retry_if_exception_type((UpstreamConnectError, UpstreamTimeoutError, _Retryable)),
            reraise=True,
        )

    async def request(
        self, method: str, path: str, *, body: bytes | None, headers: Mapping[str, str]
    ) -> UpstreamResponse:
        """Send one request and read the whole response.

        Retries connect errors, timeouts and 502/503/504 before the first byte. Raises
        UpstreamTimeoutError, UpstreamConnectError or UpstreamError naming this upstream.
        """
        url, sent_headers = self._prepared(path, headers, body is not None)
        try:
            if not self._retries:  # one try: nothing for the retry policy to do
                return await self._once(method, url, body, sent_headers)
            return await self._attempts(lambda: self._once(method, url, body, sent_headers))
        except _Retryable as exc:
            return exc.response

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

    async def _send(
        self, method: str, url: tuple[str, str], body: bytes | None, headers: dict[str, str]
    ) -> tuple[Pool, Connection, Exchange]:
        """One try up to the response's head (translated errors); the caller releases it."""
        pool = self.pool()
        connection, exchange = await pool.exchange(method, url[1], headers, body)
        try:
            await exchange.head()
        except ClosedEarly:
            if not connection.reused:
                pool.release(connection, exchange)
                raise
            # The server closed that idle connection as the request went out: nothing was
            # answered, so the request goes once more, on a connection made for it.
            connection, exchange = await pool.retry_fresh(
                connection, exchange, method, url[1], headers, body
            )
            try:
                await exchange.head()
            except BaseException:
                pool.release(connection, exchange)
                raise
        except BaseException:
            pool.release(connection, exchange)
            raise
        return pool, connection, exchange

    async def _once(
        self, method: str, url: tuple[str, str], body: bytes | None, headers: dict[str, str]
    ) -> UpstreamResponse:
        trace = CURRENT_TRACE.get()
        attempt: AttemptSpan | None = None
        if trace is not None:  # a span per try, and its traceparent for the upstream
            headers = dict(headers)
            attempt = trace.upstream_try(self.name, url[0], headers)
        start = time.perf_counter()
        try:
            pool, connection, exchange = await self._send(method, url, body, headers)
            try:
                data = await exchange.read()
            finally:
                pool.release(connection, exchange)
        except Exception as exc:
            if attempt is not None:
                attempt.finish(error=exc.__class__.__name__)
            raise translate(exc, self.name, url[0]) from exc
        elapsed = time.perf_counter() - start
        response = UpstreamResponse(exchange.status, None, data, elapsed, exchange)
        if attempt is not None:
            attempt.finish(status=response.status)
        if response.status in RETRYABLE_STATUS:
            raise _Retryable(response)
        return response

    def send(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None,
        headers: Mapping[str, str],
        done: Callable[[Sent, UpstreamResponse | UpstreamError], None],
        trace: RequestTrace | None = None,
    ) -> Sent | None:
        """Send one request with no task waiting for it: on an idle pooled connection, its
        response read whole and handed to `done(sent, response)` — or the UpstreamError it ended
        in — from the event loop's callbacks, once. None, with nothing sent, when no connection
        is idle (`request` makes one). `trace`: the request's trace the try is a span of.

        No retries, as `request` with `retries=0`: a 502/503/504 is handed over as it is; a
        reused connection the server closed before answering a byte is replaced once.
        """
        pool = self.pool()
        connection = pool.idle_connection()
        if connection is None:
            return None
        url, sent_headers = self._prepared(path, headers, body is not None)
        attempt: AttemptSpan | None = None
        if trace is not None:  # a span for the try, and its traceparent for the upstream
            sent_headers = dict(sent_headers)
            attempt = trace.upstream_try(self.name, url[0], sent_headers)
        sent = Sent(self, pool, connection, method, url, body, sent_headers, done, trace, attempt)
        pool.deliver(sent, method, url[1], sent_headers, body)
        return sent

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
        url, sent_headers = self._prepared(path, headers, body is not None)
        opened_try: list[AttemptSpan] = []
        held: tuple[Pool, Connection, Exchange] | None = None
        try:
            held = await self._attempts(
                lambda: self._open(method, url, body, sent_headers, opened_try)
            )
        except _Retryable as exc:
            refused = exc.response
            opened = UpstreamStream(refused.status, refused.headers, _replay(refused.body))
        else:
            exchange = held[2]
            attempt = opened_try[-1] if opened_try else None
            opened = UpstreamStream(
                exchange.status, exchange.headers, self._iter_body(exchange, url[0], attempt)
            )
        try:
            yield opened
        finally:
            await opened.chunks.aclose()
            if held is not None:
                pool, connection, exchange = held
                pool.release(connection, exchange)
                if opened_try:
                    opened_try[-1].finish(status=exchange.status)

    async def _open(
        self,
        method: str,
        url: tuple[str, str],
        body: bytes | None,
        headers: dict[str, str],
        opened_try: list[AttemptSpan],
    ) -> tuple[Pool, Connection, Exchange]:
        trace = CURRENT_TRACE.get()
        attempt: AttemptSpan | None = None
        if trace is not None:
            headers = dict(headers)
            attempt = trace.upstream_try(self.name, url[0], headers)
        start = time.perf_counter()
        try:
            held = await self._send(method, url, body, headers)
            pool, connection, exchange = held
            if exchange.status not in RETRYABLE_STATUS:
                if attempt is not None:
                    opened_try.append(attempt)
                return held
            # A refusal's body is short; reading it returns the connection to the pool.
            try:
                data = await exchange.read()
            finally:
                pool.release(connection, exchange)
        except Exception as exc:
            if attempt is not None:
                attempt.finish(error=exc.__class__.__name__)
            raise translate(exc, self.name, url[0]) from exc
        if attempt is not None:
            attempt.finish(status=exchange.status)
        elapsed = time.perf_counter() - start
        raise _Retryable(UpstreamResponse(exchange.status, None, data, elapsed, exchange))

    async def _iter_body(
        self, exchange: Exchange, url: str, attempt: AttemptSpan | None
    ) -> AsyncGenerator[bytes, None]:
        try:
            async for chunk in exchange.chunks():
                yield chunk
        except Exception as exc:
            if attempt is not None:  # the stream broke off: its try ends in that error
                attempt.finish(status=exchange.status, error=exc.__class__.__name__)
            raise translate(exc, self.name, url) from exc

    async def close(self) -> None:
        """Close the pooled connections."""
        if self._pool is not None:
            await self._pool.close()
            self._pool = None


class Sent(Delivery):
    """A request `HttpUpstream.send` sent, and its response as the connection reads it: the
    answer goes to a callback, once (see there)."""

    __slots__ = (
        "_attempt",
        "_body",
        "_done",
        "_method",
        "_pool",
        "_request_headers",
        "_start",
        "_task",
        "_trace",
        "_upstream",
        "_url",
    )

    def __init__(
        self,
        upstream: HttpUpstream,
        pool: Pool,
        connection: Connection,
        method: str,
        url: tuple[str, str],
        body: bytes | None,
        headers: dict[str, str],
        done: Callable[[Sent, UpstreamResponse | UpstreamError], None],
        trace: RequestTrace | None,
        attempt: AttemptSpan | None,
    ) -> None:
        super().__init__(connection)
        self._upstream = upstream
        self._pool = pool
        self._method = method
        self._url = url
        self._body = body
        self._request_headers = headers
        self._done: Callable[[Sent, UpstreamResponse | UpstreamError], None] | None = done
        self._trace = trace
        self._attempt = attempt
        self._start = time.perf_counter()
        self._task: asyncio.Task[None] | None = None

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task sending the request again, when the first connection closed unanswered."""
        return self._task

    def cancel(self) -> None:
        """Give up on the answer: the callback is never called, the connection is closed."""
        self._done = None
        if self._task is not None:
            self._task.cancel()
        if self.abandon():  # still on its connection
            self._pool.release(self._connection, self)  # not read to its end: closed
            self._finish(error="CancelledError")

    def delivered(self) -> None:
        """The connection's callback: the response is complete, or failed."""
        connection = self._connection
        self._pool.release(connection, self)
        error = self._error
        if error is None:
            if self._attempt is not None:
                self._finish(status=self.status)
            elapsed = time.perf_counter() - self._start
            self._report(UpstreamResponse(self.status, None, self.body(), elapsed, self))
            return
        self._finish(error=error.__class__.__name__)
        if isinstance(error, ClosedEarly) and connection.reused:
            # The server closed that idle connection as the request went out: nothing was
            # answered, so the request goes once more, as `request` sends it.
            context = contextvars.copy_context()
            context.run(CURRENT_TRACE.set, self._trace)
            self._task = self._pool.loop.create_task(self._resend(), context=context)
            return
        self._report(translate(error, self._upstream.name, self._url[0]))

    async def _resend(self) -> None:
        upstream = self._upstream
        try:
            result: UpstreamResponse | UpstreamError = await upstream._once(
                self._method, self._url, self._body, self._request_headers
            )
        except _Retryable as exc:
            result = exc.response
        except UpstreamError as exc:
            result = exc
        self._report(result)

    def _finish(self, *, status: int | None = None, error: str | None = None) -> None:
        attempt, self._attempt = self._attempt, None
        if attempt is not None:
            attempt.finish(status=status, error=error)

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


# Most specific first: a timeout (504) differs from a refused connection (502), and a body that
# breaks off differs from both. `error_class_for` walks this table in order; what it does not
# name is not an upstream's failure but a fault of the proxy's own, and is raised as it is.
_TRANSLATIONS: tuple[
    tuple[type[BaseException] | tuple[type[BaseException], ...], type[UpstreamError], str], ...
] = (
    (TimeoutError, UpstreamTimeoutError, "timed out"),
    (BrokenOff, UpstreamProtocolError, "broke off its response"),
    (InvalidResponse, UpstreamProtocolError, "sent an invalid response"),
    (ClosedEarly, UpstreamConnectError, "closed the connection before answering"),
    ((ConnectionError, socket.gaierror), UpstreamConnectError, "is unreachable"),
    (OSError, UpstreamConnectError, "failed"),
)


def error_class_for(exc_type: type[BaseException]) -> tuple[type[UpstreamError], str] | None:
    """The Upstream* class and wording for an exception type; None when it is not one of the
    network's or the upstream's failures."""
    for source, target, wording in _TRANSLATIONS:
        if issubclass(exc_type, source):
            return target, wording
    return None


def translate(exc: BaseException, upstream: str, url: str) -> UpstreamError:
    """Map a connection pool's (or asyncio's, or a socket's) exception onto the proxy's Upstream* errors.

    The message names the upstream, the URL and the cause, so a client can act on it. Raises
    `exc` itself when it is none of those: a bug stays a bug, never an upstream error charged
    to the session.
    """
    if isinstance(exc, UpstreamError):
        return exc
    mapped = error_class_for(type(exc))
    if mapped is None:
        raise exc
    target, wording = mapped
    detail = str(exc).strip()
    cause = f"{exc.__class__.__name__}: {detail}" if detail else exc.__class__.__name__
    return target(f"upstream '{upstream}' {wording} ({url}): {cause}")


class Router:
    """Picks the upstream for a model: an exact `models` match, else the catch-all upstream."""

    def __init__(self, upstreams: list[Upstream], configs: list[UpstreamConfig]) -> None:
        if not upstreams:
            raise ValueError("at least one upstream is required")
        self.upstreams = upstreams
        self._by_model: dict[str, Upstream] = {}
        self._fallback: Upstream | None = None
        for upstream, config in zip(upstreams, configs, strict=True):
            for model in config.models:
                self._by_model.setdefault(model, upstream)
            if not config.models and self._fallback is None:
                self._fallback = upstream

    def pick(self, model: object) -> Upstream:
        """The upstream serving `model`. Raises NotFoundError listing the models that are served."""
        if isinstance(model, str) and model in self._by_model:
            return self._by_model[model]
        if self._fallback is not None:
            return self._fallback
        if len(self.upstreams) == 1:
            return self.upstreams[0]
        known = ", ".join(sorted(self._by_model)) or "none"
        raise NotFoundError(
            f"model {model!r} is not served by any upstream; served models: {known}",
            param="model",
            code="model_not_found",
        )

    @property
    def default(self) -> Upstream:
        """The upstream for requests that name no model (raw pass-through endpoints)."""
        return self._fallback or self.upstreams[0]

    async def close(self) -> None:
        """Close every upstream's pool."""
        await asyncio.gather(*(u.close() for u in self.upstreams), return_exceptions=True)


def raise_for_status(response: UpstreamResponse, upstream: str) -> None:
    """Turn an upstream error status into UpstreamStatusError carrying the upstream's own body.

    OpenAI's shape (`{"error": {...}}`) is kept as it is; older vLLM's flat error
    (`{"object": "error", "message", "type", "param", "code"}`) is put into that shape.
    """
    if response.status < 400:
        return
    try:
        body = orjson.loads(response.body)
    except orjson.JSONDecodeError:
        body = None
    message = f"upstream '{upstream}' answered {response.status}"
    if isinstance(body, dict) and body.get("object") == "error" and "error" not in body:
        fields = ("message", "type", "param", "code")
        body = {"error": {key: body.get(key) for key in fields}}
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = str(body["error"].get("message") or message)
    elif isinstance(body, dict) and isinstance(body.get("detail"), str):
        message = body["detail"]
    raise UpstreamStatusError(
        message, status=response.status, body=body if isinstance(body, dict) else None
    )
