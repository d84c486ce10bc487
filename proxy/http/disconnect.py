"""A client that goes away cancels what is being done for it.

uvicorn never cancels a request's task when its client disconnects: it only answers the next
`receive()` with `http.disconnect`. Without a watch, a client that gave up on a plain answer
(or on a stream whose head had not come) left its upstream request running, and its pooled
connection held, until the upstream answered. `DisconnectWatch` is one task per request that
waits on `receive()` once the body is read and cancels the serving task when the client goes;
the serving code's own cleanup (every upstream response is released in a `finally`) closes the
upstream connection, so the upstream sees its request cancelled and the pool gets its slot back.

Fast path: a request's watch starts only if it is still in flight at the next sweep of its
route's `DisconnectWatches`, one timer every `WATCH_AFTER` seconds while requests come: a
request answered sooner has no upstream request left to cancel, and a client that leaves is
noticed at most `WATCH_AFTER` late. In `bench.hotpath` (a chat request through the ASGI app,
about 51 µs of the proxy's own CPU) a task per request cost 7-9 µs, a timer per request 7 µs,
and the watch with the sweep 2-3 µs (under 1 µs on its own). `after=0` is the general path, the
task started at once; `tests/proxy/http/test_disconnect.py` runs the same cases through both.
"""

from __future__ import annotations

import asyncio

from starlette.types import Receive

WATCH_AFTER = 0.1
"""Seconds between two sweeps that start the watches of the requests still in flight."""


class DisconnectWatches:
    """The disconnect watches of one route's requests, started by one sweep (the fast path)."""

    __slots__ = ("_after", "_loop", "_sweep", "_young")

    def __init__(self, after: float = WATCH_AFTER) -> None:
        self._after = after
        self._young: dict[DisconnectWatch, Receive] = {}  # not yet started
        self._sweep: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(self) -> DisconnectWatch:
        """A request's watch, to `start` once its body is read."""
        return DisconnectWatch(self)

    def _enlist(self, watch: DisconnectWatch, receive: Receive) -> None:
        if self._after <= 0:
            watch._begin(receive)
            return
        self._young[watch] = receive
        if self._sweep is None:
            self._arm()
        elif self._loop is not asyncio.get_running_loop():  # that timer's loop is gone
            self._young = {watch: receive}
            self._arm()

    def _arm(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        self._sweep = loop.call_later(self._after, self._start_young)

    def _start_young(self) -> None:
        """The sweep: start the watch of every request still in flight since the last one."""
        self._sweep = None
        young, self._young = self._young, {}
        for watch, receive in young.items():
            watch._begin(receive)

    def _discharge(self, watch: DisconnectWatch) -> None:
        self._young.pop(watch, None)


class DisconnectWatch:
    """Cancels the task that started it when its client disconnects, until stopped.

    `gone` says whether it did: a `CancelledError` in that task while `gone` is the client's
    leaving, to be taken back (`Task.uncancel`) and answered to nobody; any other is a real
    cancellation."""

    __slots__ = ("_served", "_watcher", "_watches", "gone")

    def __init__(self, watches: DisconnectWatches) -> None:
        self.gone = False
        self._watches = watches
        self._served: asyncio.Task[object] | None = None
        self._watcher: asyncio.Task[None] | None = None

    def start(self, receive: Receive) -> None:
        """Watch from now on (the request's body is read: what `receive` gives next is the
        disconnect); its task starts at the next sweep (see the fast path)."""
        self._served = asyncio.current_task()
        self._watches._enlist(self, receive)

    def _begin(self, receive: Receive) -> None:
        if self._served is not None:
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
        if self._served is None:
            return
        self._served = None
        watcher, self._watcher = self._watcher, None
        if watcher is None:
            self._watches._discharge(self)
        elif not watcher.done():
            watcher.cancel()
