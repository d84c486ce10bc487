"""`DisconnectWatch`: a client's leaving cancels the task serving it, never a request answered in
time; the watch started by the sweep (the fast path) and at once give the same result."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.http.disconnect import WATCH_AFTER, DisconnectWatches

PATHS = [0, WATCH_AFTER]
IDS = ["at once", "by the sweep"]


class Client:
    """An ASGI `receive` whose next message, once `leave()` is called, is the disconnect."""

    def __init__(self) -> None:
        self._left = asyncio.Event()

    def leave(self) -> None:
        self._left.set()

    async def receive(self) -> dict[str, Any]:
        await self._left.wait()
        return {"type": "http.disconnect"}


@pytest.mark.parametrize("after", PATHS, ids=IDS)
async def test_a_client_that_leaves_cancels_the_task_serving_it(after: float) -> None:
    client, watch = Client(), DisconnectWatches(after).watch()

    async def serve() -> None:
        watch.start(client.receive)
        await asyncio.Event().wait()  # an answer that never comes

    served = asyncio.get_running_loop().create_task(serve())
    await asyncio.sleep(0)
    client.leave()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(served, 30)
    assert watch.gone


@pytest.mark.parametrize("after", PATHS, ids=IDS)
async def test_a_watch_stopped_before_the_client_leaves_cancels_nothing(after: float) -> None:
    client, watches = Client(), DisconnectWatches(after)
    watch = watches.watch()

    async def serve() -> str:
        watch.start(client.receive)
        await asyncio.sleep(0)
        watch.stop()
        client.leave()  # as an answer complete reads, after it is sent
        await asyncio.sleep(3 * WATCH_AFTER)  # sweeps come and go
        return "answered"

    assert await serve() == "answered"
    assert not watch.gone


async def test_the_sweep_watches_every_request_in_flight_and_none_answered() -> None:
    watches = DisconnectWatches()
    clients = [Client() for _ in range(4)]
    watched = [watches.watch() for _ in clients]

    async def serve(i: int) -> None:
        watched[i].start(clients[i].receive)
        if i % 2:
            watched[i].stop()  # answered at once
            return
        await asyncio.Event().wait()

    tasks = [asyncio.get_running_loop().create_task(serve(i)) for i in range(4)]
    await asyncio.sleep(0)
    for client in clients:
        client.leave()
    done, _ = await asyncio.wait(tasks, timeout=30)
    assert len(done) == 4
    assert [w.gone for w in watched] == [True, False, True, False]
    assert [t.cancelled() for t in tasks] == [True, False, True, False]
