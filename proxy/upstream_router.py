"""Routing between upstreams: `Router` picks the deployment that serves a request's model.

A deployment is every entry that lists the model (or, for a model no entry lists, every entry
that lists none), with all their base URLs: its replicas. One replica is its client itself; two
or more are balanced (`proxy.upstream_replicas.Replicas`), sharing each replica's count of
outstanding requests and cool-down with every other deployment it is part of.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from proxy.config_upstream import UpstreamConfig
from proxy.errors import NotFoundError
from proxy.metrics import Metrics
from proxy.upstream import Upstream
from proxy.upstream_replicas import Replica, Replicas, replica_label


def balanced(configs: Sequence[UpstreamConfig]) -> list[bool]:
    """Per entry, whether its replicas are balanced: it has several base URLs, or a model (or,
    listing none, the catch-all) it serves with another entry. A balanced entry's clients are
    made without retries of their own (`Replicas` retries across them)."""
    claims: dict[str | None, int] = {}
    for config in configs:
        for model in _served(config):
            claims[model] = claims.get(model, 0) + 1
    return [len(c.replica_urls) > 1 or any(claims[m] > 1 for m in _served(c)) for c in configs]


def _served(config: UpstreamConfig) -> list[str | None]:
    """The models an entry serves, None standing for the catch-all's any other model."""
    return [*dict.fromkeys(config.models)] if config.models else [None]


class Router:
    """Picks the deployment for a model: the entries listing it, else the catch-all entries
    (those listing no model).

    `upstreams[i]` is the client of `configs[i]`, or one client per URL of its `replica_urls`;
    a balanced entry's (see `balanced`) retry nothing themselves, and `retries` is how often a
    balanced deployment retries. `metrics`: where the replicas' series go.
    """

    def __init__(
        self,
        upstreams: Sequence[Upstream | Sequence[Upstream]],
        configs: Sequence[UpstreamConfig],
        *,
        retries: int = 0,
        metrics: Metrics | None = None,
    ) -> None:
        if not upstreams:
            raise ValueError("at least one upstream is required")
        clients = [[u] if not isinstance(u, Sequence) else list(u) for u in upstreams]
        shared = balanced(configs)
        replicas = [
            [
                Replica(u, label=replica_label(url), cooldown=c.cooldown_seconds, metrics=metrics)
                for u, url in zip(entry, c.replica_urls, strict=True)
            ]
            if shared[i]
            else []
            for i, (entry, c) in enumerate(zip(clients, configs, strict=True))
        ]

        def deployment(entries: list[int]) -> Upstream:
            if not shared[entries[0]]:  # one entry, one replica: its client, no detour
                return clients[entries[0]][0]
            members = [r for i in entries for r in replicas[i]]
            return Replicas(configs[entries[0]].name, members, retries=retries)

        self.upstreams: list[Upstream] = [deployment([i]) for i in range(len(configs))]
        """One per entry, each with all its replicas (the models list and /readyz ask each)."""
        serving: dict[str | None, list[int]] = {}
        for i, config in enumerate(configs):
            for model in _served(config):
                serving.setdefault(model, []).append(i)
        self._by_model = {
            model: self.upstreams[entries[0]] if len(entries) == 1 else deployment(entries)
            for model, entries in serving.items()
            if model is not None
        }
        catch_all = serving.get(None)
        self._fallback: Upstream | None = None
        if catch_all is not None:
            single = len(catch_all) == 1
            self._fallback = self.upstreams[catch_all[0]] if single else deployment(catch_all)

    def pick(self, model: object) -> Upstream:
        """The upstream serving `model`. Raises NotFoundError listing the models that are served."""
        if isinstance(model, str) and model in self._by_model:
            return self._by_model[model]
        if self._fallback is not None:
            return self._fallback
        if len(self.upstreams) == 1:
            return self.upstreams[0]
        known = ", ".join(sorted(self._by_model)) or "none"
        raise NotFoundError(
            f"model {model!r} is not served by any upstream; served models: {known}",
            param="model",
            code="model_not_found",
        )

    @property
    def default(self) -> Upstream:
        """The upstream for requests that name no model (raw pass-through endpoints)."""
        return self._fallback or self.upstreams[0]

    async def close(self) -> None:
        """Close every upstream's pool."""
        await asyncio.gather(*(u.close() for u in self.upstreams), return_exceptions=True)
