"""A real forward proxy for the tests: Debian's `tinyproxy`, started per test on a loopback port
with a generated configuration (plain requests and `CONNECT`, optionally Basic credentials), and
its log, which shows each request it forwarded."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from proxy.testing import free_port
from tests.processes import stop_process

MISSING = (
    "tinyproxy is not installed: install Debian's package tinyproxy (apt-get install tinyproxy) "
    "to run the forward proxy tests"
)
"""Why the forward proxy tests cannot run when `BINARY` is None."""

BINARY = shutil.which("tinyproxy")


@dataclass(frozen=True)
class Tinyproxy:
    """A running tinyproxy: its port, the credentials it asks for (None: none), its log."""

    port: int
    credentials: tuple[str, str] | None
    log_path: Path

    @property
    def url(self) -> str:
        """The proxy's URL, with its credentials when it asks for them."""
        if self.credentials is None:
            return f"http://127.0.0.1:{self.port}"
        user, password = self.credentials
        return f"http://{user}:{password}@127.0.0.1:{self.port}"

    @property
    def bare_url(self) -> str:
        """The proxy's URL without credentials."""
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _config(port: int, log: Path, credentials: tuple[str, str] | None) -> str:
    lines = [
        f"Port {port}",
        "Listen 127.0.0.1",
        "Timeout 30",
        f'LogFile "{log}"',
        "LogLevel Connect",  # one line per request: `Request (file descriptor N): POST http://…`
        "MaxClients 16",
        "Allow 127.0.0.1",
        # No ConnectPort line: CONNECT is allowed to every port (the upstreams' are random).
    ]
    if credentials is not None:
        lines.append("BasicAuth {} {}".format(*credentials))
    return "\n".join(lines) + "\n"


@contextmanager
def tinyproxy(directory: Path, credentials: tuple[str, str] | None = None) -> Iterator[Tinyproxy]:
    """A tinyproxy on a free loopback port for the block, ended by its pid on the way out.
    Raises RuntimeError, with its output, when it does not listen within a minute."""
    assert BINARY is not None, MISSING
    # tinyproxy binds the port it is given; one taken between choosing and binding is chosen again.
    output = directory / "tinyproxy.out"
    for _ in range(3):
        port = free_port()
        log = directory / f"tinyproxy-{port}.log"
        config = directory / f"tinyproxy-{port}.conf"
        config.write_text(_config(port, log, credentials))
        with output.open("ab") as out:
            process = subprocess.Popen(
                [BINARY, "-d", "-c", str(config)], stdout=out, stderr=subprocess.STDOUT
            )
        try:
            if _listening(process, port):
                yield Tinyproxy(port, credentials, log)
                return
        finally:
            stop_process(process, timeout=10)
    raise RuntimeError(f"tinyproxy did not start: {output.read_text(errors='replace')[-2000:]}")


def _listening(process: subprocess.Popen[bytes], port: int) -> bool:
    deadline = time.monotonic() + 60  # a safety net: a busy machine starts it late
    while process.poll() is None and time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.02)
    return False
