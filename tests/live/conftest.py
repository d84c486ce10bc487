"""Live tests: a real vLLM (started by scripts/vllm-cpu) behind a real toolsentry proxy subprocess.

`make test-vllm` runs them. The vLLM server is found with `scripts/vllm-cpu status`, or taken from
$TOOLSENTRY_VLLM_URL; without one every test here is skipped, with the commands that start it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import pytest

from scripts.vllm_cpu import find_vllm
from tests.processes import ServerNotStarted, port_options, reported_port, tail

ROOT = Path(__file__).resolve().parents[2]
START_HINT = (
    "start one with `scripts/vllm-cpu setup && scripts/vllm-cpu start` (or set TOOLSENTRY_VLLM_URL)"
)
SUMMARY = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def vllm_url() -> str:
    """The base URL of the running vLLM server, e.g. http://127.0.0.1:PORT/v1."""
    url, why = find_vllm()
    if url is None:
        pytest.skip(f"no vLLM server is running ({why}): {START_HINT}")
    try:
        httpx.get(f"{url}/models", timeout=10).raise_for_status()
    except httpx.HTTPError as exc:
        pytest.skip(f"the vLLM server at {url} does not answer ({exc}): {START_HINT}")
    return url


class ProxyNotReady(RuntimeError):
    """The proxy subprocess exited or did not answer /readyz in time; the message has its log."""


@contextlib.contextmanager
def running_proxy(
    upstream: str, log_path: Path, *args: str, env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """A `toolsentry serve` subprocess in front of `upstream` (…/v1), with extra command-line
    `args` and `env` over this process's environment; yields its root URL (no /v1).

    Raises ProxyNotReady when it exits or is not ready within 60 s.
    """
    port_file = log_path.with_name(log_path.name + ".port")
    command = [
        sys.executable, "-m", "proxy.cli", "serve", "--upstream", upstream,
        *port_options(port_file), "--host", "127.0.0.1", *args,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    try:
        try:
            port = reported_port(process, port_file, tail(log_path), timeout=60)
        except ServerNotStarted as exc:
            raise ProxyNotReady(str(exc)) from None
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise ProxyNotReady(
                    f"the proxy exited with {process.returncode} before it was ready:\n"
                    + log_path.read_text(errors="replace")[-3000:]
                )
            try:
                if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise ProxyNotReady(
                    "the proxy was not ready within 60 s:\n"
                    + log_path.read_text(errors="replace")[-3000:]
                )
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def proxy_url(vllm_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A toolsentry proxy subprocess in front of vLLM; yields its root URL (no /v1)."""
    # Look at the checkout itself: an editable install elsewhere could still resolve `proxy.cli`.
    if not (ROOT / "proxy" / "cli.py").is_file():
        pytest.skip(f"{ROOT / 'proxy' / 'cli.py'} does not exist, so there is no proxy to start")
    log_path = tmp_path_factory.mktemp("proxy") / "proxy.log"
    try:
        with running_proxy(vllm_url, log_path) as url:
            yield url
    except ProxyNotReady as exc:
        pytest.fail(str(exc))


@pytest.fixture
def summary(request: pytest.FixtureRequest) -> list[str]:
    """Lines a test wants printed at the end of the run (per-channel counts, repair outcomes)."""
    return request.config.stash.setdefault(SUMMARY, [])


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    lines = config.stash.get(SUMMARY, [])
    if lines:
        terminalreporter.section("toolsentry over a real vLLM")
        for line in lines:
            terminalreporter.write_line(line)
