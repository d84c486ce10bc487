"""Tests for proxy/config_upstream.py: one upstream's settings as a configuration file or the
environment gives them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from proxy.config import load_settings
from proxy.config_upstream import UpstreamConfig, masked_url
from proxy.errors import ConfigError
from proxy.guard.repair import StructuredOutputs


def test_a_base_url_loses_its_trailing_slash() -> None:
    assert UpstreamConfig(name="vllm", base_url="http://127.0.0.1:8001/v1/").base_url == (
        "http://127.0.0.1:8001/v1"
    )


@pytest.mark.parametrize("url", ["ftp://host/v1", "127.0.0.1:8001/v1", "unix://run/vllm.sock"])
def test_a_base_url_that_is_not_http_or_unix_is_refused_naming_it(url: str) -> None:
    with pytest.raises(ValidationError, match="base_url must start with http"):
        UpstreamConfig(name="vllm", base_url=url)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://ann:s3cret@/v1", "not an http(s) or unix URL: 'http:///v1'"),
        ("http://h:99999/v1", "Port out of range"),
        ("unix:///run/vllm.sock:v1", "not a unix:///path/to/socket[:/base/path] URL"),
    ],
)
def test_a_base_url_without_a_host_a_port_or_a_socket_path_is_refused_at_once(
    url: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as refused:  # the one line the CLI prints
        load_settings(upstreams=[url])
    assert problem in refused.value.message
    assert "s3cret" not in refused.value.message


def test_a_refused_base_url_is_named_with_its_password_masked() -> None:
    with pytest.raises(ValidationError) as refused:
        UpstreamConfig(name="vllm", base_url="ftp://ann:s3cret@host/v1")
    assert "s3cret" not in str(refused.value.errors()[0]["msg"])
    assert "ftp://ann:**********@host/v1" in str(refused.value.errors()[0]["msg"])


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://ann:s3cret@h:8000/v1", "http://ann:**********@h:8000/v1"),
        ("http://ann@h/v1?api-version=1", "http://ann:**********@h/v1?api-version=1"),
        ("http://h/v1?to=a@b", "http://h/v1?to=a@b"),
        ("unix:///run/vllm.sock:/v1", "unix:///run/vllm.sock:/v1"),
    ],
)
def test_a_base_url_is_shown_with_its_password_masked(url: str, shown: str) -> None:
    assert UpstreamConfig(name="vllm", base_url=url).shown_base_url == shown
    assert masked_url(url) == shown


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
