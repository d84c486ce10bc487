"""Where an upstream's requests go: an origin read from its base URL."""

from __future__ import annotations

import pytest

from proxy.upstream_origin import Origin


def test_an_origin_takes_the_schemes_default_port_and_a_tls_context_only_for_https() -> None:
    plain = Origin.of("http://vllm.internal/v1")
    secure = Origin.of("https://vllm.internal:8443/v1")
    assert (plain.scheme, plain.host, plain.port, plain.tls) == ("http", "vllm.internal", 80, None)
    assert (secure.host, secure.port) == ("vllm.internal", 8443)
    assert secure.tls is not None


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://h/v1", "h"),
        ("http://h:80/v1", "h"),
        ("https://h:443/v1", "h"),
        ("http://h:8000/v1", "h:8000"),
        ("http://[::1]:8000/v1", "[::1]:8000"),
        ("https://[::1]/v1", "[::1]"),
    ],
)
def test_the_host_header_names_the_port_only_when_it_is_not_the_schemes_default(
    url: str, host: str
) -> None:
    assert Origin.of(url).host_header == host


@pytest.mark.parametrize("url", ["ftp://h/v1", "unix:///run/vllm.sock", "/v1", "http:///v1"])
def test_anything_but_an_absolute_http_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        Origin.of(url)
