"""What an upstream answers, as the proxy reads it: `UpstreamResponse` read whole, `UpstreamStream`
read as it arrives, and `raise_for_status`, an error status as the proxy's `UpstreamStatusError`."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.errors import UpstreamProtocolError, UpstreamStatusError
from proxy.upstream_http1 import Response


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
