"""The targets bench.overhead measures and how each is started: the fake upstream (`direct`),
toolsentry as shipped (with shadowing, or from a baseline checkout), the pass-throughs and LiteLLM."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from bench.bodies import WORKLOADS, Workload, request_body
from bench.drivers import HIGH_CONCURRENCY
from bench.fake_upstream import MODEL
from bench.processes import ROOT, Placement, Server, free_port, pinned, start, wait_ready
from bench.tables import console

LITELLM_VENV = Path.home() / ".cache" / "toolsentry" / "litellm"
SHADOW = "toolsentry-shadow"
TARGETS = ("direct", "toolsentry", SHADOW, "pass-aiohttp", "pass-httpx", "litellm")
BASELINE = "toolsentry-baseline"

CHAT_ONLY = frozenset({BASELINE, SHADOW, "pass-httpx", "litellm"})
"""Targets measured on the small chat workload only (the commit before the refactor served chat
completions alone; the others are comparisons of the chat path)."""


def ensure_litellm(venv: Path) -> tuple[Path | None, str]:
    """LiteLLM's proxy in its own virtualenv, installed on first use; (executable, version or why not)."""
    exe = venv / "bin" / "litellm"
    python = venv / "bin" / "python"
    if not exe.exists():
        console.print(f"installing litellm[proxy] into {venv} (once; a few minutes) …")
        try:
            if not python.exists():
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "litellm[proxy]"],
                check=True,
                timeout=900,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        except (subprocess.SubprocessError, OSError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            return None, f"pip install 'litellm[proxy]' failed: {exc} {detail[-300:]!r}"
    version = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return (exe, version) if exe.exists() else (None, "no litellm executable after install")


def litellm_config(workdir: Path, upstream: str) -> Path:
    path = workdir / "litellm.yaml"
    path.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {upstream}\n"
        "      api_key: bench-key\n"
        "litellm_settings:\n"
        "  set_verbose: false\n"
        "  telemetry: false\n"
        "  drop_params: true\n"
    )
    return path


Commands = dict[str, tuple[list[str], dict[str, str]]]
"""By target: the command line that serves it and its environment."""


def commands_of(
    wanted: list[str],
    port: dict[str, int],
    upstream_port: int,
    workdir: Path,
    notes: dict[str, str],
) -> Commands:
    """How to start each wanted proxy in front of the fake upstream on `upstream_port`; a target
    that cannot be started (LiteLLM failing to install) gets a note instead."""
    python = sys.executable
    upstream_base = f"http://127.0.0.1:{upstream_port}/v1"
    commands: Commands = {}
    for name in ("toolsentry", BASELINE, SHADOW):
        if name in wanted:
            commands[name] = (
                [
                    python,
                    "-m",
                    "proxy.cli",
                    "serve",
                    "--upstream",
                    upstream_base,
                    "--port",
                    str(port[name]),
                ],
                # Every request shadowed (room for c64 in flight, so none is dropped); the
                # reference is the fake upstream itself (a fast one, named after its
                # address), so the copy costs the proxy, not a model.
                {
                    "TOOLSENTRY_SHADOW_REFERENCE": f"127.0.0.1:{upstream_port}",
                    "TOOLSENTRY_SHADOW_SAMPLE": "1.0",
                    "TOOLSENTRY_SHADOW_MAX_IN_FLIGHT": str(2 * HIGH_CONCURRENCY),
                }
                if name == SHADOW
                else {},
            )
    for client in ("aiohttp", "httpx"):
        if f"pass-{client}" in wanted:
            commands[f"pass-{client}"] = (
                [
                    python,
                    "-m",
                    "bench.passthrough",
                    "--client",
                    client,
                    "--upstream",
                    upstream_base,
                    "--port",
                    str(port[f"pass-{client}"]),
                ],
                {},
            )
    if "litellm" in wanted:
        exe, version = ensure_litellm(LITELLM_VENV)
        if exe is None:
            notes["litellm"] = f"skipped: {version}"
        else:
            notes["litellm"] = f"LiteLLM {version}"
            config = litellm_config(workdir, upstream_base)
            commands["litellm"] = litellm_command(exe, config, port["litellm"], 1)
    return commands


def litellm_command(
    exe: Path, config: Path, port: int, workers: int
) -> tuple[list[str], dict[str, str]]:
    """LiteLLM's proxy with `config` on `port`, `workers` processes: its command and environment."""
    argv = [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    return [*argv, "--num_workers", str(workers)], {
        "LITELLM_LOG": "ERROR",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        # No master key: LiteLLM then skips key checks, as toolsentry does here.
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
    }


@contextlib.contextmanager
def servers(
    wanted: list[str],
    workdir: Path,
    placement: Placement,
    upstream_port: int,
    checkouts: dict[str, Path] | None = None,
) -> Iterator[tuple[dict[str, Server], dict[str, str]]]:
    """Start the upstream and every wanted proxy; yield the running ones and skip notes."""
    route = WORKLOADS["chat"].route  # every target serves it: the readiness check
    checkouts = checkouts or {}
    running: dict[str, Server] = {}
    notes: dict[str, str] = {}
    started: list[Server] = []
    try:
        upstream = start(
            "upstream",
            pinned(
                placement.upstream,
                [sys.executable, "-m", "bench.fake_upstream", "--port", str(upstream_port)],
            ),
            upstream_port,
            route,
            workdir,
        )
        started.append(upstream)
        why = wait_ready(upstream, request_body(), 20)
        if why:
            raise RuntimeError(f"the fake upstream did not start: {why}")
        running["direct"] = Server(
            "direct", upstream_port, route, upstream.process, upstream.log, False
        )
        port = {name: free_port() for name in [*wanted, BASELINE]}
        commands = commands_of(wanted, port, upstream_port, workdir, notes)
        for name, (argv, env) in commands.items():
            cwd = checkouts.get(name, ROOT)
            server = start(
                name,
                pinned(placement.proxy, argv),
                port[name],
                route,
                workdir,
                env,
                cwd,
            )
            started.append(server)
        for server in started[1:]:
            why = wait_ready(server, request_body(), 120 if server.name == "litellm" else 30)
            if why:
                notes[server.name] = f"skipped: did not start ({why})"
                server.stop()
            else:
                running[server.name] = server
                server.pause()
        yield running, notes
    finally:
        for server in started:
            server.stop()


def targets_of(workload: Workload, wanted: list[str]) -> list[str]:
    """The wanted targets measured on `workload`."""
    return [t for t in wanted if workload.name == "chat" or t not in CHAT_ONLY]
