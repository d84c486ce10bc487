"""Routing between upstreams: `Router` picks the upstream that serves a request's model."""

from __future__ import annotations

import asyncio

from proxy.config_upstream import UpstreamConfig
from proxy.errors import NotFoundError
from proxy.upstream import Upstream


class Router:
    """Picks the upstream for a model: an exact `models` match, else the catch-all upstream."""

    def __init__(self, upstreams: list[Upstream], configs: list[UpstreamConfig]) -> None:
        if not upstreams:
            raise ValueError("at least one upstream is required")
        self.upstreams = upstreams
        self._by_model: dict[str, Upstream] = {}
        self._fallback: Upstream | None = None
        for upstream, config in zip(upstreams, configs, strict=True):
            for model in config.models:
                self._by_model.setdefault(model, upstream)
            if not config.models and self._fallback is None:
                self._fallback = upstream

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
