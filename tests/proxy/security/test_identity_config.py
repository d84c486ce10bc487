"""The shape of `api_keys` (issue 32): named keys, plain keys named by their place, names that
cannot be confused with a session id's scope, and names surviving the hand-over to workers."""

from __future__ import annotations

import pytest

from proxy.config import Settings, load_settings
from proxy.errors import ConfigError


def test_plain_keys_are_named_by_their_place_and_named_keys_keep_their_names() -> None:
    settings = load_settings(
        api_keys=["client-key-A", {"name": "team-b", "key": "client-key-B"}, "k3"]
    )
    assert [k.name for k in settings.api_keys] == ["key-1", "team-b", "key-3"]
    assert settings.api_keys[1].key.get_secret_value() == "client-key-B"


def test_the_names_reach_the_workers_and_the_printout_shows_names_not_keys() -> None:
    settings = load_settings(api_keys=[{"name": "team-a", "key": "client-key-A"}, "client-key-B"])
    worker = Settings.model_validate_json(settings.to_json_with_secrets())
    assert [(k.name, k.key.get_secret_value()) for k in worker.api_keys] == [
        ("team-a", "client-key-A"),
        ("key-2", "client-key-B"),
    ]
    printed = str(settings.redacted())
    assert "team-a" in printed
    assert "client-key" not in printed


@pytest.mark.parametrize(
    "keys",
    [
        [{"name": "a:b", "key": "k1"}],  # the scope separator
        [{"name": "", "key": "k1"}],
        [{"name": "x" * 65, "key": "k1"}],
        [{"name": "same", "key": "k1"}, {"name": "same", "key": "k2"}],
        [{"name": "a", "key": "k1"}, {"name": "b", "key": "k1"}],
        [{"name": "a", "key": ""}],
    ],
)
def test_names_and_keys_that_would_confuse_sessions_are_refused(keys: list[object]) -> None:
    assert load_settings(api_keys=[{"name": "Team_1.b-c", "key": "k0"}]).api_keys
    with pytest.raises(ConfigError, match="api_keys"):
        load_settings(api_keys=keys)


def test_public_endpoints_name_only_the_proxys_own() -> None:
    with pytest.raises(ConfigError, match="public_endpoints"):
        load_settings(public_endpoints=["/v1/sessions"])
    loopback = load_settings()
    assert [loopback.public(p) for p in ("/healthz", "/readyz", "/metrics", "/openapi.json")] == [
        True,
        True,
        True,
        False,
    ]
    assert not load_settings(host="0.0.0.0").public("/metrics")
    assert load_settings(host="0.0.0.0", public_endpoints=["/metrics"]).public("/metrics")
