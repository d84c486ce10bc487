"""Fixtures that start real servers on loopback: a scripted upstream and the proxy in front of it."""

from __future__ import annotations

import io
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

from proxy.app import create_app
from proxy.config import Settings
from proxy.logs import configure_logging
from proxy.testing import LoopbackServer, ScriptedUpstream


@dataclass
class RunningUpstream:
    script: ScriptedUpstream
    server: LoopbackServer

    @property
    def base_url(self) -> str:
        return f"{self.server.url}/v1"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(f"<scripted upstream at {self.base_url}>")  # for hypothesis's reports


@dataclass
class RunningProxy:
    server: LoopbackServer
    settings: Settings
    app: Any
    clients: list[Any] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"{self.server.url}/v1"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(f"<proxy at {self.base_url}>")  # for hypothesis's reports

    def client(self, **kwargs: Any) -> openai.OpenAI:
        kwargs.setdefault("api_key", "test-key")
        kwargs.setdefault("max_retries", 0)
        client = openai.OpenAI(base_url=self.base_url, **kwargs)
        self.clients.append(client)  # closed when the fixture ends, so no socket outlives a test
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()
        self.server.stop()

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.server.url, timeout=10)

    def session(self, session_id: str, **headers: str) -> dict[str, Any]:
        with self.http() as http:
            response = http.get(f"/v1/sessions/{session_id}", headers=headers)
            response.raise_for_status()
            data: dict[str, Any] = response.json()
            return data

    def metrics(self) -> str:
        with self.http() as http:
            return http.get("/metrics").text


@pytest.fixture
def log() -> Iterator[io.StringIO]:
    """What the proxy logs during the test, at info level."""
    buffer = io.StringIO()
    configure_logging("info", stream=buffer)
    yield buffer
    configure_logging("warning", stream=io.StringIO())


@pytest.fixture
def upstream() -> Iterator[RunningUpstream]:
    script = ScriptedUpstream()
    with LoopbackServer(script.app) as server:
        yield RunningUpstream(script, server)


@pytest.fixture
def unix_upstream() -> Iterator[RunningUpstream]:
    """A scripted upstream served by uvicorn on a Unix socket: its base URL `unix:///…sock:/v1`.
    The socket's path is short (at most 107 bytes, which a test's tmp_path may pass)."""
    folder = tempfile.mkdtemp(prefix="ts-", dir="/tmp")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(os.path.join(folder, "vllm.sock"))
    script = ScriptedUpstream()
    try:
        with LoopbackServer(script.app, sock=sock) as server:
            yield RunningUpstream(script, server)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def make_proxy(upstream: RunningUpstream) -> Iterator[Callable[..., RunningProxy]]:
    started: list[RunningProxy] = []

    def make(*, environ: dict[str, str] | None = None, **overrides: Any) -> RunningProxy:
        overrides.setdefault("upstreams", [{"name": "scripted", "base_url": upstream.base_url}])
        settings = Settings(**overrides)
        app = create_app(settings, environ=environ if environ is not None else {})
        running = RunningProxy(LoopbackServer(app).start(), settings, app)
        started.append(running)
        return running

    yield make
    for running in started:
        running.close()


@pytest.fixture
def proxy(make_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    return make_proxy()
