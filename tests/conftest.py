"""Suite-wide set-up: the proxy's request log goes to a buffer, not the test output."""

from __future__ import annotations

import io

import pytest

from proxy.logs import configure_logging


@pytest.fixture(autouse=True, scope="session")
def _quiet_logs() -> None:
    configure_logging("warning", stream=io.StringIO())
