"""One recording upstream under uvicorn and one `toolsentry serve` in front of it, per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from proxy.testing import LoopbackServer
from tests.proxy.security.support import Proxy, RecordingUpstream


@pytest.fixture(scope="module")
def recorder() -> Iterator[tuple[RecordingUpstream, LoopbackServer]]:
    upstream = RecordingUpstream()
    with LoopbackServer(upstream) as server:
        yield upstream, server


@pytest.fixture(scope="module")
def edge(
    recorder: tuple[RecordingUpstream, LoopbackServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proxy]:
    proxy = Proxy(recorder[1].url, tmp_path_factory.mktemp("edge"), repair="off")
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def upstream(recorder: tuple[RecordingUpstream, LoopbackServer]) -> RecordingUpstream:
    """The recording upstream, emptied for the test."""
    recorder[0].clear()
    return recorder[0]
