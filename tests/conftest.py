"""Suite-wide set-up: the proxy's request log goes to a buffer, not the test output."""

from __future__ import annotations

import io

import pytest
from hypothesis import HealthCheck, settings

from proxy.logs import configure_logging


@pytest.fixture(autouse=True, scope="session")
def _quiet_logs() -> None:
    configure_logging("warning", stream=io.StringIO())


# Example counts stay as each test sets them; what changes is that a loaded machine (CI shares its
# two cores with a vLLM server) can neither fail a test by drawing inputs slowly nor by a deadline.
settings.register_profile("toolsentry", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("toolsentry")
