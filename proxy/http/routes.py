"""The proxy's own routes: models, health, metrics, the session API and the statistics."""

from __future__ import annotations

import time
from typing import Any

import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response

from proxy.config import Settings
from proxy.errors import (
    BadRequestError,
    NotFoundError,
    ToolsentryError,
    UpstreamBusyError,
    error_body,
)
from proxy.http.auth import Keys
from proxy.http.replies import JSONReply
from proxy.metrics import CONTENT_TYPE, Metrics, SchemaFallbackStats, UnknownToolStats
from proxy.session.budget import owned, scoped
from proxy.session.stores import SessionRecord, SessionStore
from proxy.shadow import Shadow
from proxy.upstream_router import Router


def add_routes(
    app: FastAPI,
    *,
    settings: Settings,
    router: Router,
    store: SessionStore,
    metrics: Metrics,
    unknown: UnknownToolStats,
    keys: Keys,
    shadow: Shadow | None = None,
) -> None:
    """Register the routes on `app`."""
    _add_service_routes(app, settings=settings, router=router, metrics=metrics, keys=keys)
    _add_admin_routes(
        app,
        store=store,
        unknown=unknown,
        keys=keys,
        shadow=shadow,
        schema_fallbacks=metrics.schema_fallback_tools,
    )


def _add_service_routes(
    app: FastAPI, *, settings: Settings, router: Router, metrics: Metrics, keys: Keys
) -> None:
    """The models list, health, readiness and metrics."""

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        keys.require_client(request.headers)
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

    # Each answers without a key where `public_endpoints` says so, else behind the admin key.
    @app.get("/healthz")
    async def healthz(request: Request) -> Response:
        keys.require_public("/healthz", request.headers)
        return JSONReply(b'{"status":"ok"}')

    # The upstream is asked at most once a second, however often /readyz is.
    ready: list[tuple[float, bytes, int]] = []

    @app.get("/readyz")
    async def readyz(request: Request) -> Response:
        keys.require_public("/readyz", request.headers)
        busy = [u.name for u in router.upstreams if u.exhausted]
        if len(busy) == len(router.upstreams):  # asked now, never cached: it changes fast
            message = f"every pooled connection is busy (upstream {', '.join(busy)})"
            body = orjson.dumps(error_body(message, UpstreamBusyError.error_type))
            return JSONReply(body, 503, {"retry-after": "1"})
        now = time.monotonic()
        if not ready or now - ready[0][0] >= _READY_CACHE_SECONDS:
            ready[:] = [(now, *await _probe(router))]
        _, body, status = ready[0]
        return JSONReply(body, status)

    @app.get("/metrics")
    async def metrics_endpoint(request: Request) -> Response:
        keys.require_public("/metrics", request.headers)
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request) -> Response:
        keys.require_public("/openapi.json", request.headers)
        return JSONReply(orjson.dumps(app.openapi()))


_READY_CACHE_SECONDS = 1.0


async def _probe(router: Router) -> tuple[bytes, int]:
    """/readyz's answer: ready when an upstream with a connection free lists its models
    without a 5xx."""
    for upstream in router.upstreams:
        if upstream.exhausted:
            continue
        try:
            response = await upstream.request("GET", "models", body=None, headers={})
        except ToolsentryError:
            continue
        if response.status < 500:
            return orjson.dumps({"status": "ready", "upstream": upstream.name}), 200
    return orjson.dumps(error_body("no upstream answers", "upstream_unavailable")), 503


def _shown(record: SessionRecord, owner: str | None) -> dict[str, Any]:
    """A session as its reader sees it: a client key, by the id it sends."""
    shown = record.to_dict()
    shown["session"] = owned(owner, record.session)
    return shown


def _add_admin_routes(
    app: FastAPI,
    *,
    store: SessionStore,
    unknown: UnknownToolStats,
    keys: Keys,
    shadow: Shadow | None,
    schema_fallbacks: SchemaFallbackStats,
) -> None:
    """The session API (a client key's own sessions, the admin key's all) and the statistics
    (behind the admin key)."""

    # A client key reads and resets its own sessions, by the ids it sends; the admin key every
    # session, by its stored id (`owner:id` where client keys exist; see budget.scoped).
    @app.get("/v1/sessions")
    async def list_sessions(request: Request, order: str = "recent", limit: int = 50) -> Response:
        owner = keys.session_reader(request.headers, open_to_all=False)
        if order not in ("recent", "failing"):
            raise BadRequestError("order must be 'recent' or 'failing'", param="order")
        prefix = "" if owner is None else scoped(owner, "")
        records = await store.list(order=order, limit=max(1, min(limit, 1000)), prefix=prefix)  # type: ignore[arg-type]
        data = [_shown(r, owner) for r in records]
        return JSONReply(orjson.dumps({"object": "list", "data": data}))

    # Session ids may hold slashes (τ²-bench task ids do), as they are or percent-encoded.
    @app.get("/v1/sessions/{session_id:path}")
    async def get_session(request: Request, session_id: str) -> Response:
        owner = keys.session_reader(request.headers, open_to_all=True)
        record = await store.get(scoped(owner, session_id))
        if record is None:
            raise NotFoundError(f"no session '{session_id}'", param="session_id")
        return JSONReply(orjson.dumps(_shown(record, owner)))

    @app.delete("/v1/sessions/{session_id:path}")
    async def delete_session(request: Request, session_id: str) -> Response:
        owner = keys.session_reader(request.headers, open_to_all=False)
        if not await store.delete(scoped(owner, session_id)):
            raise NotFoundError(f"no session '{session_id}'", param="session_id")
        return JSONReply(orjson.dumps({"id": session_id, "deleted": True}))

    @app.get("/v1/stats/shadow")
    async def shadow_stats(request: Request) -> Response:
        keys.require_admin(request.headers)
        if shadow is None:
            off = {"object": "shadow.stats", "enabled": False, "data": []}
            return JSONReply(orjson.dumps(off))
        return JSONReply(orjson.dumps(await shadow.stats()))

    @app.get("/v1/stats/unknown-tools")
    async def unknown_tool_stats(request: Request, limit: int = 20) -> Response:
        keys.require_admin(request.headers)
        return JSONReply(orjson.dumps(unknown.top(max(1, min(limit, 1000)))))

    @app.get("/v1/stats/schema-fallbacks")
    async def schema_fallback_stats(request: Request, limit: int = 100) -> Response:
        keys.require_admin(request.headers)
        return JSONReply(orjson.dumps(schema_fallbacks.report(max(1, min(limit, 1000)))))
