"""Support for whole-proxy tests: proxy processes started as a user would, load with exact
bookkeeping."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from proxy.headers import ERRORS_HEADER
from tests.processes import ServerNotStarted, port_options, reported_port, stop_process, tail
from tests.proxy.builders import make_request

REPO = Path(__file__).resolve().parents[3]


class ProxyProcess:
    """`python -m proxy.cli serve …` as a child process on loopback: on the port it binds and
    reports (`--port 0 --port-file`), or on `port` (a restart on the port a stopped one had)."""

    def __init__(self, upstream_url: str, log: Path, *args: str, port: int | None = None) -> None:
        self._port = port
        self.log_path = log
        self._port_file = log.with_name(log.name + ".port")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLSENTRY_")}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        self._log = log.open("ab")
        command = [sys.executable, "-m", "proxy.cli", "serve", "--upstream", upstream_url]
        where = ["--port", str(port)] if port else port_options(self._port_file)
        self.process = subprocess.Popen(
            [*command, *where, *args],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def port(self) -> int:
        """The port it listens on (waits for the report, once)."""
        if self._port is None:
            try:
                self._port = reported_port(self.process, self._port_file, tail(self.log_path))
            except ServerNotStarted:
                self.stop()
                raise
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 60) -> ProxyProcess:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"proxy did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.1)

    def worker_metric_files(self) -> list[str]:
        """The files the worker processes keep their metrics in (multiprocess mode).

        The CLI gives the workers the directory in their environment; each worker's files are
        named after its pid, so the list shows which workers served anything.
        """
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        files: set[str] = set()
        for pid in children.read_text().split():
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:  # gone since the listing
                continue
            for entry in environ:
                if entry.startswith(b"PROMETHEUS_MULTIPROC_DIR="):
                    files.update(os.listdir(entry.split(b"=", 1)[1].decode()))
        return sorted(files)

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def session(self, session: str) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/v1/sessions/{session}", timeout=10)
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self._log.close()

    def stop(self) -> None:
        stop_process(self.process, timeout=30)
        self._log.close()


@dataclass
class Outcome:
    """One request's fate. `sent` and `received` are positions in one global order of events,
    so `a.received < b.sent` means b left the client after a's answer had arrived."""

    status: int
    errors: int | None
    sent: int
    received: int
    body: bytes


async def fire(
    urls: Sequence[str],
    count: int,
    *,
    concurrency: int,
    session: str,
    headers: dict[str, str] | None = None,
    request_timeout: float = 60,
) -> list[Outcome]:
    """Send `count` chat requests of one session, spread round-robin over `urls`, at most
    `concurrency` at a time; return every outcome. Transport errors are status 0.

    Each request opens its own connection: worker processes that share one listening socket
    then each get a share (kept-alive connections would all stay with whichever accepted first).
    """
    order = itertools.count()
    gate = asyncio.Semaphore(concurrency)
    body = make_request()
    sent_headers = {"x-session-id": session, **(headers or {})}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)

    async def one(client: httpx.AsyncClient, url: str) -> Outcome:
        async with gate:
            sent = next(order)
            try:
                response = await client.post(
                    f"{url}/v1/chat/completions", json=body, headers=sent_headers
                )
            except httpx.TransportError:
                return Outcome(0, None, sent, next(order), b"")
            received = next(order)
            raw_errors = response.headers.get(ERRORS_HEADER)
            errors = int(raw_errors) if raw_errors is not None else None
            return Outcome(response.status_code, errors, sent, received, response.content)

    async with httpx.AsyncClient(timeout=request_timeout, limits=limits) as client:
        return await asyncio.gather(*(one(client, urls[i % len(urls)]) for i in range(count)))
