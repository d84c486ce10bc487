"""The proxy installs and runs alone: the Dockerfile's own install steps (its hashed lock, then the
project) in a clean virtual environment give a working, health-checked `toolsentry serve` without
evalkit's dependencies, importing the proxy loads none of them, and the slim install's `evalkit`
command says in one line what to install."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import venv
from pathlib import Path

import httpx
import pytest

from tests.dockerfiles import DOCKERFILES, REPO, health_check, install_steps
from tests.processes import port_options, reported_port, tail

# What `pip install toolsentry` must not bring or load: evalkit's own dependencies.
EVALKIT_ONLY = ("anthropic", "matplotlib", "numpy", "openai")
# Of uvicorn's `standard` extra the proxy uses these, and not the others.
UVICORN_USED = ("httptools", "uvloop")
UVICORN_UNUSED = ("watchfiles", "websockets")


def test_both_dockerfiles_install_the_proxy_alone_the_same_way() -> None:
    steps = [install_steps(path) for path in DOCKERFILES]
    assert steps[0] == steps[1]
    copies = steps[0][-1].copies
    assert sorted(source for source, _ in copies) == [
        "README.md",
        "proxy",
        "pyproject.toml",
        "requirements/docker.lock",
    ]
    assert not any("evalkit" in argument for step in steps[0] for argument in step.arguments)


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


def _serve_until_ready(toolsentry: Path, log: Path, health_check: list[str]) -> None:
    """Serve with `toolsentry` until /healthz answers; the image's health check passes while it
    serves and fails once it has stopped."""
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
        assert _health(health_check, port) == 0
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert _health(health_check, port) != 0


def _health(command: list[str], port: int) -> int:
    """The exit status of the image's health check against the proxy on `port`."""
    environment = IMAGE_ENV | {"TOOLSENTRY_PORT": str(port)}
    return subprocess.run(command, env=environment, capture_output=True, timeout=60).returncode


IMAGE_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
"""The environment of the image's commands: a PYTHONPATH inherited from whoever runs the suite
would put this checkout's packages in reach and hide what the install step left out."""


def _copy(sources: list[str], context: Path) -> None:
    for source in sources:
        origin, target = REPO / source, context / source
        target.parent.mkdir(parents=True, exist_ok=True)
        if origin.is_dir():
            shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, target)


def _pip_install(python: Path, arguments: list[str], context: Path) -> None:
    # The image has no pip cache to use; this machine's keeps the test from downloading it all.
    install = [a for a in arguments if a != "--no-cache-dir"]
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", *install],
        cwd=context,
        check=True,
        timeout=900,
        env=IMAGE_ENV,
    )


def _importable(python: Path, modules: tuple[str, ...], cwd: Path) -> list[str]:
    """Which of `modules` the environment of `python` can import."""
    found = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util, json, sys; "
            "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m)]))",
            *modules,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=IMAGE_ENV,
    )
    names: list[str] = json.loads(found.stdout)
    return names


@pytest.mark.slow
def test_the_dockerfile_install_steps_give_a_working_proxy_without_evalkit_dependencies(
    tmp_path: Path,
) -> None:
    dockerfile = REPO / "Dockerfile"
    steps = install_steps(dockerfile)
    context = tmp_path / "app"
    _copy([source for source, _ in steps[-1].copies], context)
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    # In order, as the image runs them: the lock with its hashes, then the project alone.
    for step in steps:
        _pip_install(python, step.arguments, context)
    assert _importable(python, ("evalkit", *EVALKIT_ONLY), tmp_path) == []
    # uvicorn without its `standard` extra: its parser and loop, not its reloader or websockets.
    assert _importable(python, UVICORN_USED + UVICORN_UNUSED, tmp_path) == list(UVICORN_USED)
    check = health_check(dockerfile)
    assert check is not None
    assert isinstance(check.command, list)
    assert check.command[0] == "python"
    _serve_until_ready(
        environment / "bin" / "toolsentry",
        tmp_path / "serve.log",
        [str(python), *check.command[1:]],
    )
    # The slim install of the whole project (`pip install .`, no extra) ships the evalkit command
    # without its dependencies: it says what to install.
    whole = tmp_path / "whole"
    _copy(["pyproject.toml", "README.md", "proxy", "evalkit"], whole)
    _pip_install(python, ["--no-deps", "--no-build-isolation", "."], whole)
    result = subprocess.run(
        [str(environment / "bin" / "evalkit"), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=IMAGE_ENV,
    )
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    missing = re.fullmatch(
        r"evalkit needs its dependencies \((\S+) is missing\): pip install 'toolsentry\[evalkit\]'",
        line,
    )
    assert missing is not None, line
    assert missing[1] in {"httpx", *EVALKIT_ONLY}


def test_the_evalkit_command_without_its_dependencies_says_what_to_install() -> None:
    # The slim install has no numpy: an import of it fails as it would there. The command is
    # the console script pyproject.toml declares, called as its wrapper calls it.
    script = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "scripts"
    ]["evalkit"]
    module, _, function = script.partition(":")
    probe = (
        "import importlib, sys\n"
        "sys.modules['numpy'] = None\n"
        "sys.argv = ['evalkit', '--help']\n"
        f"sys.exit(getattr(importlib.import_module({module!r}), {function!r})())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "evalkit needs its dependencies (numpy is missing): pip install 'toolsentry[evalkit]'"
    ]
