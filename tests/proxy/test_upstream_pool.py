"""The pool of an upstream's keep-alive connections, on its own: what it writes for a request, and
how long a request waits for a connection."""

from __future__ import annotations

import asyncio

import pytest

from proxy.upstream_errors import PoolExhausted
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


async def test_a_request_that_finds_every_connection_busy_waits_at_most_pool_timeout() -> None:
    answer, ended = asyncio.Event(), asyncio.Event()

    async def held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # one request after another on a keep-alive connection
                await reader.readuntil(b"\r\n\r\n")
                await answer.wait()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        except asyncio.IncompleteReadError:  # the pool closed the connection
            writer.close()
            await writer.wait_closed()
            ended.set()

    server = await asyncio.start_server(held, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = Pool(
        Origin.of(f"http://127.0.0.1:{port}/v1"),
        limit=1,
        keepalive=10.0,
        connect_timeout=10.0,
        read_timeout=60.0,
        pool_timeout=0.2,
    )
    async with server:
        connection, response = await pool.send("GET", "/v1/models", {}, None)
        assert pool.exhausted
        with pytest.raises(PoolExhausted, match="all 1 connections stayed busy"):
            await pool.send("GET", "/v1/models", {}, None)
        answer.set()
        await response.head()
        assert await response.read() == b"ok"
        pool.release(connection, response)
        assert not pool.exhausted
        again, second = await pool.send("GET", "/v1/models", {}, None)
        assert again is connection  # the freed connection serves the next request
        await second.head()
        assert await second.read() == b"ok"
        pool.release(again, second)
        await pool.close()
        await asyncio.wait_for(ended.wait(), 30)
