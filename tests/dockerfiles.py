"""The project's Dockerfiles read as the tests need them (`docker build` is not available here):
their instructions, their install steps, their health check, their lock file."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCKERFILES = [REPO / "Dockerfile", REPO / "examples" / "Dockerfile"]
LOCK = REPO / "requirements" / "docker.lock"


@dataclass(frozen=True)
class Instruction:
    """One instruction: its keyword in capitals and the rest of it, continuation lines joined."""

    keyword: str
    arguments: str


def instructions(dockerfile: Path) -> list[Instruction]:
    """The instructions of `dockerfile`, in order, comments and blank lines left out."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text(encoding="utf-8"))
    out: list[Instruction] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        keyword, _, arguments = stripped.partition(" ")
        out.append(Instruction(keyword.upper(), arguments.strip()))
    return out


def exec_form(arguments: str) -> list[str] | None:
    """The command of an exec-form instruction (a JSON array of strings), None for shell form."""
    try:
        command = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    if isinstance(command, list) and all(isinstance(word, str) for word in command):
        return command
    return None


@dataclass(frozen=True)
class InstallStep:
    """A `pip install` of a RUN instruction, and what the Dockerfile copied before it."""

    copies: list[tuple[str, str]]
    arguments: list[str]


def install_steps(dockerfile: Path) -> list[InstallStep]:
    """Every `pip install` the Dockerfile runs, in order, each with the (source, destination)
    pairs of the COPY instructions before it."""
    copies: list[tuple[str, str]] = []
    steps: list[InstallStep] = []
    for instruction in instructions(dockerfile):
        words = shlex.split(instruction.arguments)
        if instruction.keyword == "COPY":
            *sources, destination = words
            copies += [(source, destination) for source in sources]
        elif instruction.keyword == "RUN" and words[:2] == ["pip", "install"]:
            command = words[: words.index("&&")] if "&&" in words else words
            steps.append(InstallStep(list(copies), command[2:]))
    return steps


@dataclass(frozen=True)
class HealthCheck:
    """A HEALTHCHECK instruction: its options (`--interval=15s`, …) and its command, exec form
    (a list of words) or shell form (one string)."""

    options: list[str]
    command: list[str] | str


def health_check(dockerfile: Path) -> HealthCheck | None:
    """The Dockerfile's HEALTHCHECK, None when it has none."""
    found = [i for i in instructions(dockerfile) if i.keyword == "HEALTHCHECK"]
    if not found:
        return None
    options: list[str] = []
    rest = found[-1].arguments  # Docker keeps the last one
    while rest.startswith("--"):
        option, _, rest = rest.partition(" ")
        options.append(option)
        rest = rest.lstrip()
    keyword, _, command = rest.partition(" ")
    assert keyword.upper() == "CMD", f"{dockerfile}: HEALTHCHECK {rest}"
    return HealthCheck(options, exec_form(command) or command.strip())


def locked(lock: Path = LOCK) -> dict[str, tuple[str, list[str]]]:
    """The pins of a `--generate-hashes` lock: {name: (version, [sha256 hashes])}, names as
    written (compare them canonicalized)."""
    text = re.sub(r"\\\n", " ", lock.read_text(encoding="utf-8"))
    pins: dict[str, tuple[str, list[str]]] = {}
    for line in text.splitlines():
        requirement = line.partition("#")[0].strip()
        if not requirement:
            continue
        match = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", requirement)
        assert match is not None, f"{lock}: not a pin: {requirement}"
        pins[match[1]] = (match[2], re.findall(r"--hash=sha256:([0-9a-f]{64})", requirement))
    return pins
