"""The pool of an upstream's keep-alive connections, on its own: what it writes for a request."""

from __future__ import annotations

import pytest

from proxy.upstream_http1 import encode_head
from proxy.upstream_origin import Origin
from proxy.upstream_pool import Pool


async def test_a_pools_remembered_heads_are_the_bytes_encode_head_writes() -> None:
    pool = Pool(
        Origin.of("http://h:8/v1"),
        limit=1,
        keepalive=1.0,
        connect_timeout=1.0,
        read_timeout=1.0,
    )
    cases = [
        ("POST", "/v1/chat/completions", {"x-a": "1", "user-agent": "u"}, b"{}"),
        ("POST", "/v1/chat/completions", {"x-a": "1", "user-agent": "u"}, b'{"n":12345}'),
        ("POST", "/v1/chat/completions", {"user-agent": "u", "x-a": "1"}, b""),  # other order
        ("GET", "/v1/models", {"x-a": "1"}, None),
        ("GET", "/v1/chat/completions", {"x-a": "1", "user-agent": "u"}, None),
        ("POST", "/v1/responses", {"x-a": "2", "user-agent": "u"}, b"{}"),
    ]
    for _ in range(2):  # encoded, then remembered
        for method, target, headers, body in cases:
            length = None if body is None else len(body)
            expected = encode_head(method, target, "h:8", headers, length)
            assert pool.head(method, target, headers, body) == expected
    for _ in range(2):  # refused every time, never remembered
        with pytest.raises(ValueError, match="'x-evil'"):
            pool.head("POST", "/v1/x", {"x-evil": "1\r\nx-injected: 2"}, b"{}")
    await pool.close()
