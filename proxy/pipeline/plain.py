"""The plain driver: one non-streamed request through the turn.

The client's bytes go to the upstream as they are; when no choice changed and no re-ask added
usage, the upstream's bytes go back as they are too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.errors import UpstreamError, status_of
from proxy.pipeline.turn import Turn
from proxy.protocols.base import Settled
from proxy.tracing import CURRENT as CURRENT_TRACE
from proxy.usage import sum_usage


@dataclass(slots=True)
class TurnResult:
    """A plain turn's answer: status, headers, and either the upstream's raw bytes or a body."""

    status: int
    headers: dict[str, str]
    body: dict[str, Any] | None = None
    raw: bytes | None = None

    def content(self) -> bytes:
        """The response body as bytes."""
        if self.raw is not None:
            return self.raw
        return orjson.dumps(self.body)


async def complete(turn: Turn, *, raw: bytes | None = None) -> TurnResult:
    """Serve the turn without a stream; `raw`: the client's body as sent.

    Raises UpstreamError (the turn closed with its status), UnrepairedToolCallError under
    `on_unrepaired: reject` (closed with 422) and SessionStoreError (the answer's counts could
    not be written; the caller closes the turn).
    """
    protocol = turn.protocol
    if turn.ending is not None:  # the budget's `finish` policy: the turn is closed
        answer = protocol.finish(turn.body, turn.ending)
        return TurnResult(200, turn.report().headers(), body=answer)
    try:
        response = await turn.send_first(raw)
        reply = protocol.read(response.json(), turn.upstream.name)
    except UpstreamError as exc:
        turn.fail(exc)
        await turn.close(status_of(exc))
        raise
    turn.answered(reply.response_id)
    trace = CURRENT_TRACE.get()
    if trace is not None:
        trace.answered(reply.body)
    settled: list[Settled] = []
    usages: list[Mapping[str, Any]] = []
    changed = False
    for choice in reply.choices:  # nearly always one: a loop, not three comprehensions
        done = await turn.settle(choice)
        settled.append(done)
        usages += done.usage
        changed = changed or done.changed
    await turn.commit()  # count, then send: a store that fails here fails the request (503)
    report = await turn.close(200)
    if not changed and not usages:
        return TurnResult(200, report.headers(), raw=response.body)
    usage = sum_usage([reply.body.get("usage") or {}, *usages]) if usages else None
    return TurnResult(200, report.headers(), body=protocol.write(reply, settled, usage))
