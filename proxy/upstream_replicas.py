"""The replicas of one deployment behind one `Upstream` (DESIGN §8): each try of a request goes to
the replica `proxy.upstream_balance.Balancer` picks; one whose try fails before its answer's first
byte cools down, and the request goes on to another within the proxy's `retries`.

A deployment of one replica is its `HttpUpstream` itself, with the retries of its own: none of
this module is on its path. The replicas' own clients never retry (`retries=0`); `Replicas`
retries what `HttpUpstream` retries (connect errors, timeouts, 502/503/504 before the first
byte), with the same backoff, but only when a try goes back to a replica it already went to.
A try that failed with a connect error or a timeout cools its replica down; a 502/503/504 is an
answer (the replica is up), so it only moves the request on.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager

from prometheus_client import Counter, Gauge
from yarl import URL

from proxy.errors import UpstreamConnectError, UpstreamTimeoutError
from proxy.logs import get_logger
from proxy.metrics import Metrics
from proxy.tracing import RequestTrace
from proxy.upstream import RETRYABLE_STATUS, Done, Sent, Upstream
from proxy.upstream_balance import Balancer, ReplicaState
from proxy.upstream_response import UpstreamResponse, UpstreamStream

COOLING_FAILURES = (UpstreamConnectError, UpstreamTimeoutError)
"""How a try fails when its replica gets no answer out: it cools down (`cooldown_seconds`)."""


def replica_label(base_url: str) -> str:
    """A replica's name in metrics and logs: its base URL without credentials or query."""
    return str(URL(base_url).with_user(None).with_query(None))


class Replica:
    """One replica: its client (which never retries), what the balancer knows of it, its
    cool-down and its series (`toolsentry_replica_*{upstream, replica}`)."""

    __slots__ = ("_cooldowns", "_outstanding", "_tries", "cooldown", "label", "state", "upstream")

    def __init__(
        self, upstream: Upstream, *, label: str, cooldown: float, metrics: Metrics | None
    ) -> None:
        self.upstream = upstream
        self.label = label
        self.cooldown = cooldown
        self.state = ReplicaState()
        names = (upstream.name, label)
        self._outstanding: Gauge | None = None
        self._tries: Counter | None = None
        self._cooldowns: Counter | None = None
        if metrics is not None:
            self._outstanding = metrics.replica_outstanding.labels(*names)
            self._tries = metrics.replica_tries.labels(*names)
            self._cooldowns = metrics.replica_cooldowns.labels(*names)
            self._cooldowns.inc(0)  # listed from the start: an alert reads a rise from zero

    def begin(self) -> None:
        """A try goes out to this replica."""
        self.state.outstanding += 1
        if self._outstanding is not None and self._tries is not None:
            self._outstanding.inc()
            self._tries.inc()

    def end(self) -> None:
        """A try on this replica is over (answered, read, failed or given up)."""
        self.state.outstanding -= 1
        if self._outstanding is not None:
            self._outstanding.dec()

    def failed(self, error: Exception) -> None:
        """A try failed before its answer's first byte: the replica cools down."""
        self.state.cool(time.monotonic(), self.cooldown)
        if self._cooldowns is not None:
            self._cooldowns.inc()
        get_logger().warning(
            "replica_cooling",
            upstream=self.upstream.name,
            replica=self.label,
            seconds=self.cooldown,
            error=error.__class__.__name__,
        )


class Replicas:
    """The replicas of one deployment as one `Upstream`: `request` and `stream` balance and
    retry as the module doc says; `send` (no task awaits it, no retries) goes to the replica the
    balancer picks. `name` is the deployment's (its first entry's)."""

    def __init__(self, name: str, replicas: Sequence[Replica], *, retries: int) -> None:
        self.name = name
        self.replicas = list(replicas)
        self._balancer = Balancer([r.state for r in self.replicas])
        self._retries = retries

    @property
    def exhausted(self) -> bool:
        """Whether every replica's connections are busy: a request would wait."""
        return all(r.upstream.exhausted for r in self.replicas)

    async def request(
        self, method: str, path: str, *, body: bytes | None, headers: Mapping[str, str]
    ) -> UpstreamResponse:
        """As `HttpUpstream.request`, each try on the replica the balancer picks."""
        tried: list[int] = []
        while True:
            replica = await self._next(tried)
            last = len(tried) > self._retries
            replica.begin()
            try:
                response = await replica.upstream.request(method, path, body=body, headers=headers)
            except COOLING_FAILURES as exc:
                replica.failed(exc)
                if last:
                    raise
                continue
            finally:
                replica.end()
            if last or response.status not in RETRYABLE_STATUS:
                return response

    @asynccontextmanager
    async def stream(
        self, path: str, *, body: bytes | None, headers: Mapping[str, str], method: str = "POST"
    ) -> AsyncIterator[UpstreamStream]:
        """As `HttpUpstream.stream`, each try on the replica the balancer picks; the replica's
        request is outstanding until the stream is closed."""
        tried: list[int] = []
        while True:
            replica = await self._next(tried)
            last = len(tried) > self._retries
            held = AsyncExitStack()
            replica.begin()
            held.callback(replica.end)
            async with held:
                try:
                    opened = await held.enter_async_context(
                        replica.upstream.stream(path, body=body, headers=headers, method=method)
                    )
                except COOLING_FAILURES as exc:
                    replica.failed(exc)
                    if last:
                        raise
                    continue
                if last or opened.status not in RETRYABLE_STATUS:
                    yield opened
                    return

    def send(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None,
        headers: Mapping[str, str],
        done: Done,
        trace: RequestTrace | None = None,
        idle_only: bool = True,
    ) -> Sent | None:
        """As `HttpUpstream.send`, on the replica the balancer picks (not counted outstanding:
        the answer's callback may never come, when the caller cancels)."""
        replica = self.replicas[self._balancer.pick(time.monotonic())]
        return replica.upstream.send(
            method, path, body=body, headers=headers, done=done, trace=trace, idle_only=idle_only
        )

    async def close(self) -> None:
        """Close every replica's client."""
        await asyncio.gather(*(r.upstream.close() for r in self.replicas), return_exceptions=True)

    async def _next(self, tried: list[int]) -> Replica:
        """The replica for a request's next try (`tried`: where its earlier ones went, to which
        this one is added). Going back to one, it waits first, as `HttpUpstream` waits between
        its retries."""
        index = self._balancer.pick(time.monotonic(), tried)
        if index in tried:
            await asyncio.sleep(_backoff(len(tried)))
        tried.append(index)
        return self.replicas[index]


def _backoff(retry: int) -> float:
    """Seconds before the `retry`-th retry: `HttpUpstream`'s policy (tenacity's exponential
    backoff with jitter, 0.05 s doubling up to 2 s, plus up to 0.05 s)."""
    return min(0.05 * 2.0 ** (retry - 1) + random.uniform(0, 0.05), 2.0)
