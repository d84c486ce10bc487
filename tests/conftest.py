"""Suite-wide set-up: missing real components skip, or fail under CI (tests/require.py); the proxy's
request log goes to a buffer; a real `redis-server` for the tests that need one."""

from __future__ import annotations

import io
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from proxy.logs import configure_logging
from proxy.testing import free_port, unused_socket
from tests.processes import stop_process
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


@dataclass
class RedisServer:
    """A `redis-server` this test run started on a loopback port, without persistence."""

    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self, *args: str) -> bytes:
        """Send one command (inline protocol) and return the raw reply line."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(" ".join(args).encode() + b"\r\n")
            return sock.recv(4096)


def _start_redis(
    binary: str, persistence: tuple[str, ...] = ("--appendonly", "no"), port: int | None = None
) -> RedisServer:
    last_error = ""
    # redis-server cannot bind port 0 and report it (`--port 0` turns TCP off), so a free port is
    # chosen here (unless `port` is given); one taken between choosing it and binding it is
    # chosen again.
    for _ in range(3):
        listen = port or free_port()
        options = ["--save", "", *persistence, "--port", str(listen), "--bind", "127.0.0.1"]
        process = subprocess.Popen(
            [binary, *options],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        server = RedisServer(listen, process)
        deadline = time.monotonic() + 60  # a safety net: a busy machine starts it late
        while process.poll() is None and time.monotonic() < deadline:
            try:
                if server.command("PING").startswith(b"+PONG"):
                    return server
            except OSError:
                time.sleep(0.02)
        _stop_redis(server)
        assert process.stdout is not None
        last_error = process.stdout.read().decode(errors="replace")[-2000:]
    raise RuntimeError(f"redis-server did not start: {last_error}")


def _stop_redis(server: RedisServer) -> None:
    stop_process(server.process, timeout=10)
    if server.process.stdout is not None:
        server.process.stdout.close()


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
    server = _start_redis(binary)
    try:
        yield server
    finally:
        _stop_redis(server)


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
        server = _start_redis(binary, persistence, port)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            _stop_redis(server)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The URL of an empty Redis database."""
    assert redis_server.command("FLUSHALL").startswith(b"+OK")
    return redis_server.url
