"""Suite-wide set-up: missing real components skip, or fail under CI (tests/require.py); the proxy's
request log goes to a buffer; a real `redis-server` for the tests that need one."""

from __future__ import annotations

import io
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from bench.redisserver import RedisServer, start_redis, stop_redis
from proxy.logs import configure_logging
from proxy.testing import unused_socket
from tests.require import in_ci, require

pytest_plugins = ("tests.require",)

REDIS_MISSING = (
    "redis-server is not installed: install Debian's package redis-server "
    "(apt-get install redis-server) to run the Redis store tests"
)


@pytest.fixture(autouse=True, scope="session")
def _quiet_logs() -> None:
    configure_logging("warning", stream=io.StringIO())


# Example counts stay as each test sets them; what changes is that a loaded machine (CI shares its
# two cores with a vLLM server) can neither fail a test by drawing inputs slowly nor by a deadline.
# Under CI a failing example is printed with its `@reproduce_failure` blob, and .ci/run prints the
# run's seed (make test HYPOTHESIS_SEED=N replays it).
settings.register_profile(
    "toolsentry",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=in_ci(),
)
settings.load_profile("toolsentry")


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections for the whole test: bound, never listening, so
    no other server can take it meanwhile."""
    with unused_socket() as sock:
        yield sock.getsockname()[1]


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One `redis-server` for the whole run; skips (naming the package) when it is missing."""
    binary = shutil.which("redis-server")
    if binary is None:
        require("redis", REDIS_MISSING)
    server = start_redis(binary)
    try:
        yield server
    finally:
        stop_redis(server)


@pytest.fixture
def durable_redis(tmp_path: Path) -> Iterator[Callable[[int | None], RedisServer]]:
    """Starts `redis-server`s that keep every write they acknowledged (an append-only file in
    the test's directory, fsync'd at each write), so that one killed with SIGKILL and started
    again on its port (`start(port)`) has its data; each is stopped at the test's end."""
    binary = shutil.which("redis-server")
    if binary is None:
        require("redis", REDIS_MISSING)
    started: list[RedisServer] = []
    persistence = ("--appendonly", "yes", "--appendfsync", "always", "--dir", str(tmp_path))

    def start(port: int | None = None) -> RedisServer:
        server = start_redis(binary, persistence, port)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            stop_redis(server)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The URL of an empty Redis database."""
    assert redis_server.command("FLUSHALL").startswith(b"+OK")
    return redis_server.url
