"""A client that goes away cancels what is being done for it.

uvicorn never cancels a request's task when its client disconnects: it only answers the next
`receive()` with `http.disconnect`. Without a watch, a client that gave up on a plain answer
(or on a stream whose head had not come) left its upstream request running, and its pooled
connection held, until the upstream answered. `DisconnectWatch` is one task per request that
waits on `receive()` once the body is read and cancels the serving task when the client goes;
the serving code's own cleanup (every upstream response is released in a `finally`) closes the
upstream connection, so the upstream sees its request cancelled and the pool gets its slot back.

Fast path: the task starts only once the request has lasted `WATCH_AFTER` seconds (a timer
until then). A task started, run and cancelled cost 7-9 µs a request on this project's
machines, a timer armed and cancelled 1.5-2 µs, and a request answered sooner than that has no
upstream request left to cancel; a client that leaves is noticed at most `WATCH_AFTER` late.
`tests/proxy/http/test_disconnect.py` runs the same cases with the task started at once.
"""

from __future__ import annotations

import asyncio

from starlette.types import Receive

WATCH_AFTER = 0.1
"""Seconds a request lasts before its watch starts (see the fast path above)."""


class DisconnectWatch:
    """Cancels the task that started it when its client disconnects, until stopped.

    `gone` says whether it did: a `CancelledError` in that task while `gone` is the client's
    leaving, to be taken back (`Task.uncancel`) and answered to nobody; any other is a real
    cancellation."""

    __slots__ = ("_served", "_start", "_watcher", "gone")

    def __init__(self) -> None:
        self.gone = False
        self._served: asyncio.Task[object] | None = None
        self._start: asyncio.TimerHandle | None = None
        self._watcher: asyncio.Task[None] | None = None

    def start(self, receive: Receive, after: float = WATCH_AFTER) -> None:
        """Watch from `after` seconds on (the request's body is read: what `receive` gives next
        is the disconnect); `after=0`: at once."""
        self._served = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if after > 0:
            self._start = loop.call_later(after, self._begin, receive)
        else:
            self._begin(receive)

    def _begin(self, receive: Receive) -> None:
        self._start = None
        self._watcher = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        if self._served is not None:
            self._served.cancel()

    def stop(self) -> None:
        """Stop watching: the answer is being sent, or the request is over. Call it with no
        `await` between it and the answer's last send (an answer complete also reads as a
        disconnect)."""
        start, self._start = self._start, None
        if start is not None:
            start.cancel()
        watcher, self._watcher = self._watcher, None
        if watcher is not None and not watcher.done():
            watcher.cancel()
        self._served = None
