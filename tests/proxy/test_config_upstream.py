"""Tests for proxy/config_upstream.py: one upstream's settings as a configuration file or the
environment gives them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from proxy.config_upstream import UpstreamConfig
from proxy.guard.repair import StructuredOutputs


def test_a_base_url_loses_its_trailing_slash() -> None:
    assert UpstreamConfig(name="vllm", base_url="http://127.0.0.1:8001/v1/").base_url == (
        "http://127.0.0.1:8001/v1"
    )


@pytest.mark.parametrize("url", ["ftp://host/v1", "127.0.0.1:8001/v1", "unix:///run/vllm.sock"])
def test_a_base_url_that_is_not_http_is_refused_naming_it(url: str) -> None:
    with pytest.raises(ValidationError, match="base_url must start with http"):
        UpstreamConfig(name="vllm", base_url=url)


@pytest.mark.parametrize("field", ["timeout", "connect_timeout", "pool_timeout", "total_timeout"])
def test_a_deadline_must_be_positive(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        UpstreamConfig(name="vllm", base_url="http://h/v1", **{field: 0})


def test_yaml_on_and_off_read_as_structured_outputs_modes() -> None:
    on = UpstreamConfig(name="a", base_url="http://h/v1", structured_outputs=True)
    off = UpstreamConfig(name="a", base_url="http://h/v1", structured_outputs=False)
    assert (on.structured_outputs, off.structured_outputs) == (
        StructuredOutputs("on"),
        StructuredOutputs("off"),
    )


def test_base_urls_are_the_replicas_and_base_url_their_first() -> None:
    entry = UpstreamConfig(name="vllm", base_urls=["http://a:8000/v1/", "http://b:8000/v1"])
    assert entry.base_url == "http://a:8000/v1"
    assert entry.replica_urls == ["http://a:8000/v1", "http://b:8000/v1"]
    assert entry.replica("http://b:8000/v1").base_url == "http://b:8000/v1"
    assert UpstreamConfig.model_validate(entry.model_dump()) == entry  # workers get the same


def test_one_base_url_is_its_only_replica() -> None:
    entry = UpstreamConfig(name="vllm", base_url="http://a:8000/v1")
    assert entry.replica_urls == ["http://a:8000/v1"]
    assert entry.replica("http://a:8000/v1") is entry


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"base_url": "http://x/v1", "base_urls": ["http://a/v1"]}, "base_url or base_urls"),
        ({"base_urls": ["http://a/v1", "ftp://b/v1"]}, "base_urls: .*must start with http"),
        ({"base_urls": ["http://a/v1", "http://a/v1/"]}, "lists a URL twice"),
        ({"base_urls": ["http://a/v1"], "cooldown_seconds": 0}, "cooldown_seconds"),
    ],
)
def test_replicas_that_cannot_be_served_are_refused_naming_why(
    fields: dict[str, object], error: str
) -> None:
    with pytest.raises(ValidationError, match=error):
        UpstreamConfig(name="vllm", **fields)  # type: ignore[arg-type]
