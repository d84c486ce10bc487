"""The raw pass-through: the other endpoints its allowlist names (`/v1/completions`,
`/v1/embeddings`, `/tokenize`, …; `proxy.http.edge.PassthroughRoutes`) forwarded to the upstream
as they are, on the very path that was matched, the answer streamed back as it arrives; any other
method and path is answered 404 and never reaches the upstream."""

from __future__ import annotations

import re
from contextlib import AsyncExitStack

import orjson
from fastapi import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy.http.auth import Keys
from proxy.http.body import read_body
from proxy.http.edge import PassthroughRoutes, error_content
from proxy.http.replies import JSONReply
from proxy.upstream import forwardable_headers
from proxy.upstream_router import Router

_PLAIN_PATH = re.compile(r"[A-Za-z0-9._~!$&'()*+,;=:@/-]+")


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

    def __init__(
        self, router: Router, keys: Keys, max_body_bytes: int, allowed: PassthroughRoutes
    ) -> None:
        self.router = router
        self.keys = keys
        self.max_body_bytes = max_body_bytes
        self.allowed = allowed

    async def __call__(self, request: Request, path: str) -> Response:
        """Raises AuthenticationError, PayloadTooLargeError (while the body is read) and
        UpstreamError when no response came."""
        self.keys.require_client(request.headers)
        matched = f"/{path}"
        # Only characters a URL carries as they are: the path sent is the path matched.
        if _PLAIN_PATH.fullmatch(matched) is None or not self.allowed.allows(
            request.method, matched
        ):
            message = f"no endpoint {request.method} {matched} on this proxy"
            return JSONReply(error_content(matched, message, 404, "not_found_error"), 404)
        raw = await read_body(request.headers, request.receive, self.max_body_bytes)
        upstream = self.router.default
        if raw:
            try:
                parsed = orjson.loads(raw)
            except orjson.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict) and "model" in parsed:
                upstream = self.router.pick(parsed["model"])
        target = path[3:] if path.startswith("v1/") else matched
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
