"""One scripted upstream on loopback per module; each test rescripts it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from proxy.testing import LoopbackServer, ScriptedUpstream


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[ScriptedUpstream, str]]:
    """The scripted upstream and its root URL."""
    upstream = ScriptedUpstream()
    with LoopbackServer(upstream.app) as server:
        yield upstream, server.url
