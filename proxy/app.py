"""The app factory and its routes. Routes only parse, call a service, and return what it gives."""

from __future__ import annotations

import gc
import hmac
import inspect
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy import __version__
from proxy.config import Settings, UpstreamConfig
from proxy.errors import (
    AuthenticationError,
    BadRequestError,
    ConfigError,
    NotFoundError,
    PayloadTooLargeError,
    ToolsentryError,
    error_body,
    status_of,
)
from proxy.logs import get_logger, log_request
from proxy.metrics import CONTENT_TYPE, Metrics, UnknownToolStats
from proxy.service import ChatResult, ChatService
from proxy.session.stores import SessionStore, open_store
from proxy.streamservice import ChatStream
from proxy.upstream import AiohttpUpstream, Router, Upstream, forwardable_headers

_JSON = "application/json"
_GC_YOUNG_THRESHOLD = 50_000
CHAT_ROUTE = "/v1/chat/completions"
_CHAT_BODY_SCHEMA = {
    "requestBody": {
        "required": True,
        "content": {
            _JSON: {
                "schema": {
                    "type": "object",
                    "required": ["messages"],
                    "properties": {
                        "model": {"type": "string"},
                        "messages": {"type": "array", "items": {"type": "object"}},
                        "tools": {"type": "array", "items": {"type": "object"}},
                        "tool_choice": {},
                        "stream": {"type": "boolean"},
                    },
                    "additionalProperties": True,
                }
            }
        },
    }
}


# FastAPI versions with native OpenTelemetry look for providers on every request (3.5 µs); the
# proxy exports its own metrics, so that look-up is off where the option exists.
_NO_OPENTELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


class JSONReply(Response):
    """JSON bytes and a few headers, sent as they are: every route's answer, without the header
    handling a general Response does for every kind of content (a few µs a request)."""

    media_type = _JSON

    def __init__(
        self, content: bytes, status_code: int = 200, headers: Mapping[str, str] | None = None
    ) -> None:
        self.body = content
        self.status_code = status_code
        self.background = None
        raw = [(b"content-length", b"%d" % len(content)), (b"content-type", b"application/json")]
        if headers:
            raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.raw_headers = raw

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        await send({"type": "http.response.body", "body": self.body})


def request_headers(scope: Scope) -> dict[str, str]:
    """A request's headers by name (lower-case, as ASGI servers give them); of a repeated
    header, the first, as Starlette's `Headers.get` reads it."""
    headers: dict[str, str] = {}
    for key, value in scope["headers"]:
        name = key.decode("latin-1")
        if name not in headers:
            headers[name] = value.decode("latin-1")
    return headers


class SSEResponse(StreamingResponse):
    """Sends a ChatStream, and closes it (the upstream response with it) however the response
    ended: completed, client gone mid-body, or never started."""

    media_type = "text/event-stream"

    def __init__(self, stream: ChatStream, on_close: Callable[[ChatStream], None]) -> None:
        super().__init__(
            stream.body(),
            status_code=stream.status,
            headers={**stream.headers, "cache-control": "no-cache", "x-accel-buffering": "no"},
        )
        self._stream = stream
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._stream.aclose()
            self._on_close(self._stream)


class ProxyApp(FastAPI):
    """FastAPI, except that `POST /v1/chat/completions` (every agent call) goes straight to its
    handler: FastAPI's middleware stack, route matching and dependency solving cost about a
    quarter of the proxy's own CPU time per request. The route stays registered with FastAPI
    too, for the OpenAPI schema and for what the shortcut leaves to it (a root path, middleware
    added to the app).
    """

    chat: Callable[[Scope, Receive, Send], Awaitable[None]] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] == CHAT_ROUTE
            and scope["method"] == "POST"
            and self.chat is not None
            and not scope.get("root_path")
            and not self.root_path
            and not self.user_middleware
        ):
            scope["app"] = self
            await self.chat(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def _error_response(exc: ToolsentryError) -> Response:
    return JSONReply(orjson.dumps(exc.body()), status_of(exc), exc.headers)


def create_app(
    settings: Settings,
    *,
    store: SessionStore | None = None,
    upstreams: list[Upstream] | None = None,
    environ: Mapping[str, str] | None = None,
    metrics_dir: str | None = None,
) -> FastAPI:
    """Build the proxy app from settings. `store` and `upstreams` may be injected (tests, benchmarks).

    `environ` is where upstream API keys (`api_key_env`) are looked up; the command line passes
    the process environment, and nothing here reads it on its own.

    `metrics_dir` is the directory the workers of a multi-process server share their metrics in
    (see `proxy.metrics.Metrics`); None keeps them in this process.

    Raises ConfigError when no upstream is configured or the store URL is invalid.
    """
    if upstreams is None:
        if not settings.upstreams:
            raise ConfigError(
                "no upstream configured: give --upstream URL, TOOLSENTRY_UPSTREAMS or a config file"
            )
        env = dict(environ or {})
        upstreams = [
            AiohttpUpstream(u, api_key=settings.upstream_api_key(u, env), retries=settings.retries)
            for u in settings.upstreams
        ]
    configs = settings.upstreams or []
    if len(configs) != len(upstreams):
        configs = [UpstreamConfig(name=u.name, base_url="http://injected") for u in upstreams]
    router = Router(upstreams, configs)
    session_store = store or open_store(settings.store, ttl_seconds=settings.session_ttl_seconds)
    metrics = Metrics(multiprocess_dir=metrics_dir)
    unknown = UnknownToolStats()
    service = ChatService(settings, router, session_store, metrics, unknown)
    log = get_logger()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # What exists at startup lives as long as the process: move it out of the collector's
        # reach, or every full collection rescans it (20 ms on this heap: the p99 spikes).
        gc.freeze()
        # Under load dozens of requests are in flight, each holding its parsed body. At the
        # default threshold (a young collection every 700 allocations) most young objects are
        # still alive when collected, so they are promoted and rescanned by the older
        # generations: 10% of the proxy's CPU at concurrency 64. Collecting every 50,000
        # allocations finds most of a request's objects already freed by reference counting.
        gc.set_threshold(_GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        yield
        await router.close()
        await session_store.close()

    app = ProxyApp(
        title="toolsentry",
        version=__version__,
        description="OpenAI-compatible proxy that validates, repairs and budgets every tool call.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        **_NO_OPENTELEMETRY,
    )
    app.state.settings = settings
    app.state.service = service
    app.state.metrics = metrics
    app.state.store = session_store

    client_keys = [k.get_secret_value().encode() for k in settings.api_keys]
    admin_key = settings.admin_key.get_secret_value().encode() if settings.admin_key else None

    def bearer(headers: Mapping[str, str]) -> bytes | None:
        value = headers.get("authorization", "")
        if value[:7].lower() == "bearer ":
            return value[7:].strip().encode()
        return None

    def require_client(headers: Mapping[str, str]) -> None:
        if not client_keys:
            return
        given = bearer(headers)
        # Compare against every key, always, so timing does not reveal which key nearly matched.
        ok = False
        for key in client_keys:
            ok |= given is not None and hmac.compare_digest(given, key)
        if not ok:
            raise AuthenticationError("invalid or missing API key", code="invalid_api_key")

    def require_admin(request: Request) -> None:
        if admin_key is None and not client_keys:
            return
        # Either header may carry it: a client that sends its own key as the bearer token can
        # still present the admin key in x-admin-key. Both are compared, always.
        candidates = (
            bearer(request.headers) or b"",
            request.headers.get("x-admin-key", "").encode(),
        )
        ok = False
        for given in candidates:
            ok |= admin_key is not None and bool(given) and hmac.compare_digest(given, admin_key)
        if not ok:
            raise AuthenticationError("this endpoint needs the admin key", code="invalid_admin_key")

    async def read_body(headers: Mapping[str, str], receive: Receive) -> bytes:
        """The body as sent, within the size limit. Raises ClientDisconnect if the client left."""
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > settings.max_body_bytes:
            raise PayloadTooLargeError(
                f"request body is {length} bytes; the limit is {settings.max_body_bytes}"
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > settings.max_body_bytes:
                raise PayloadTooLargeError(
                    f"request body exceeds the limit of {settings.max_body_bytes} bytes"
                )
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    @app.exception_handler(ToolsentryError)
    async def on_toolsentry_error(request: Request, exc: ToolsentryError) -> Response:
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> Response:
        return _error_response(BadRequestError(str(exc.errors()[:3])))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONReply(orjson.dumps(error_body(str(exc.detail), kind)), exc.status_code)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> Response:
        # Never a traceback to the client; the log has it.
        log.error("unhandled_error", path=request.url.path, error=repr(exc), exc_info=exc)
        body = error_body("internal error in toolsentry; see the proxy's log", "internal_error")
        return JSONReply(orjson.dumps(body), 500)

    @app.post(CHAT_ROUTE, openapi_extra=_CHAT_BODY_SCHEMA)
    async def chat_completions(request: Request) -> Response:
        return await answer_chat(request_headers(request.scope), request.receive)

    async def answer_chat(headers: dict[str, str], receive: Receive) -> Response:
        require_client(headers)
        raw = await read_body(headers, receive)
        parsed = service.bodies.parse(raw)
        body = parsed.body
        started = time.perf_counter()
        # 32 random hex digits, as uuid4().hex gave, without building a UUID (a few µs).
        request_id = headers.get("x-request-id") or os.urandom(16).hex()
        try:
            result = await service.handle(body, headers, raw=raw, index=parsed.index)
        except ToolsentryError as exc:
            log_request(
                {
                    "request_id": request_id,
                    "model": body.get("model"),
                    "status": status_of(exc),
                    "error": exc.error_type,
                    "latency_ms": round((time.perf_counter() - started) * 1000, 3),
                }
            )
            raise
        if isinstance(result, ChatStream):

            def log_stream(stream: ChatStream) -> None:
                summary = stream.summary or {}
                fields = {
                    "request_id": request_id,
                    "model": body.get("model"),
                    "session": stream.headers.get("x-toolsentry-session"),
                    "status": stream.status,
                    "stream": True,
                    "channels": ",".join(summary.get("violations", [])) or None,
                    "errors": summary.get("errors"),
                    "latency_ms": round((time.perf_counter() - started) * 1000, 3),
                }
                if settings.log_bodies:
                    fields["body"] = body
                log_request(fields)

            return SSEResponse(result, log_stream)
        if isinstance(result, ChatResult):
            fields = {
                "request_id": request_id,
                "model": body.get("model"),
                "session": result.headers.get("x-toolsentry-session"),
                "status": result.status,
                "channels": result.headers.get("x-toolsentry-violations") or None,
                "errors": result.headers.get("x-toolsentry-errors"),
                "latency_ms": round((time.perf_counter() - started) * 1000, 3),
            }
            if settings.log_bodies:
                fields["body"] = body
            log_request(fields)
        return JSONReply(result.content(), result.status, result.headers)

    async def serve_chat(scope: Scope, receive: Receive, send: Send) -> None:
        # What the exception handlers above would do for this route, without the stack around it.
        try:
            response = await answer_chat(request_headers(scope), receive)
        except ToolsentryError as exc:
            response = _error_response(exc)
        except ClientDisconnect:
            return  # gone before its request was read: nobody to answer
        except Exception as exc:  # answered as on_unexpected answers any other route
            response = await on_unexpected(Request(scope, receive), exc)
        await response(scope, receive, send)

    app.chat = serve_chat

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        require_client(request.headers)
        merged: dict[str, Any] = {}
        for upstream in router.upstreams:
            try:
                response = await upstream.request("GET", "models", body=None, headers={})
                listing = response.json() if response.status == 200 else {}
            except ToolsentryError:
                continue
            for entry in listing.get("data", []) if isinstance(listing, dict) else []:
                if isinstance(entry, dict) and "id" in entry:
                    merged.setdefault(entry["id"], entry)
        for config in settings.upstreams:
            for name in config.models:
                merged.setdefault(
                    name, {"id": name, "object": "model", "created": 0, "owned_by": config.name}
                )
        return JSONReply(orjson.dumps({"object": "list", "data": list(merged.values())}))

    @app.get("/healthz")
    async def healthz() -> Response:
        return JSONReply(b'{"status":"ok"}')

    @app.get("/readyz")
    async def readyz() -> Response:
        for upstream in router.upstreams:
            try:
                response = await upstream.request("GET", "models", body=None, headers={})
            except ToolsentryError:
                continue
            if response.status < 500:
                return JSONReply(orjson.dumps({"status": "ready", "upstream": upstream.name}))
        return JSONReply(
            orjson.dumps(error_body("no upstream answers", "upstream_unavailable")), 503
        )

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/sessions")
    async def list_sessions(request: Request, order: str = "recent", limit: int = 50) -> Response:
        require_admin(request)
        if order not in ("recent", "failing"):
            raise BadRequestError("order must be 'recent' or 'failing'", param="order")
        records = await session_store.list(order=order, limit=max(1, min(limit, 1000)))  # type: ignore[arg-type]
        return JSONReply(orjson.dumps({"object": "list", "data": [r.to_dict() for r in records]}))

    # Session ids may hold slashes (τ²-bench task ids do), as they are or percent-encoded.
    @app.get("/v1/sessions/{session_id:path}")
    async def get_session(request: Request, session_id: str) -> Response:
        require_admin(request)
        record = await session_store.get(session_id)
        if record is None:
            raise NotFoundError(f"no session '{session_id}'", param="session_id")
        return JSONReply(orjson.dumps(record.to_dict()))

    @app.delete("/v1/sessions/{session_id:path}")
    async def delete_session(request: Request, session_id: str) -> Response:
        require_admin(request)
        if not await session_store.delete(session_id):
            raise NotFoundError(f"no session '{session_id}'", param="session_id")
        return JSONReply(orjson.dumps({"id": session_id, "deleted": True}))

    @app.get("/v1/stats/unknown-tools")
    async def unknown_tool_stats(request: Request, limit: int = 20) -> Response:
        require_admin(request)
        return JSONReply(orjson.dumps(unknown.top(max(1, min(limit, 1000)))))

    @app.api_route(
        "/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"], include_in_schema=False
    )
    async def passthrough(request: Request, path: str) -> Response:
        """Other endpoints (/v1/completions, /v1/embeddings, /tokenize, …) go to the upstream raw."""
        require_client(request.headers)
        raw = await request.body()
        if len(raw) > settings.max_body_bytes:
            raise PayloadTooLargeError(f"request body exceeds {settings.max_body_bytes} bytes")
        upstream = router.default
        if raw:
            try:
                parsed = orjson.loads(raw)
            except orjson.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict) and "model" in parsed:
                upstream = router.pick(parsed["model"])
        target = path[3:] if path.startswith("v1/") else f"/{path}"
        response = await upstream.request(
            request.method,
            target,
            body=raw or None,
            headers=forwardable_headers(request.headers),
        )
        return Response(
            response.body,
            status_code=response.status,
            headers=forwardable_headers(response.headers),
        )

    return app
