"""The app factory: builds the pipeline, the protocols' turn routes and the other routes."""

from __future__ import annotations

import asyncio
import gc
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy import __version__
from proxy.config import Settings
from proxy.config_upstream import UpstreamConfig
from proxy.errors import BadRequestError, ConfigError, ToolsentryError, error_body
from proxy.http.auth import Keys
from proxy.http.dispatch import Delegate, TurnRoute
from proxy.http.edge import PassthroughRoutes, bound_request_id, header_bytes, not_normal, refuse
from proxy.http.passthrough import Passthrough
from proxy.http.replies import JSONReply, error_reply
from proxy.http.routes import add_routes
from proxy.logs import get_logger
from proxy.metrics import Metrics, UnknownToolStats
from proxy.pipeline.gate import Pipeline
from proxy.protocols.base import API, WireProtocol
from proxy.protocols.chat import ChatProtocol
from proxy.protocols.chat import schema as chat_schema
from proxy.protocols.messages import MessagesProtocol
from proxy.protocols.messages import schema as messages_schema
from proxy.protocols.responses import ResponsesProtocol
from proxy.protocols.responses import schema as responses_schema
from proxy.session import open_store
from proxy.session.stores import SessionStore
from proxy.shadow import Shadow, open_shadow
from proxy.tracing import Tracing, TracingConfig
from proxy.upstream import HttpUpstream, Upstream
from proxy.upstream_origin import environment_proxies
from proxy.upstream_router import Router, balanced

_GC_YOUNG_THRESHOLD = 50_000


# FastAPI versions with native OpenTelemetry look for providers on every request (3.5 µs); the
# proxy exports its own metrics, so that look-up is off where the option exists.
_NO_OPENTELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


class ProxyApp(FastAPI):
    """FastAPI, except that the turn routes (every agent call) go straight to their dispatch:
    FastAPI's middleware stack, route matching and dependency solving cost about a quarter of the
    proxy's own CPU time per request. The routes stay registered with FastAPI too, for the
    OpenAPI schema and for what the shortcut leaves to it (a root path, middleware added to the
    app); there they answer through the same dispatch.
    """

    turn_routes: dict[str, TurnRoute]
    max_header_bytes: int = 64 * 1024

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            # The edge (proxy.http.edge): before any route is chosen, on every route.
            if header_bytes(scope) > self.max_header_bytes:
                message = f"the request's headers exceed {self.max_header_bytes} bytes"
                await refuse(scope, send, 431, message, "invalid_request_error")
                return
            problem = not_normal(scope["path"])
            if problem is not None:
                await refuse(scope, send, 400, problem, "invalid_request_error")
                return
            bound_request_id(scope)
        if scope["type"] == "http" and scope["method"] == "POST":
            route = self.turn_routes.get(scope["path"])
            if (
                route is not None
                and not scope.get("root_path")
                and not self.root_path
                and not self.user_middleware
            ):
                scope["app"] = self
                await route(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(
    settings: Settings,
    *,
    store: SessionStore | None = None,
    upstreams: list[Upstream] | None = None,
    environ: Mapping[str, str] | None = None,
    metrics_dir: str | None = None,
) -> FastAPI:
    """Build the proxy app from settings. `store` and `upstreams` may be injected (tests, benchmarks).

    `environ` is where upstream API keys (`api_key_env`) and forward proxies (`HTTP(S)_PROXY`)
    are looked up; the command line passes the process environment, nothing reads it here.

    `metrics_dir` is the directory the workers of a multi-process server share their metrics in
    (see `proxy.metrics.Metrics`); None keeps them in this process.

    Raises ConfigError when no upstream is configured or the store URL is invalid.
    """
    metrics = Metrics(multiprocess_dir=metrics_dir)
    router = _router(settings, upstreams, environ or {}, metrics)
    session_store = store or open_store(settings.store, ttl_seconds=settings.session_ttl_seconds)
    unknown = UnknownToolStats()
    dropped = metrics.trace_spans_dropped
    tracer = Tracing.create(
        TracingConfig(endpoint=settings.otlp_endpoint),
        environ or {},
        on_drop=lambda reason, n: dropped.labels(reason).inc(n),
    )
    pipeline = Pipeline(settings, router, session_store, metrics, unknown, tracer)
    injected = None if settings.upstreams else settings.shadow.reference
    pipeline.shadow = shadow = open_shadow(
        settings,
        metrics=metrics,
        store=session_store,
        environ=environ or {},
        reference=next((u for u in upstreams or () if u.name == injected), None),
        worker_log_suffix=metrics_dir is not None,
    )
    keys = Keys(settings)

    app = ProxyApp(
        title="toolsentry",
        version=__version__,
        description="OpenAI-compatible proxy that validates, repairs and budgets every tool call.",
        lifespan=_lifespan(router, session_store, shadow, tracer),
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served by routes.py, behind public_endpoints
        **_NO_OPENTELEMETRY,
    )
    app.state.settings = settings
    app.state.pipeline = pipeline
    app.state.metrics = metrics
    app.state.store = session_store
    app.state.shadow = shadow
    _add_error_handlers(app)
    _add_turn_routes(app, pipeline, keys)
    add_routes(
        app,
        settings=settings,
        router=router,
        store=session_store,
        metrics=metrics,
        unknown=unknown,
        keys=keys,
        shadow=shadow,
    )
    app.max_header_bytes = settings.max_header_bytes
    allowed = PassthroughRoutes(
        settings.passthrough.allow,
        settings.passthrough.deny,
        defaults=settings.passthrough.defaults,
    )
    _add_passthrough(app, Passthrough(router, keys, settings.max_body_bytes, allowed))
    return app


def _add_passthrough(app: FastAPI, passthrough: Passthrough) -> None:
    """The last route: any other path goes to the pass-through (its allowlist decides)."""

    @app.api_route(
        "/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"], include_in_schema=False
    )
    async def raw(request: Request, path: str) -> Response:
        """Other endpoints (/v1/completions, /v1/embeddings, /tokenize, …) go to the upstream raw."""
        return await passthrough(request, path)


def _router(
    settings: Settings,
    injected: list[Upstream] | None,
    environ: Mapping[str, str],
    metrics: Metrics,
) -> Router:
    """The router over the injected upstreams (each serving any model), else one client per
    configured upstream's base URL. Raises ConfigError when there is none."""
    if injected is not None:
        configs = settings.upstreams
        if len(configs) != len(injected):
            configs = [UpstreamConfig(name=u.name, base_url="http://injected") for u in injected]
        return Router(injected, configs, metrics=metrics)
    if not settings.upstreams:
        raise ConfigError(
            "no upstream configured: give --upstream URL, TOOLSENTRY_UPSTREAMS or a config file"
        )
    env = dict(environ)
    proxies = environment_proxies(env)  # HTTP(S)_PROXY, NO_PROXY: decided once per upstream
    clients: list[list[Upstream]] = []
    for config, shared in zip(settings.upstreams, balanced(settings.upstreams), strict=True):
        # A balanced deployment retries across its replicas: their own clients do not.
        retries = 0 if shared else settings.retries
        key = settings.upstream_api_key(config, env)
        clients.append(
            [
                HttpUpstream(config.replica(url), api_key=key, retries=retries, proxies=proxies)
                for url in config.replica_urls
            ]
        )
    return Router(clients, settings.upstreams, retries=settings.retries, metrics=metrics)


def _lifespan(
    router: Router, store: SessionStore, shadow: Shadow | None, tracer: Tracing | None
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: the collector settled at startup; at shutdown the shadow, the
    upstream clients, the store and the tracer closed, in that order."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        _settle_the_collector()
        yield
        if shadow is not None:
            await shadow.close()
        await router.close()
        await store.close()
        if tracer is not None:  # flushing waits on the endpoint: not on the event loop
            await asyncio.to_thread(tracer.shutdown)

    return lifespan


def _settle_the_collector() -> None:
    # What exists at startup lives as long as the process: move it out of the collector's
    # reach, or every full collection rescans it (20 ms on this heap: the p99 spikes).
    gc.freeze()
    # Under load dozens of requests are in flight, each holding its parsed body. At the
    # default threshold (a young collection every 700 allocations) most young objects are
    # still alive when collected, so they are promoted and rescanned by the older
    # generations: 10% of the proxy's CPU at concurrency 64. Collecting every 50,000
    # allocations finds most of a request's objects already freed by reference counting.
    gc.set_threshold(_GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def _add_error_handlers(app: FastAPI) -> None:
    """Every error answers in OpenAI's error shape; never a traceback to the client."""
    log = get_logger()

    @app.exception_handler(ToolsentryError)
    async def on_toolsentry_error(request: Request, exc: ToolsentryError) -> Response:
        return error_reply(exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> Response:
        return error_reply(BadRequestError(str(exc.errors()[:3])))

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


def _add_turn_routes(app: ProxyApp, pipeline: Pipeline, keys: Keys) -> None:
    """One turn route per wire protocol, at its route with its request schema."""
    served: list[tuple[WireProtocol, str, dict[str, Any]]] = [
        (ChatProtocol(pipeline.limits), chat_schema.ROUTE, chat_schema.REQUEST_BODY),
        (
            ResponsesProtocol(pipeline.limits),
            responses_schema.ROUTE,
            responses_schema.REQUEST_BODY,
        ),
        (MessagesProtocol(pipeline.limits), messages_schema.ROUTE, messages_schema.REQUEST_BODY),
    ]
    app.turn_routes = {}
    for protocol, path, schema in served:
        route = app.turn_routes[path] = TurnRoute(pipeline, protocol, keys)
        app.post(path, openapi_extra=schema, name=_ROUTE_NAMES[protocol.api])(_delegate(route))


# The operations' names in the OpenAPI document, as they were when each route had its function.
_ROUTE_NAMES: dict[str, str] = {
    API.CHAT: "chat_completions",
    API.RESPONSES: "create_response",
    API.MESSAGES: "create_message",
}


def _delegate(route: TurnRoute) -> Callable[[], Awaitable[Response]]:
    async def endpoint() -> Response:
        return Delegate(route)

    return endpoint
