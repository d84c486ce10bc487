"""The edge's rules as pure functions, and the pass-through's allowlist as configured."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from proxy.config import Settings, load_settings
from proxy.errors import ConfigError
from proxy.http.edge import PassthroughRoutes, normalised, not_normal
from tests.proxy.conftest import RunningProxy, RunningUpstream


@pytest.mark.parametrize(
    "path",
    ["/v1/chat/completions", "/v1/sessions/a.b/c", "/", "/v1/models/", "/.well-known", "/v1/..x"],
)
def test_paths_in_normal_form(path: str) -> None:
    assert not_normal(path) is None


@pytest.mark.parametrize(
    "path",
    ["/v1/./chat", "/v1/../v1/chat", "/v1//chat", "//v1", "/v1/.", "/v1/..", "/a\x00b", "v1/x", ""],
)
def test_paths_not_in_normal_form(path: str) -> None:
    assert not_normal(path) is not None


def test_normalised_resolves_dot_and_empty_segments() -> None:
    assert normalised("/v1/x/../messages/./") == "/v1/messages"
    assert normalised("/../../v1//messages") == "/v1/messages"


def test_the_default_allowlist_is_vllms_public_client_endpoints_with_their_methods() -> None:
    routes = PassthroughRoutes()
    assert routes.allows("POST", "/v1/completions")
    assert routes.allows("GET", "/health")
    assert not routes.allows("GET", "/v1/completions")
    assert not routes.allows("POST", "/collective_rpc")
    assert not routes.allows("POST", "/v1/completions/x")


def test_allow_and_deny_entries() -> None:
    routes = PassthroughRoutes(
        ["POST /v1/load_lora_adapter", "/v1/files/*", "/tokenize"], ["/detokenize", "GET /health"]
    )
    assert routes.allows("POST", "/v1/load_lora_adapter")
    assert not routes.allows("GET", "/v1/load_lora_adapter")
    assert routes.allows("DELETE", "/v1/files/abc")
    assert not routes.allows("GET", "/v1/files")
    assert routes.allows("POST", "/tokenize")
    assert not routes.allows("POST", "/detokenize")
    assert not routes.allows("GET", "/health")
    assert not PassthroughRoutes(defaults=False).allows("POST", "/v1/completions")


def test_a_turn_route_is_never_passed_through_whatever_is_allowed() -> None:
    routes = PassthroughRoutes(["POST /v1/chat/completions", "/v1/*", "POST /v1/messages"])
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
        assert not routes.allows("POST", path)


@pytest.mark.parametrize("entry", ["v1/x", "FETCH /x", "/v1/./x", "/a//b", "POST"])
def test_a_bad_entry_is_a_config_error(entry: str) -> None:
    with pytest.raises(ConfigError, match="passthrough"):
        load_settings(passthrough={"allow": [entry]})


def test_an_allowed_control_endpoint_passes_through(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream
) -> None:
    proxy = make_proxy(passthrough={"allow": ["POST /v1/load_lora_adapter"]})
    with proxy.http() as http:
        assert http.post("/v1/load_lora_adapter", json={"lora_name": "x"}).status_code == 200
        refused = http.post("/collective_rpc", json={})
        assert refused.status_code == 404
        assert refused.json()["error"]["type"] == "not_found_error"
    assert upstream.script.paths == ["/v1/load_lora_adapter"]


def test_the_header_limit_is_a_setting(make_proxy: Callable[..., RunningProxy]) -> None:
    proxy = make_proxy(max_header_bytes=2048)
    with proxy.http() as http:
        assert http.get("/healthz", headers={"x-pad": "p" * 1024}).status_code == 200
        assert http.get("/healthz", headers={"x-pad": "p" * 4096}).status_code == 431
    assert Settings().max_header_bytes == 64 * 1024
