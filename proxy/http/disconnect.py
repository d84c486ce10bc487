"""A client that goes away cancels what is being done for it.

uvicorn never cancels a request's task when its client disconnects: it only answers the next
`receive()` with `http.disconnect`. Without a watch, a client that gave up on a plain answer
(or on a stream whose head had not come) left its upstream request running, and its pooled
connection held, until the upstream answered. `DisconnectWatch` is one task per request that
waits on `receive()` once the body is read and cancels the serving task when the client goes;
the serving code's own cleanup (every upstream response is released in a `finally`) closes the
upstream connection, so the upstream sees its request cancelled and the pool gets its slot back.
"""

from __future__ import annotations

import asyncio

from starlette.types import Receive


class DisconnectWatch:
    """Cancels the task that started it when its client disconnects, until stopped.

    `gone` says whether it did: a `CancelledError` in that task while `gone` is the client's
    leaving, to be taken back (`Task.uncancel`) and answered to nobody; any other is a real
    cancellation."""

    __slots__ = ("_served", "_watcher", "gone")

    def __init__(self) -> None:
        self.gone = False
        self._served: asyncio.Task[object] | None = None
        self._watcher: asyncio.Task[None] | None = None

    def start(self, receive: Receive) -> None:
        """Watch from now on (the request's body is read: what `receive` gives next is the
        disconnect)."""
        self._served = asyncio.current_task()
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
        watcher, self._watcher = self._watcher, None
        if watcher is not None and not watcher.done():
            watcher.cancel()
        self._served = None
