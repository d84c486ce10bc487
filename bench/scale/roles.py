"""Where each role of bench.scale runs and the processes it starts: the CPUs of the upstream,
the load generator, redis-server and the proxy, the points measured, and the servers of each."""

from __future__ import annotations

import contextlib
import shutil
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.drivers import KeepAlive
from bench.overhead.targets import LITELLM_VENV, litellm_command, litellm_config
from bench.processes import Server, free_port, pinned, start, wait_port, wait_ready

ROUTE = "/v1/chat/completions"

# -- placement ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Roles:
    """The CPUs of each role; `shared` when the machine is too small to give each its own."""

    upstream: tuple[int, ...]
    load: tuple[int, ...]
    redis: tuple[int, ...]
    proxy: tuple[int, ...]
    every: tuple[int, ...]
    shared: bool

    def proxy_cpus(self, workers: int) -> tuple[int, ...]:
        """The CPUs a proxy of `workers` processes is pinned to: one each while the proxy's own
        CPUs last, else every CPU (a small machine's largest count)."""
        return self.proxy[:workers] if workers <= len(self.proxy) else self.every

    def worker_counts(self) -> list[int]:
        """1, 2, 4, … up to the proxy's CPUs; on a small machine also one per CPU."""
        counts = [1 << i for i in range(len(self.proxy).bit_length()) if 1 << i <= len(self.proxy)]
        if self.shared and len(self.every) > counts[-1]:
            counts.append(len(self.every))
        return counts

    def describe(self) -> str:
        text = (
            f"upstream on CPUs {cpus(self.upstream)}, load generator on {cpus(self.load)}, "
            f"redis-server on {cpus(self.redis)}, the proxy on {cpus(self.proxy)}"
        )
        if self.shared:
            text += (
                f" (too few CPUs to give each role its own: the largest worker count runs on "
                f"every CPU, {cpus(self.every)}, beside the other roles)"
            )
        return text


def roles_of(available: Sequence[int]) -> Roles:
    """Place the roles on `available` CPUs (see the module's docstring)."""
    every = tuple(sorted(available))
    n = len(every)
    if n >= 8:
        u, g = n // 4, max(1, n // 8)
        return Roles(
            every[:u], every[u : u + g], every[u + g : u + g + 1], every[u + g + 1 :], every, False
        )
    return Roles(every[:1], every[:1], every[:1], every[1:] or every, every, True)


def cpus(ids: Sequence[int]) -> str:
    return ",".join(str(i) for i in ids)


# -- what is measured -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One row of the closed-loop table."""

    target: str  # direct, pass-aiohttp, toolsentry, litellm
    store: str = ""  # memory, sqlite, redis (toolsentry)
    workers: int = 0  # 0: not a proxy of workers

    @property
    def label(self) -> str:
        parts = [self.target, self.store, f"w{self.workers}" if self.workers else ""]
        return " ".join(p for p in parts if p)


def points_of(roles: Roles, stores: Sequence[str], litellm: bool, quick: bool) -> list[Point]:
    """Every point of a run, in the order measured."""
    counts = roles.worker_counts()
    if quick:
        counts = counts[:2]
    out = [Point("direct"), Point("pass-aiohttp", workers=1)]
    if "memory" in stores:
        out.append(Point("toolsentry", "memory", 1))  # workers > 1 need a shared store
    for store in ("sqlite", "redis"):
        if store in stores:
            out += [Point("toolsentry", store, w) for w in counts]
    if litellm:
        out += [Point("litellm", workers=w) for w in counts]
    return out


# -- the roles' processes -------------------------------------------------------------------------


class Redis:
    """A `redis-server` of the run's own, without persistence, on a free loopback port."""

    def __init__(self, roles: Roles, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed (scripts/system-deps)")
        self.port = free_port()
        argv = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no"]
        self.server = start("redis", pinned(cpus(roles.redis), argv), self.port, "", workdir)
        wait_port(self.port)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self, *words: str) -> bytes:
        """One command over a fresh connection; the raw reply (RESP)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
            parts = [f"${len(w.encode())}\r\n{w}\r\n" for w in words]
            sock.sendall(f"*{len(words)}\r\n{''.join(parts)}".encode())
            reply = b""
            while not reply.endswith(b"\r\n") or (reply[:1] == b"$" and reply.count(b"\r\n") < 2):
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                reply += chunk
            return reply

    def commands(self) -> int:
        """Commands run so far (`INFO commandstats`, scripts' own included), INFO not counted."""
        text = self.command("INFO", "commandstats").decode()
        total = 0
        for line in text.splitlines():
            if line.startswith("cmdstat_") and not line.startswith("cmdstat_info:"):
                total += int(line.split("calls=", 1)[1].split(",", 1)[0])
        return total

    def sent_per_request(self, proxy: Server, body: bytes, requests: int) -> float:
        """Commands the proxy itself sends a request (not those its scripts run): `MONITOR`
        while `requests` requests go one at a time."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as monitor:
            monitor.sendall(b"MONITOR\r\n")
            seen = monitor.recv(64)  # +OK
            client = KeepAlive(proxy.port, ROUTE, body)
            try:
                for _ in range(requests):
                    client.post()
            finally:
                client.close()
            time.sleep(0.2)
            monitor.settimeout(0.5)
            with contextlib.suppress(TimeoutError):
                while chunk := monitor.recv(1 << 20):
                    seen += chunk
        lines = seen.decode(errors="replace").splitlines()
        sent = [x for x in lines if x.startswith("+") and " [" in x and " lua]" not in x]
        return len(sent) / requests

    def flush(self) -> None:
        self.command("FLUSHALL")


@contextlib.contextmanager
def upstream(roles: Roles, workdir: Path, body: bytes) -> Iterator[Server]:
    """The canned upstream, one process per upstream CPU on one port."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.fake_upstream", "--port", str(port)]
    argv += ["--processes", str(len(roles.upstream))]
    server = start("upstream", pinned(cpus(roles.upstream), argv), port, ROUTE, workdir)
    try:
        why = wait_ready(server, body, 60)  # a loaded machine starts its processes slowly
        if why:
            raise RuntimeError(f"the fake upstream did not start: {why}")
        yield server
    finally:
        server.stop()


def proxy_command(
    point: Point, base: str, port: int, store: str
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that serve `point` in front of `base`."""
    python = sys.executable
    if point.target == "pass-aiohttp":
        argv = [python, "-m", "bench.passthrough", "--client", "aiohttp", "--upstream", base]
        return [*argv, "--port", str(port)], {}
    if point.target == "litellm":
        config = litellm_config(Path(store), base)  # `store` is the workdir here
        return litellm_command(LITELLM_VENV / "bin" / "litellm", config, port, point.workers)
    argv = [python, "-m", "proxy.cli", "serve", "--upstream", base, "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--workers", str(point.workers), "--store", store]
    return argv, {}


@contextlib.contextmanager
def serving(
    point: Point, roles: Roles, workdir: Path, base: str, redis: Redis | None, body: bytes
) -> Iterator[Server]:
    """The proxy of `point`, pinned to its CPUs, answering the body; stopped after."""
    store = {
        "memory": "memory",
        "sqlite": f"sqlite:///{workdir / f'sessions-w{point.workers}.db'}",
        "redis": redis.url if redis else "",
    }.get(point.store, str(workdir))
    if point.store == "redis" and redis is not None:
        redis.flush()
    port = free_port()
    argv, env = proxy_command(point, base, port, store)
    server = start(
        point.label.replace(" ", "-"),
        pinned(cpus(roles.proxy_cpus(point.workers)), argv),
        port,
        ROUTE,
        workdir,
        env,
    )
    try:
        why = wait_ready(server, body, 120 if point.target == "litellm" else 60)
        if why:
            raise RuntimeError(why)
        yield server
    finally:
        server.stop()
