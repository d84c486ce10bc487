"""Reading a request body within the size limit, while it arrives."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import ClientDisconnect
from starlette.types import Receive

from proxy.errors import PayloadTooLargeError


async def read_body(headers: Mapping[str, str], receive: Receive, limit: int) -> bytes:
    """The body as sent, at most `limit` bytes.

    Raises PayloadTooLargeError as soon as the declared length or the bytes read exceed the
    limit (the rest is never read), and ClientDisconnect if the client left.
    """
    length = headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise PayloadTooLargeError(f"request body is {length} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
