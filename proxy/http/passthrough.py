"""The raw pass-through: every other endpoint (`/v1/completions`, `/v1/embeddings`, `/tokenize`,
…) forwarded to the upstream as it is, its answer streamed back as it arrives."""

from __future__ import annotations

from contextlib import AsyncExitStack

import orjson
from fastapi import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy.http.auth import Keys
from proxy.http.body import read_body
from proxy.upstream import Router, forwardable_headers


class RawStreamReply(StreamingResponse):
    """An upstream's response relayed chunk by chunk; the upstream response is closed however
    the reply ended."""

    def __init__(self, resources: AsyncExitStack, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._resources = resources

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._resources.aclose()


class Passthrough:
    """Forwards a request to the upstream its `model` names (or the default one)."""

    def __init__(self, router: Router, keys: Keys, max_body_bytes: int) -> None:
        self.router = router
        self.keys = keys
        self.max_body_bytes = max_body_bytes

    async def __call__(self, request: Request, path: str) -> Response:
        """Raises AuthenticationError, PayloadTooLargeError (while the body is read) and
        UpstreamError when no response came."""
        self.keys.require_client(request.headers)
        raw = await read_body(request.headers, request.receive, self.max_body_bytes)
        upstream = self.router.default
        if raw:
            try:
                parsed = orjson.loads(raw)
            except orjson.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict) and "model" in parsed:
                upstream = self.router.pick(parsed["model"])
        target = path[3:] if path.startswith("v1/") else f"/{path}"
        if request.url.query:
            target = f"{target}?{request.url.query}"
        resources = AsyncExitStack()
        async with resources:
            opened = await resources.enter_async_context(
                upstream.stream(
                    target,
                    body=raw or None,
                    headers=forwardable_headers(request.headers),
                    method=request.method,
                )
            )
            return RawStreamReply(
                resources.pop_all(),
                opened.chunks,
                status_code=opened.status,
                headers=forwardable_headers(opened.headers),
            )
