"""A `redis-server` for a benchmark: started on a free loopback port without persistence, read
for its CPU time and commands, and stopped after.

    with redis_server() as server:
        before = server.stats()
        ...                                   # the load
        spent = server.stats() - before       # commands run (scripts' included), CPU seconds
        with server.monitored() as sent:
            ...                               # sent[0]: the commands clients sent (MONITOR)
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from bench.processes import free_port


@dataclass(frozen=True)
class RedisStats:
    """What `INFO` says a server has done so far: commands run (those inside scripts included)
    and its CPU seconds (user + system, every thread)."""

    commands: int
    cpu_seconds: float

    def __sub__(self, other: RedisStats) -> RedisStats:
        return RedisStats(self.commands - other.commands, self.cpu_seconds - other.cpu_seconds)


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self, *args: str) -> bytes:
        """One command (inline protocol) on a connection of its own; its reply as sent, whole."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(" ".join(args).encode() + b"\r\n")
            reply = sock.recv(65536)
            head, _, rest = reply.partition(b"\r\n")
            if head.startswith(b"$") and int(head[1:]) >= 0:
                while len(rest) < int(head[1:]) + 2:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    rest += chunk
                return head + b"\r\n" + rest
            return reply

    def info(self, section: str) -> dict[str, str]:
        fields = {}
        for line in self.command("INFO", section).decode().splitlines():
            name, sep, value = line.partition(":")
            if sep:
                fields[name] = value
        return fields

    def stats(self) -> RedisStats:
        """Commands and CPU so far; the INFO commands reading them are not counted."""
        commands = 0
        for name, value in self.info("commandstats").items():
            if name.startswith("cmdstat_") and not name.startswith("cmdstat_info"):
                commands += int(value.split(",", 1)[0].removeprefix("calls="))
        cpu = self.info("cpu")
        return RedisStats(commands, float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]))

    @contextlib.contextmanager
    def monitored(self) -> Iterator[list[int]]:
        """Counts the commands clients send inside the block, from MONITOR (which lists each
        command a client sent and, tagged `lua`, each one a script ran): the yielded list holds
        the count once the block has ended."""
        lines: list[str] = []
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sock.sendall(b"MONITOR\r\n")
        if not sock.recv(16).startswith(b"+OK"):
            raise RuntimeError("MONITOR refused")
        stop = threading.Event()

        def read() -> None:
            pending = b""
            sock.settimeout(0.1)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    chunk = sock.recv(65536)
                    if not chunk:
                        return
                    pending += chunk
                    *done, pending = pending.split(b"\r\n")
                    lines.extend(line.decode(errors="replace") for line in done)

        reader = threading.Thread(target=read)
        reader.start()
        counted: list[int] = []
        try:
            yield counted
            self.command("ECHO", _END)  # the last line MONITOR will show
            deadline = time.monotonic() + 5
            while not any(_END in line for line in lines):
                if time.monotonic() > deadline:
                    raise RuntimeError("MONITOR did not show the end marker")
                time.sleep(0.01)
        finally:
            stop.set()
            reader.join()
            sock.close()
        counted.append(sum(1 for line in lines if " lua]" not in line and _END not in line))


_END = "monitor-end-marker"


@contextlib.contextmanager
def redis_server() -> Iterator[RedisServer]:
    """A `redis-server` on a free loopback port, stopped (by its pid) on leaving.

    Raises RuntimeError when redis-server is not installed or does not answer within 20 s.
    """
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
    port = free_port()
    options = ["--save", "", "--appendonly", "no", "--port", str(port), "--bind", "127.0.0.1"]
    process = subprocess.Popen(
        [binary, *options], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    server = RedisServer(port, process)
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError):
                if server.command("PING").startswith(b"+PONG"):
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {port}")
            time.sleep(0.02)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
