"""The benchmarks' processes: free loopback ports, CPU placement (`taskset`), a server started in
its own process group so that it can be paused, resumed, timed (CPU) and stopped, `toolsentry
serve` started and waited for, the vLLM server scripts/vllm-cpu runs (found by `scripts.vllm_cpu`),
and a baseline checkout."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from scripts.vllm_cpu import find_vllm as find_vllm  # bench.repair finds the vLLM it measures

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 20) -> None:
    """Return once something listens on 127.0.0.1:`port`; raise RuntimeError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


@dataclass
class Placement:
    """Which CPU each role runs on (taskset lists)."""

    upstream: str
    proxy: str
    load: str

    @classmethod
    def for_machine(cls) -> Placement:
        if (os.cpu_count() or 1) >= 2:
            return cls(upstream="0", proxy="1", load="0")
        return cls(upstream="0", proxy="0", load="0")

    def describe(self) -> str:
        return f"upstream on CPU {self.upstream}, proxy under test on CPU {self.proxy}, load generator (wrk, ttft) on CPU {self.load}"


def pinned(cpus: str, argv: list[str]) -> list[str]:
    return ["taskset", "-c", cpus, *argv] if shutil.which("taskset") else argv


@dataclass
class Server:
    """A process started for the benchmark, in its own process group (so it can be paused)."""

    name: str
    port: int
    path: str
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    pausable: bool = True  # not the upstream: every target needs it

    @property
    def url(self) -> str:
        return self.url_for(self.path)

    def url_for(self, route: str) -> str:
        return f"http://127.0.0.1:{self.port}{route}"

    def signal(self, sig: signal.Signals) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, sig)

    def pause(self) -> None:
        if self.pausable:
            self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.pausable:
            self.signal(signal.SIGCONT)

    def cpu_seconds(self) -> float | None:
        """User + system CPU time of every process in this server's group so far (Linux)."""
        if self.process is None:
            return None
        ticks = 0
        tick = os.sysconf("SC_CLK_TCK")
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == self.process.pid:  # field 5, pgrp
                    ticks += int(fields[11]) + int(fields[12])  # fields 14, 15: utime, stime
        return ticks / tick

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait()


def start(
    name: str,
    argv: list[str],
    port: int,
    path: str,
    workdir: Path,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> Server:
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    return Server(name, port, path, process, log)


def wait_ready(server: Server, body: bytes, timeout: float) -> str | None:
    """Poll with the benchmark's request until it answers 200; return why not, or None."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if server.process is not None and server.process.poll() is not None:
            return f"exited with {server.process.returncode}: {tail(server.log)}"
        request = urllib.request.Request(
            server.url, data=body, headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return None
                last = f"status {response.status}"
        except urllib.error.HTTPError as exc:
            last = f"status {exc.code}: {exc.read()[:300]!r}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    return f"not ready after {timeout:.0f} s ({last}): {tail(server.log)}"


def tail(log: Path | None, lines: int = 5) -> str:
    if log is None or not log.exists():
        return ""
    return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])


def baseline_checkout(given: str, workdir: Path) -> Path:
    """`--baseline`: a directory as it is, else a commit whose `proxy/` is extracted (git
    archive) into the run's temporary directory."""
    path = Path(given)
    if path.is_dir():
        return path
    target = workdir / "baseline"
    target.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", given, "proxy"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise SystemExit(
            f"--baseline {given}: neither a directory nor a commit: {archive.stderr!r}"
        )
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


@contextlib.contextmanager
def toolsentry(
    args: list[str], workdir: Path, *, env: Mapping[str, str] | None = None, timeout: float = 120
) -> Iterator[str]:
    """`toolsentry serve` with `args` (its upstream or config) on a free loopback port, its log in
    `workdir`; yields its root URL (no /v1) once `/readyz` answers 200, and stops it after.

    Raises RuntimeError, with the log's tail, when it exits or is not ready within `timeout` s.
    """
    port = free_port()
    argv = [sys.executable, "-m", "proxy.cli", "serve", *args, "--host", "127.0.0.1"]
    server = start("proxy", [*argv, "--port", str(port)], port, "/readyz", workdir, dict(env or {}))
    try:
        deadline = time.monotonic() + timeout
        while True:
            if server.process is not None and server.process.poll() is not None:
                code = server.process.returncode
                raise RuntimeError(f"the proxy exited with {code}: {tail(server.log, 20)}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(server.url, timeout=5) as response,
            ):
                if response.status == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the proxy was not ready in {timeout:.0f} s: {tail(server.log, 20)}"
                )
            time.sleep(0.2)
        yield server.url_for("")
    finally:
        server.stop()
