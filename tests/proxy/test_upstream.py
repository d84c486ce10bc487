from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
from collections.abc import AsyncIterator

import aiohttp
import aiohttp.web
import pytest

from proxy.config_upstream import UpstreamConfig
from proxy.errors import (
    UpstreamConnectError,
    UpstreamProtocolError,
)
from proxy.testing import SSE, Fault, LoopbackServer, ScriptedUpstream, unused_socket
from proxy.upstream import HttpUpstream, chat_request_headers
from proxy.upstream_response import UpstreamStream
from tests.proxy.conftest import RunningUpstream


def _config(name: str, url: str) -> UpstreamConfig:
    return UpstreamConfig(name=name, base_url=url)


@contextlib.asynccontextmanager
async def _serving(script: ScriptedUpstream, retries: int = 0) -> AsyncIterator[HttpUpstream]:
    """An upstream named 's' in front of `script` on a loopback server, closed on the way out."""
    with LoopbackServer(script.app) as server:
        upstream = HttpUpstream(_config("s", url=f"{server.url}/v1"), api_key=None, retries=retries)
        try:
            yield upstream
        finally:
            await upstream.close()


@contextlib.asynccontextmanager
async def _unreachable() -> AsyncIterator[HttpUpstream]:
    """An upstream named 'down', retried once, on a loopback port that refuses connections."""
    with unused_socket() as refusing:
        port = refusing.getsockname()[1]
        upstream = HttpUpstream(
            _config("down", url=f"http://127.0.0.1:{port}/v1"), api_key=None, retries=1
        )
        try:
            yield upstream
        finally:
            await upstream.close()


def test_chat_request_headers_keep_the_clients_own_and_drop_transport_credentials_and_controls() -> (
    None
):
    client = {
        "Host": "proxy:4000",
        "Connection": "keep-alive, X-Hop",
        "X-Hop": "for the next hop only",
        "Transfer-Encoding": "chunked",
        "Content-Length": "812",
        "Content-Type": "application/json; charset=utf-8",
        "Accept-Encoding": "gzip",
        "Authorization": "Bearer client-key",
        "X-Toolsentry-Max-Errors": "3",
        "x-toolsentry-repair": "off",
        "X-Request-Id": "req-7",
        "X-Tenant": "acme",
        "x-session-id": "s1",
        "User-Agent": "OpenAI/Python",
    }
    assert chat_request_headers(client) == {
        "x-request-id": "req-7",
        "x-tenant": "acme",
        "x-session-id": "s1",
        "user-agent": "OpenAI/Python",
    }


@pytest.mark.parametrize(("retries", "tries"), [(2, 3), (0, 1)])  # 0: one try, no policy
async def test_retries_stop_and_hand_back_the_last_503(retries: int, tries: int) -> None:
    script = ScriptedUpstream([Fault(503, {"error": {"message": "overloaded"}})])
    async with _serving(script, retries=retries) as upstream:
        response = await upstream.request("POST", "chat/completions", body=b"{}", headers={})
    assert response.status == 503
    assert len(script.requests) == tries


async def test_a_refused_connection_is_retried_then_reported() -> None:
    async with _unreachable() as upstream:
        with pytest.raises(UpstreamConnectError, match="'down' is unreachable"):
            await upstream.request("GET", "models", body=None, headers={})


# ---------------------------------------------------------------- streaming


async def _read_all(stream: UpstreamStream) -> bytes:
    return b"".join([chunk async for chunk in stream.chunks])


async def test_a_stream_hands_over_the_status_and_the_body_as_it_arrives() -> None:
    script = ScriptedUpstream([SSE([{"n": 1}, b": ping\n\n", {"n": 2}], chunk_sizes=[5])])
    async with (
        _serving(script) as upstream,
        upstream.stream("chat/completions", body=b"{}", headers={}) as stream,
    ):
        assert stream.status == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        body = await _read_all(stream)
    assert body == b'data: {"n":1}\n\n: ping\n\ndata: {"n":2}\n\ndata: [DONE]\n\n'


async def test_a_stream_is_retried_on_503_until_the_upstream_answers() -> None:
    script = ScriptedUpstream([Fault(503), Fault(503), SSE([{"n": 1}])])
    async with (
        _serving(script, retries=2) as upstream,
        upstream.stream("chat/completions", body=b"{}", headers={}) as stream,
    ):
        assert stream.status == 200
        assert b'"n":1' in await _read_all(stream)
    assert len(script.requests) == 3


async def test_when_stream_retries_run_out_the_last_refusal_is_handed_over_with_its_body() -> None:
    script = ScriptedUpstream([Fault(503, {"error": {"message": "overloaded"}})])
    async with (
        _serving(script, retries=1) as upstream,
        upstream.stream("chat/completions", body=b"{}", headers={}) as stream,
    ):
        assert stream.status == 503
        assert b"overloaded" in await _read_all(stream)
    assert len(script.requests) == 2


async def test_a_stream_to_a_refused_port_is_retried_then_reported() -> None:
    async with _unreachable() as upstream:
        with pytest.raises(UpstreamConnectError, match="'down' is unreachable"):
            async with upstream.stream("chat/completions", body=b"{}", headers={}):
                pass  # pragma: no cover - never entered


async def test_a_body_broken_off_mid_stream_raises_a_protocol_error() -> None:
    script = ScriptedUpstream([SSE([{"n": 1}, {"n": 2}, {"n": 3}], drop_after=2)])
    async with (
        _serving(script) as upstream,
        upstream.stream("chat/completions", body=b"{}", headers={}) as stream,
    ):
        with pytest.raises(UpstreamProtocolError, match="'s' broke off its response"):
            await _read_all(stream)


async def test_leaving_a_stream_early_closes_the_upstream_connection() -> None:
    resume = threading.Event()  # never set: the upstream waits until its connection goes
    script = ScriptedUpstream([SSE([{"n": 1}, {"n": 2}], pause_after=1, pause=30, resume=resume)])
    async with _serving(script) as upstream:
        async with upstream.stream("chat/completions", body=b"{}", headers={}) as stream:
            assert b'"n":1' in await anext(stream.chunks)
        assert await asyncio.to_thread(script.stream_cut.wait, 10)


async def test_a_stream_read_to_its_end_leaves_its_connection_in_the_pool() -> None:
    script = ScriptedUpstream([SSE([{"n": 1}])])
    async with _serving(script) as upstream:
        for _ in range(3):
            async with upstream.stream("chat/completions", body=b"{}", headers={}) as stream:
                await _read_all(stream)
        pooled = upstream.pool().idle
    assert pooled == 1


async def test_an_idle_pooled_connection_is_let_go_before_the_servers_keep_alive_ends() -> None:
    # vLLM and uvicorn close an idle connection after 5 s; a client keeping it longer may reuse
    # one just as the server closes it, and a request without retries (the shadow's) fails.
    # This server keeps its side open, so only the client's keep-alive decides.
    async def peer(request: aiohttp.web.Request) -> aiohttp.web.Response:
        await request.read()
        return aiohttp.web.json_response({"port": request.transport.get_extra_info("peername")[1]})

    app = aiohttp.web.Application()
    app.router.add_post("/v1/peer", peer)
    runner = aiohttp.web.AppRunner(app, keepalive_timeout=60)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    config = UpstreamConfig(name="s", base_url=f"http://127.0.0.1:{port}/v1", keepalive_timeout=0.2)
    upstream = HttpUpstream(config, api_key=None, retries=0)
    try:
        ports = []
        for pause in (0.0, 0.0, 0.8):
            await asyncio.sleep(pause)
            response = await upstream.request("POST", "peer", body=b"{}", headers={})
            ports.append(response.json()["port"])
    finally:
        await upstream.close()
        await runner.cleanup()
    assert ports[0] == ports[1]  # kept alive between requests close together
    assert ports[2] != ports[1]  # let go once idle past keepalive_timeout
    assert UpstreamConfig(name="d", base_url="http://127.0.0.1:1/v1").keepalive_timeout < 5


# ---------------------------------------------------------------- base URLs


async def test_an_upstream_on_a_unix_socket_is_reached_through_it_and_keeps_its_connection(
    unix_upstream: RunningUpstream,
) -> None:
    script, server = unix_upstream.script, unix_upstream.server
    for url in (server.url[:-1], f"{server.url}/v1"):  # base path /v1: by default, or given
        upstream = HttpUpstream(_config("sock", url), api_key=None, retries=0)
        try:
            answers = [
                await upstream.request("POST", "chat/completions", body=b"{}", headers={}),
                await upstream.request("GET", "models", body=None, headers={}),
            ]
            async with upstream.stream(
                "chat/completions", body=b'{"stream": true}', headers={}
            ) as opened:
                streamed = await _read_all(opened)
            kept = upstream.pool().idle
        finally:
            await upstream.close()
        assert [a.status for a in answers] == [200, 200]
        assert answers[1].json()["data"][0]["id"] == "scripted-model"
        assert streamed.endswith(b"data: [DONE]\n\n")
        assert kept == 1  # one connection for the three, kept alive
    assert script.paths == ["/v1/chat/completions", "/v1/models", "/v1/chat/completions"] * 2
    assert {h["host"] for h in script.request_headers} == {"localhost"}


async def test_userinfo_in_the_base_url_is_sent_as_basic_auth_unless_a_key_is_configured() -> None:
    script = ScriptedUpstream()
    with LoopbackServer(script.app) as server:
        url = server.url.replace("http://", "http://ann:s%3Acret@") + "/v1"
        for api_key in (None, "sk-up"):
            upstream = HttpUpstream(_config("s", url), api_key=api_key, retries=0)
            try:
                await upstream.request("POST", "chat/completions", body=b"{}", headers={})
            finally:
                await upstream.close()
    basic = "Basic " + base64.b64encode(b"ann:s:cret").decode()
    assert [h["authorization"] for h in script.request_headers] == [basic, "Bearer sk-up"]


async def test_an_error_names_the_url_without_the_credentials_of_the_base_url() -> None:
    with unused_socket() as refusing:
        port = refusing.getsockname()[1]
        url = f"http://ann:s3cret@127.0.0.1:{port}/v1?api-version=1"
        upstream = HttpUpstream(_config("down", url), api_key=None, retries=0)
        try:
            with pytest.raises(UpstreamConnectError) as failed:
                await upstream.request("GET", "models", body=None, headers={})
        finally:
            await upstream.close()
    assert "s3cret" not in str(failed.value)
    assert "ann" not in str(failed.value)
    assert f"(http://127.0.0.1:{port}/v1/models?api-version=1)" in str(failed.value)
