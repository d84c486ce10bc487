"""The README's quickstarts run as written: every Python block that talks to the proxy, and the
session API call, against a real `toolsentry serve` (with an admin key, as a deployment has) in
front of the bundled simulator, which answers a request naming no task with a generic turn (it
calls the first declared tool, then closes on the tool's answer). Only the proxy's address is
changed, from the README's 127.0.0.1:8000 to the port the test's proxy took."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.processes import port_options, reported_port, stop_process, tail

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
ADDRESS = "http://127.0.0.1:8000"
ADMIN_KEY = "quickstart-admin-key"
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, flags=re.S)
PYTHON = [code for lang, code in BLOCKS if lang == "python" and ADDRESS in code]
CURLS = [
    line.split("  #")[0].strip()
    for lang, code in BLOCKS
    if lang in ("", "bash", "sh")
    for line in code.splitlines()
    if line.startswith("curl ") and ADDRESS in line
]
# What each Python quickstart prints when it works (the generic turn's call, or its closing).
EXPECTED = {
    "chat.completions": "cancel_pending_order",
    "Runner.run_sync": "order #W2378156 is delivered",
    "messages.create": "ToolUseBlock",
}


def started(
    command: list[str], name: str, directory: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], int]:
    log, port_file = directory / f"{name}.log", directory / f"{name}.port"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [*command, *port_options(port_file)], cwd=REPO, stdout=out, stderr=out, env=env
        )
    return process, reported_port(process, port_file, tail(log))


@pytest.fixture(scope="module")
def proxy_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("quickstart")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLSENTRY_", "OTEL_"))}
    sim, sim_port = started(
        [sys.executable, "-m", "evalkit.cli", "sim", "serve"], "sim", directory, env
    )
    try:
        upstream = f"http://127.0.0.1:{sim_port}/v1"
        proxy, port = started(
            [sys.executable, "-m", "proxy.cli", "serve", "--upstream", upstream],
            "proxy",
            directory,
            {**env, "TOOLSENTRY_ADMIN_KEY": ADMIN_KEY},
        )
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            stop_process(proxy, timeout=10)
    finally:
        stop_process(sim, timeout=10)


def test_the_readme_has_the_quickstarts_this_test_runs() -> None:
    assert len(PYTHON) == len(EXPECTED), "a quickstart was added or lost: name what it prints"
    assert all(any(call in code for code in PYTHON) for call in EXPECTED)
    assert CURLS, "the session API call is gone from the README"


@pytest.mark.parametrize("call", list(EXPECTED))
def test_each_python_quickstart_runs_as_written(proxy_url: str, call: str) -> None:
    (code,) = [code for code in PYTHON if call in code]
    ran = subprocess.run(
        [sys.executable, "-c", code.replace(ADDRESS, proxy_url)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert EXPECTED[call] in ran.stdout, ran.stdout


def test_the_session_api_call_runs_as_written_under_an_admin_key(proxy_url: str) -> None:
    test_each_python_quickstart_runs_as_written(proxy_url, "chat.completions")  # episode-42
    for command in CURLS:
        ran = subprocess.run(
            ["bash", "-c", command.replace(ADDRESS, proxy_url)],
            env={**os.environ, "TOOLSENTRY_ADMIN_KEY": ADMIN_KEY},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert ran.returncode == 0, ran.stderr
        listed = json.loads(ran.stdout)
        assert "episode-42" in json.dumps(listed), listed
