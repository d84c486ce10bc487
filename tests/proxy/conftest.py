"""Fixtures that start real servers on loopback: a scripted upstream and the proxy in front of it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from proxy.app import create_app
from proxy.config import Settings
from proxy.testing import LoopbackServer, ScriptedUpstream


@dataclass
class RunningUpstream:
    script: ScriptedUpstream
    server: LoopbackServer

    @property
    def base_url(self) -> str:
        return f"{self.server.url}/v1"


@dataclass
class RunningProxy:
    server: LoopbackServer
    settings: Settings
    app: Any

    @property
    def base_url(self) -> str:
        return f"{self.server.url}/v1"

    def client(self, **kwargs: Any) -> openai.OpenAI:
        kwargs.setdefault("api_key", "test-key")
        kwargs.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=self.base_url, **kwargs)

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
def upstream() -> Iterator[RunningUpstream]:
    script = ScriptedUpstream()
    with LoopbackServer(script.app) as server:
        yield RunningUpstream(script, server)


@pytest.fixture
def make_proxy(upstream: RunningUpstream) -> Iterator[Callable[..., RunningProxy]]:
    started: list[LoopbackServer] = []

    def make(**overrides: Any) -> RunningProxy:
        overrides.setdefault("upstreams", [{"name": "scripted", "base_url": upstream.base_url}])
        settings = Settings(**overrides)
        app = create_app(settings)
        server = LoopbackServer(app).start()
        started.append(server)
        return RunningProxy(server, settings, app)

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def proxy(make_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    return make_proxy()
