"""Routing between upstreams: a request's model picks its upstream."""

from __future__ import annotations

import pytest

from proxy.config_upstream import UpstreamConfig
from proxy.errors import NotFoundError
from proxy.upstream import HttpUpstream, Upstream
from proxy.upstream_router import Router


def _router(*served: tuple[str, list[str]]) -> Router:
    """A router over upstreams named and serving the models given (none: the catch-all)."""
    configs = [
        UpstreamConfig(name=name, base_url="http://127.0.0.1:1/v1", models=models)
        for name, models in served
    ]
    upstreams: list[Upstream] = [HttpUpstream(c, api_key=None, retries=0) for c in configs]
    return Router(upstreams, configs)


def test_router_picks_by_model_then_the_catch_all() -> None:
    router = _router(("a", ["m1"]), ("b", []), ("c", ["m2"]))
    assert router.pick("m1").name == "a"
    assert router.pick("m2").name == "c"
    assert router.pick("anything").name == "b"


def test_router_without_a_catch_all_names_the_served_models() -> None:
    router = _router(("a", ["m1"]), ("c", ["m2"]))
    with pytest.raises(NotFoundError, match="served models: m1, m2"):
        router.pick("m3")
