"""`DisconnectWatch`: a client's leaving cancels the task serving it, never a request answered in
time; the watch started after `WATCH_AFTER` (the fast path) and at once give the same result."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.http.disconnect import WATCH_AFTER, DisconnectWatch


class Client:
    """An ASGI `receive` whose next message, once `leave()` is called, is the disconnect."""

    def __init__(self) -> None:
        self._left = asyncio.Event()

    def leave(self) -> None:
        self._left.set()

    async def receive(self) -> dict[str, Any]:
        await self._left.wait()
        return {"type": "http.disconnect"}


@pytest.mark.parametrize("after", [0, WATCH_AFTER], ids=["at once", "fast path"])
async def test_a_client_that_leaves_cancels_the_task_serving_it(after: float) -> None:
    client, watch = Client(), DisconnectWatch()

    async def serve() -> None:
        watch.start(client.receive, after)
        await asyncio.Event().wait()  # an answer that never comes

    served = asyncio.get_running_loop().create_task(serve())
    await asyncio.sleep(0)
    client.leave()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(served, 30)
    assert watch.gone


@pytest.mark.parametrize("after", [0, WATCH_AFTER], ids=["at once", "fast path"])
async def test_a_watch_stopped_before_the_client_leaves_cancels_nothing(after: float) -> None:
    client, watch = Client(), DisconnectWatch()

    async def serve() -> str:
        watch.start(client.receive, after)
        await asyncio.sleep(0)
        watch.stop()
        client.leave()  # as an answer complete reads, after it is sent
        await asyncio.sleep(2 * WATCH_AFTER)
        return "answered"

    assert await serve() == "answered"
    assert not watch.gone
