from __future__ import annotations

import inspect

import aiohttp
import pytest

from proxy.config import UpstreamConfig
from proxy.errors import (
    NotFoundError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeoutError,
)
from proxy.testing import Fault, LoopbackServer, ScriptedUpstream
from proxy.upstream import AiohttpUpstream, Router, error_class_for, translate


def _config(
    name: str, models: list[str] | None = None, url: str = "http://127.0.0.1:1/v1"
) -> UpstreamConfig:
    return UpstreamConfig(name=name, base_url=url, models=models or [])


def _upstreams(*configs: UpstreamConfig) -> tuple[list[AiohttpUpstream], list[UpstreamConfig]]:
    return [AiohttpUpstream(c, api_key=None, retries=0) for c in configs], list(configs)


def test_router_picks_by_model_then_the_catch_all() -> None:
    ups, configs = _upstreams(_config("a", ["m1"]), _config("b", []), _config("c", ["m2"]))
    router = Router(ups, configs)  # type: ignore[arg-type]
    assert router.pick("m1").name == "a"
    assert router.pick("m2").name == "c"
    assert router.pick("anything").name == "b"


def test_router_without_a_catch_all_names_the_served_models() -> None:
    ups, configs = _upstreams(_config("a", ["m1"]), _config("c", ["m2"]))
    router = Router(ups, configs)  # type: ignore[arg-type]
    with pytest.raises(NotFoundError, match="served models: m1, m2"):
        router.pick("m3")


def _public_aiohttp_errors() -> list[type[BaseException]]:
    return [
        obj
        for name in dir(aiohttp)
        if inspect.isclass(obj := getattr(aiohttp, name)) and issubclass(obj, aiohttp.ClientError)
    ]


def test_every_aiohttp_error_maps_to_a_specific_upstream_error() -> None:
    # The mapping is complete when no aiohttp error falls through to the generic UpstreamError.
    errors = _public_aiohttp_errors()
    assert len(errors) > 10
    for cls in errors:
        assert error_class_for(cls)[0] is not UpstreamError, cls


def test_timeouts_connect_failures_and_broken_bodies_map_to_distinct_errors() -> None:
    assert isinstance(translate(TimeoutError(), "u", "x"), UpstreamTimeoutError)
    assert isinstance(translate(aiohttp.ServerDisconnectedError(), "u", "x"), UpstreamConnectError)
    assert isinstance(translate(aiohttp.ClientPayloadError("cut"), "u", "x"), UpstreamProtocolError)
    assert "'u'" in translate(aiohttp.ServerDisconnectedError(), "u", "x").message


async def test_retries_stop_and_hand_back_the_last_503() -> None:
    script = ScriptedUpstream([Fault(503, {"error": {"message": "overloaded"}})])
    with LoopbackServer(script.app) as server:
        upstream = AiohttpUpstream(_config("s", url=f"{server.url}/v1"), api_key=None, retries=2)
        try:
            response = await upstream.request("POST", "chat/completions", body=b"{}", headers={})
        finally:
            await upstream.close()
    assert response.status == 503
    assert len(script.requests) == 3


async def test_a_refused_connection_is_retried_then_reported() -> None:
    from proxy.testing import free_port

    upstream = AiohttpUpstream(
        _config("down", url=f"http://127.0.0.1:{free_port()}/v1"), api_key=None, retries=1
    )
    try:
        with pytest.raises(UpstreamConnectError, match="'down' is unreachable"):
            await upstream.request("GET", "models", body=None, headers={})
    finally:
        await upstream.close()
