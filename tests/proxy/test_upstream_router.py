"""Routing between upstreams: a request's model picks its upstream."""

from __future__ import annotations

import pytest

from proxy.app import create_app
from proxy.config import Settings
from proxy.config_upstream import UpstreamConfig
from proxy.errors import NotFoundError
from proxy.upstream import HttpUpstream, Upstream
from proxy.upstream_replicas import Replicas
from proxy.upstream_router import Router, balanced


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


def test_a_deployment_of_one_replica_is_its_client_itself() -> None:
    router = _router(("a", ["m1"]), ("b", []))
    assert router.pick("m1") is router.upstreams[0]
    assert isinstance(router.pick("m1"), HttpUpstream)
    assert router.pick("other") is router.upstreams[1]


def test_entries_listing_one_model_are_its_replicas_and_share_their_counts() -> None:
    router = _router(("a", ["m1", "m2"]), ("b", ["m2"]), ("c", []), ("d", []))
    assert balanced_names(router.pick("m2")) == ["a", "b"]
    assert balanced_names(router.pick("m1")) == ["a"]  # a is a replica of m2: counted once
    assert balanced_names(router.pick("anything")) == ["c", "d"]
    # The replica of a in m1's deployment is the one in m2's: one count of its requests.
    m1, m2 = router.pick("m1"), router.pick("m2")
    assert isinstance(m1, Replicas)
    assert isinstance(m2, Replicas)
    assert m1.replicas[0] is m2.replicas[0]


def test_an_entry_with_several_base_urls_is_balanced_and_its_clients_do_not_retry() -> None:
    settings = Settings(
        upstreams=[{"name": "a", "base_urls": ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"]}],
        retries=2,
    )
    router = create_app(settings).state.pipeline.router
    deployment = router.pick("anything")
    assert isinstance(deployment, Replicas)
    assert [r.label for r in deployment.replicas] == [
        "http://127.0.0.1:1/v1",
        "http://127.0.0.1:2/v1",
    ]
    assert [r.upstream._retries for r in deployment.replicas] == [0, 0]


def test_one_upstream_is_served_as_before_with_its_own_retries() -> None:
    settings = Settings(upstreams=[{"name": "a", "base_url": "http://127.0.0.1:1/v1"}], retries=2)
    router = create_app(settings).state.pipeline.router
    client = router.pick("anything")
    assert isinstance(client, HttpUpstream)
    assert client.config is settings.upstreams[0]
    assert client._retries == 2


def test_balanced_says_which_entries_share_a_deployment() -> None:
    configs = [
        UpstreamConfig(name="a", base_url="http://h/v1", models=["m1"]),
        UpstreamConfig(name="b", base_urls=["http://h/v1", "http://i/v1"], models=["m2"]),
        UpstreamConfig(name="c", base_url="http://h/v1", models=["m3", "m3"]),
        UpstreamConfig(name="d", base_url="http://h/v1", models=["m1"]),
        UpstreamConfig(name="e", base_url="http://h/v1"),
    ]
    assert balanced(configs) == [True, True, False, True, False]


def balanced_names(deployment: Upstream) -> list[str]:
    assert isinstance(deployment, Replicas)
    return [r.upstream.name for r in deployment.replicas]
