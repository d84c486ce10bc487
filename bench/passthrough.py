"""The floor: a pass-through proxy with no logic, Starlette + one pooled HTTP client.

`POST /v1/chat/completions` (and `/v1/responses`, `/v1/messages`) reads the body, sends it unchanged to the upstream over a keep-alive
pool (aiohttp or httpx), and answers with the upstream's status, content type and body; an
event-stream answer is relayed chunk by chunk as it arrives. It parses nothing and validates
nothing, so its cost over direct access is the least any Python proxy on this stack can add.
Served like toolsentry: uvicorn, uvloop, httptools, access log off.

    python -m bench.passthrough --client aiohttp --upstream http://127.0.0.1:9101/v1 --port 9102
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

_SSE = "text/event-stream"
ROUTES = ("/v1/chat/completions", "/v1/responses", "/v1/messages")
"""Each forwarded to the same upstream path, with its query string (Claude Code's `?beta=true`)."""


def _target(upstream: str, request: Request) -> str:
    query: bytes = request.scope["query_string"]
    path: str = upstream + request.scope["path"].removeprefix("/v1")
    return path + "?" + query.decode("latin-1") if query else path


def aiohttp_app(upstream: str, connections: int) -> Starlette:
    """The pass-through over one aiohttp ClientSession."""
    state: dict[str, aiohttp.ClientSession] = {}

    async def chat(request: Request) -> Response:
        body = await request.body()
        url = _target(upstream, request)
        resp = await state["session"].post(
            url, data=body, headers={"content-type": "application/json"}
        )
        content_type = resp.headers.get("content-type", "application/json")
        if content_type.startswith(_SSE):

            async def relay() -> AsyncIterator[bytes]:
                try:
                    async for chunk in resp.content.iter_any():
                        yield chunk
                finally:
                    resp.release()

            return StreamingResponse(relay(), status_code=resp.status, media_type=_SSE)
        data = await resp.read()
        resp.release()
        return Response(data, status_code=resp.status, media_type=content_type)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=connections, keepalive_timeout=30)
        async with aiohttp.ClientSession(connector=connector) as session:
            state["session"] = session
            yield

    return Starlette(
        routes=[Route(path, chat, methods=["POST"]) for path in ROUTES], lifespan=lifespan
    )


def httpx_app(upstream: str, connections: int) -> Starlette:
    """The pass-through over one httpx.AsyncClient."""
    state: dict[str, httpx.AsyncClient] = {}

    async def chat(request: Request) -> Response:
        body = await request.body()
        url = _target(upstream, request)
        client = state["client"]
        sent = client.build_request(
            "POST", url, content=body, headers={"content-type": "application/json"}
        )
        resp = await client.send(sent, stream=True)
        content_type = resp.headers.get("content-type", "application/json")
        if content_type.startswith(_SSE):

            async def relay() -> AsyncIterator[bytes]:
                try:
                    async for chunk in resp.aiter_raw():
                        yield chunk
                finally:
                    await resp.aclose()

            return StreamingResponse(relay(), status_code=resp.status_code, media_type=_SSE)
        data = await resp.aread()
        await resp.aclose()
        return Response(data, status_code=resp.status_code, media_type=content_type)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        async with httpx.AsyncClient(limits=limits, timeout=60.0) as client:
            state["client"] = client
            yield

    return Starlette(
        routes=[Route(path, chat, methods=["POST"]) for path in ROUTES], lifespan=lifespan
    )


APPS: dict[str, Callable[[str, int], Starlette]] = {"aiohttp": aiohttp_app, "httpx": httpx_app}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", choices=sorted(APPS), required=True)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:9101/v1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--connections", type=int, default=256)
    args = parser.parse_args()
    app: Any = APPS[args.client](args.upstream.rstrip("/"), args.connections)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
