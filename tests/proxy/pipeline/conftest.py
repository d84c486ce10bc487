"""The pipeline of an app over a scripted upstream on loopback, for the tests of the turn and of
its gate (`make_pipeline`); `script` is the upstream and its base URL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from proxy.app import create_app
from proxy.config import Settings
from proxy.pipeline.gate import Pipeline
from proxy.testing import LoopbackServer, ScriptedUpstream


@pytest.fixture
def script() -> Iterator[tuple[ScriptedUpstream, str]]:
    upstream = ScriptedUpstream()
    with LoopbackServer(upstream.app) as server:
        yield upstream, f"{server.url}/v1"


@pytest.fixture
async def make_pipeline(
    script: tuple[ScriptedUpstream, str],
) -> AsyncIterator[Callable[..., Pipeline]]:
    made: list[Pipeline] = []

    def make(**overrides: Any) -> Pipeline:
        overrides.setdefault("upstreams", [{"name": "scripted", "base_url": script[1]}])
        pipeline: Pipeline = create_app(Settings(**overrides), environ={}).state.pipeline
        made.append(pipeline)
        return pipeline

    yield make
    for pipeline in made:
        await pipeline.router.close()
