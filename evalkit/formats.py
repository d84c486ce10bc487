"""Results files: τ²-bench's JSON (`timestamp`, `info`, `tasks`, `simulations`) plus a `toolsentry`
block per simulation.

τ²-bench's own results files load unchanged, and every model keeps unknown fields, so a file
read and written again keeps everything it had. Writes are atomic (a temporary file in the same
directory, fsync, rename). A file that is missing, truncated or not a results file raises
`ResultsFileError` naming the file and the position of the problem.

The `toolsentry` block of a simulation (`toolsentry_block`):

    {"turns": [{"turn_idx": 4, "headers": {"x-toolsentry-errors": "1", ...}}, ...],
     "channels": {"unknown_tool": 2, ...},   # summed over x-toolsentry-violations
     "repairs": 1, "errors": 3, "max_errors": 10, "session": "…",   # the last values reported
     "tool_errors": 3}                       # error tool messages in the trajectory
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from evalkit.errors import ResultsFileError
from evalkit.messages import AssistantMessage, Message, ToolMessage, dump_message, now_iso
from evalkit.scoring import RewardInfo
from evalkit.tasks import Task
from proxy.headers import (
    ERRORS_HEADER,
    MAX_ERRORS_HEADER,
    REPAIRS_HEADER,
    SESSION_HEADER,
    VIOLATIONS_HEADER,
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class SimulationRun(_Model):
    """One episode: its messages, how it ended, its reward, and what the proxy reported."""

    id: str
    task_id: str
    timestamp: str | None = None
    start_time: str | None = None
    end_time: str | None = None
    duration: float | None = None
    termination_reason: str
    agent_cost: float | None = None
    user_cost: float | None = None
    reward_info: RewardInfo | None = None
    messages: list[Message] = Field(default_factory=list)
    trial: int | None = None
    seed: int | None = None
    toolsentry: dict[str, Any] | None = None


class Results(_Model):
    """A whole results file. `missing` counts, per field of an older τ²-bench format's
    simulations (`OLDER_FORMAT_FIELDS`), the simulations that lack it (see `parse_results`)."""

    timestamp: str | None = None
    info: dict[str, Any] = Field(default_factory=dict)
    tasks: list[Task] = Field(default_factory=list)
    simulations: list[SimulationRun] = Field(default_factory=list)
    _missing: dict[str, int] = PrivateAttr(default_factory=dict)

    @property
    def missing(self) -> dict[str, int]:
        """Simulations without each field an older format lacks ({} for a complete file)."""
        return dict(self._missing)

    def missing_note(self) -> str | None:
        """What the file lacks and what cannot be computed without it, in one sentence; None
        for a complete file."""
        if not self._missing:
            return None
        counts = ", ".join(
            f"{field} ({n} of {len(self.simulations)})" for field, n in self._missing.items()
        )
        return (
            f"An older τ²-bench format without {counts}: each such simulation counts as a task "
            f"of its own ({UNKNOWN_TASK_PREFIX}<id>) and ends for an {UNKNOWN_TERMINATION} "
            "reason; budget curves and channels are computed, while per-task figures (pass^k, "
            "intervals over tasks) and rescoring need the missing fields."
        )


OLDER_FORMAT_FIELDS: Final = ("task_id", "termination_reason")
"""Fields of a simulation that an older τ²-bench format (a leaderboard submission) may lack;
what needs neither (budget curves, channels) is computed without them."""
UNKNOWN_TASK_PREFIX: Final = "no-task-id:"
UNKNOWN_TERMINATION: Final = "unrecorded"


SOLO_AGENTS = frozenset({"llm_agent_solo"})
"""τ²-bench's agents registered with `solo_mode` (its `registry.py`): the environment gives them
the user's tools as well as the agent's, and the user is its `dummy_user`."""


def solo_mode(results: Results) -> bool:
    """Whether τ²-bench ran `results` in solo mode: its agent is a solo agent, or its user is the
    `dummy_user` that only a solo agent may run with. The agent's calls of the user's tools are
    then the agent's own, run on the user's side (τ²-bench's `Environment.make_tool_call`)."""
    agent = results.info.get("agent_info")
    user = results.info.get("user_info")
    return (isinstance(agent, dict) and agent.get("implementation") in SOLO_AGENTS) or (
        isinstance(user, dict) and user.get("implementation") == "dummy_user"
    )


def make_info(
    *,
    domain: str,
    policy: str,
    agent: dict[str, Any],
    user: dict[str, Any],
    num_trials: int,
    max_steps: int,
    max_errors: int,
    seed: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The `info` block of a results file, with τ²-bench's keys."""
    return {
        "num_trials": num_trials,
        "max_steps": max_steps,
        "max_errors": max_errors,
        "user_info": user,
        "agent_info": agent,
        "environment_info": {"domain_name": domain, "policy": policy, "tool_defs": None},
        "seed": seed,
        **extra,
    }


def toolsentry_block(messages: list[Any]) -> dict[str, Any]:
    """The simulation's `toolsentry` block, from the proxy headers kept on assistant messages."""
    turns = []
    channels: Counter[str] = Counter()
    last: dict[str, str] = {}
    for index, m in enumerate(messages):
        if not isinstance(m, AssistantMessage):
            continue
        headers = getattr(m, "proxy_headers", None)
        if not isinstance(headers, dict) or not headers:
            continue
        turn = m.turn_idx if m.turn_idx is not None else index
        turns.append({"turn_idx": turn, "headers": dict(headers)})
        last.update(headers)
        violations = headers.get(VIOLATIONS_HEADER, "")
        channels.update(c.strip() for c in violations.split(",") if c.strip())
    block: dict[str, Any] = {"turns": turns, "channels": dict(channels)}
    for key, header in (
        ("repairs", REPAIRS_HEADER),
        ("errors", ERRORS_HEADER),
        ("max_errors", MAX_ERRORS_HEADER),
    ):
        value = last.get(header)
        block[key] = int(value) if value is not None and value.isdigit() else None
    block["session"] = last.get(SESSION_HEADER)
    block["tool_errors"] = sum(1 for m in messages if isinstance(m, ToolMessage) and m.error)
    return block


def results_to_dict(results: Results) -> dict[str, Any]:
    """A JSON-ready dict of `results`; fields never set are left out, unknown ones kept."""
    out = results.model_dump(mode="json", exclude_unset=True, exclude={"simulations", "tasks"})
    out["tasks"] = [t.model_dump(mode="json", exclude_unset=True) for t in results.tasks]
    out["simulations"] = [simulation_to_dict(s) for s in results.simulations]
    if "timestamp" not in out:
        out = {"timestamp": now_iso(), **out}
    return out


def simulation_to_dict(simulation: SimulationRun) -> dict[str, Any]:
    """A JSON-ready dict of one simulation."""
    out = simulation.model_dump(mode="json", exclude_unset=True, exclude={"messages"})
    out["messages"] = [dump_message(m) for m in simulation.messages]
    return out


def parse_results(data: Any, *, source: str = "results") -> Results:
    """Validate a decoded results file.

    Raises:
        ResultsFileError: when `data` is not a results file (a JSON object with a `simulations`
            list); the message names `source` and the first offending location (e.g.
            `simulations.3.messages.2.role`).
    """
    if not isinstance(data, dict):
        raise ResultsFileError(f"{source}: not a results file (expected a JSON object at the top)")
    if "simulations" not in data:  # `{}` is no run of 0 episodes
        raise ResultsFileError(f"{source}: not a results file: it has no simulations list")
    data, missing = _older_format(data)
    try:
        results = Results.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "top level"
        raise ResultsFileError(
            f"{source}: not a results file: at {where}: {first['msg']} "
            f"({exc.error_count()} problem(s) in all)"
        ) from exc
    results._missing = missing
    return results


def _older_format(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
    """`data` with the `OLDER_FORMAT_FIELDS` its simulations (those with messages) lack filled
    in — the task as the simulation's own (`UNKNOWN_TASK_PREFIX` and its id), the ending
    `UNKNOWN_TERMINATION` — and how many simulations lacked each; `data` itself when none lacks
    any."""
    simulations = data.get("simulations")
    if not isinstance(simulations, list):
        return data, {}
    missing: Counter[str] = Counter()
    filled = []
    for simulation in simulations:
        if (
            not isinstance(simulation, dict)
            or "messages" not in simulation  # no trajectory: not a simulation of any format
            or all(f in simulation for f in OLDER_FORMAT_FIELDS)
        ):
            filled.append(simulation)
            continue
        missing.update(f for f in OLDER_FORMAT_FIELDS if f not in simulation)
        defaults = {
            "task_id": f"{UNKNOWN_TASK_PREFIX}{simulation.get('id', len(filled))}",
            "termination_reason": UNKNOWN_TERMINATION,
        }
        filled.append({**defaults, **simulation})
    if not missing:
        return data, {}
    return {**data, "simulations": filled}, {
        f: missing[f] for f in OLDER_FORMAT_FIELDS if missing[f]
    }


def read_results(path: str | Path) -> Results:
    """Read a results file (ours or τ²-bench's).

    Raises:
        ResultsFileError: when the file is missing or unreadable, is not complete JSON (the
            message gives line, column and character offset), or is not a results file.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultsFileError(f"{file}: no such results file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsFileError(f"{file}: cannot read: {exc}") from exc
    if not text.strip():
        raise ResultsFileError(f"{file}: empty file, not a results file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        stripped = text.rstrip()
        truncated = exc.pos >= len(stripped) or not stripped.endswith("}")
        hint = "; the file looks truncated" if truncated else ""
        raise ResultsFileError(
            f"{file}: corrupt JSON at line {exc.lineno}, column {exc.colno} "
            f"(character {exc.pos} of {len(text)}): {exc.msg}{hint}"
        ) from exc
    return parse_results(data, source=str(file))


def write_results(path: str | Path, results: Results | dict[str, Any]) -> Path:
    """Write a results file atomically: readers see the old file or the new one, never a part.

    Returns the path written.
    """
    data = results_to_dict(results) if isinstance(results, Results) else results
    return write_json_atomic(path, data)


def write_json_atomic(path: str | Path, data: Any) -> Path:
    """Write `data` as JSON to `path` through a temporary file, fsync and rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, ensure_ascii=False)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return target
