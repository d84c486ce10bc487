"""The proxy installs and runs alone: the Dockerfile's own install step in a clean virtual
environment gives a working `toolsentry serve` without evalkit's dependencies, and importing the
proxy loads none of them."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

import httpx
import pytest

from tests.processes import port_options, reported_port, tail

REPO = Path(__file__).resolve().parents[1]
DOCKERFILES = [REPO / "Dockerfile", REPO / "examples" / "Dockerfile"]

# What `pip install toolsentry` must not bring or load: evalkit's own dependencies.
EVALKIT_ONLY = ("anthropic", "matplotlib", "numpy", "openai")
# Of uvicorn's `standard` extra the proxy uses these, and not the others.
UVICORN_USED = ("httptools", "uvloop")
UVICORN_UNUSED = ("watchfiles", "websockets")


def install_step(dockerfile: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """The files a Dockerfile copies before installing, and the arguments of its `pip install`.

    Returns ([(source, destination), ...], ["install", ...]); raises ValueError when the
    Dockerfile has no `RUN pip install`.
    """
    copies: list[tuple[str, str]] = []
    text = dockerfile.read_text(encoding="utf-8").replace("\\\n", " ")
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["COPY"]:
            *sources, destination = words[1:]
            copies += [(source, destination) for source in sources]
        elif words[:3] == ["RUN", "pip", "install"]:
            command = words[1 : words.index("&&")] if "&&" in words else words[1:]
            return copies, command[1:]
    raise ValueError(f"{dockerfile} has no `RUN pip install` step")


def test_both_dockerfiles_install_the_proxy_alone_the_same_way() -> None:
    steps = [install_step(path) for path in DOCKERFILES]
    assert steps[0] == steps[1]
    copies, arguments = steps[0]
    assert sorted(source for source, _ in copies) == ["README.md", "proxy", "pyproject.toml"]
    assert not any("evalkit" in argument for argument in arguments)


def test_importing_the_proxy_loads_no_evalkit_dependency() -> None:
    # Every module of the package, in a fresh interpreter: the test run has evalkit loaded.
    probe = (
        "import importlib, json, pkgutil, sys, proxy\n"
        "for m in pkgutil.walk_packages(proxy.__path__, 'proxy.'):\n"
        "    importlib.import_module(m.name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    loaded = set(json.loads(result.stdout))
    assert "proxy.app" in loaded
    assert "proxy.cli" in loaded
    assert loaded.isdisjoint({"evalkit", *EVALKIT_ONLY}), sorted(
        m for m in loaded if m.split(".")[0] in {"evalkit", *EVALKIT_ONLY}
    )


def _serve_until_ready(toolsentry: Path, log: Path) -> None:
    port_file = log.with_suffix(".port")
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(toolsentry), "serve", "--upstream", "http://127.0.0.1:9/v1",
             *port_options(port_file)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        port = reported_port(process, port_file, tail(log))
        deadline = time.monotonic() + 60
        while True:
            try:
                reply = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.TransportError:
                pass
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "toolsentry serve did not answer in 60 s"
            time.sleep(0.2)
        assert reply.status_code == 200, reply.text
    finally:
        process.terminate()
        process.wait(timeout=30)


IMAGE_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
"""The environment of the image's commands: a PYTHONPATH inherited from whoever runs the suite
would put this checkout's packages in reach and hide what the install step left out."""


@pytest.mark.slow
def test_the_dockerfile_install_step_gives_a_working_proxy_without_evalkit_dependencies(
    tmp_path: Path,
) -> None:
    copies, arguments = install_step(REPO / "Dockerfile")
    context = tmp_path / "app"
    context.mkdir()
    for source, _ in copies:
        origin = REPO / source
        if origin.is_dir():
            shutil.copytree(origin, context / source, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, context / source)
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    # The image has no pip cache to use; this machine's keeps the test from downloading it all.
    install = [a for a in arguments if a != "--no-cache-dir"]
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *install],
        cwd=context,
        check=True,
        timeout=900,
        env=IMAGE_ENV,
    )
    found = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util, json, sys; "
            "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m)]))",
            "evalkit",
            *EVALKIT_ONLY,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=IMAGE_ENV,
    )
    assert json.loads(found.stdout) == []
    # uvicorn without its `standard` extra: its parser and loop, not its reloader or websockets.
    present = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util, json, sys; "
            "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m)]))",
            *UVICORN_USED,
            *UVICORN_UNUSED,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=IMAGE_ENV,
    )
    assert json.loads(present.stdout) == list(UVICORN_USED)
    _serve_until_ready(environment / "bin" / "toolsentry", tmp_path / "serve.log")


def test_evalkit_without_its_dependencies_says_what_to_install() -> None:
    # The slim install has no numpy: an import of it fails as it would there.
    probe = (
        "import runpy, sys\n"
        "sys.modules['numpy'] = None\n"
        "sys.argv = ['evalkit', '--help']\n"
        "runpy.run_module('evalkit.cli', run_name='__main__')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "evalkit needs its dependencies (numpy is missing): pip install 'toolsentry[evalkit]'"
    ]
