"""One POST through an ASGI app in-process, as a server would hand it over: the benchmarks' driver.

`bench.hotpath` (upstream stubbed in-process) and `bench.tracing` (the real aiohttp client to
`bench.fake_upstream`) drive the proxy's app with it: no sockets on the client side, so what is
measured is the proxy's own code and whatever it does to reach its upstream.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import ASGIApp, Message


class Driver:
    """Sends one request with body `raw` to `path` per `request()`; the statuses answered are
    kept, and `check` says whether every one was `expected`."""

    def __init__(self, app: ASGIApp, raw: bytes, path: str = "/v1/chat/completions") -> None:
        self.app = app
        self.raw = raw
        self.path = path
        self.headers = [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(raw)).encode()),
        ]
        self.statuses: list[int] = []

    async def request(self) -> None:
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": self.path,
            "raw_path": self.path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": self.headers,
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8000),
            "state": {},
        }
        sent = False
        done = asyncio.Event()

        async def receive() -> Message:
            nonlocal sent
            if sent:  # as a server does: the client is there until its response has ended
                await done.wait()
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": self.raw, "more_body": False}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.statuses.append(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                done.set()

        await self.app(scope, receive, send)
        done.set()

    def check(self, expected: int = 200) -> None:
        """Raise unless every request so far was answered `expected`."""
        if set(self.statuses) != {expected}:
            raise RuntimeError(f"the app answered {sorted(set(self.statuses))}, not {expected}")
