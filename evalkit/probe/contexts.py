"""Contexts cut from recorded trajectories: what the agent saw just before each of its turns.

A context is the request the recorded agent answered at one assistant turn: the system prompt
(evalkit's instructions and the domain's policy, τ²-bench's layout), the conversation up to that
turn as the agent saw it (`agent_view`: the user's own device calls are not the agent's), and the
domain's tools. The recorded answer stays beside it, so a live model's answer can be held
against it. The opening greeting, which τ²-bench writes itself, is not a context: nothing has
been said yet. A context's cluster is its trajectory: the turns of one episode are not
independent, so intervals resample trajectories.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalkit.agent import system_prompt, to_openai_messages
from evalkit.analysis.load import run_key
from evalkit.domains import get_domain
from evalkit.errors import UsageError
from evalkit.formats import Results, SimulationRun, read_results
from evalkit.messages import AssistantMessage, ToolCall, UserMessage, agent_view


def canonical_json(value: object) -> str:
    """`value` as JSON with sorted keys and no spaces: equal arguments give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """One call of a turn: its tool name and its arguments as canonical JSON."""

    name: str
    arguments: str

    @classmethod
    def of(cls, call: ToolCall) -> RecordedCall:
        arguments = call.raw_arguments if call.raw_arguments is not None else call.arguments
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return cls(call.name, arguments)
        return cls(call.name, canonical_json(arguments))


@dataclass(frozen=True, slots=True)
class Context:
    """One assistant turn of a recording, ready to be asked again.

    `id` is `<file stem>/<simulation id>/<message index>`; `trajectory` the cluster key;
    `messages` the request's OpenAI chat messages (system first); `recorded` the calls the
    recorded agent made there (empty: it answered in text).
    """

    id: str
    source: str
    domain: str
    simulation_id: str
    task_id: str
    turn: int
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...]
    recorded: tuple[RecordedCall, ...]

    @property
    def trajectory(self) -> str:
        return f"{self.source}#{self.simulation_id}"

    def reference(self) -> dict[str, Any]:
        """Where the context comes from, for the output file (the messages can be cut again)."""
        return {
            "id": self.id,
            "source": self.source,
            "domain": self.domain,
            "simulation_id": self.simulation_id,
            "task_id": self.task_id,
            "message_index": self.turn,
            "messages": len(self.messages),
            "recorded_calls": [{"name": c.name, "arguments": c.arguments} for c in self.recorded],
        }


@dataclass(frozen=True)
class ContextSet:
    """The contexts of one or more results files, and how many each file had before sampling."""

    contexts: tuple[Context, ...]
    available: dict[str, int]
    undeclared: int  # recorded calls to tools the domain does not declare

    def to_dict(self) -> dict[str, Any]:
        return {
            "selected": len(self.contexts),
            "available": dict(self.available),
            "trajectories": len({c.trajectory for c in self.contexts}),
            "recorded_calls_to_undeclared_tools": self.undeclared,
        }


def domain_of(results: Results, source: str, expected: str | None) -> str:
    """The domain a results file records, checked against `expected`.

    Raises:
        UsageError: when the file names no domain and none is expected, or another one.
    """
    named, _ = run_key(results)
    if named == "unknown":
        if expected is None:
            raise UsageError(f"{source}: the file does not name its domain; pass --domain")
        return expected
    if expected is not None and named != expected:
        raise UsageError(
            f"{source}: the file holds a {named!r} run, not {expected!r} (--domain {expected})"
        )
    return named


def cut_contexts(
    results: Results,
    source: str,
    *,
    domain: str | None = None,
    data_dir: Path | None = None,
) -> tuple[list[Context], int]:
    """Every context of one results file, in file order, and the count of recorded calls to
    tools the domain does not declare.

    The policy is the one the file records (`info.environment_info.policy`), else the domain's;
    the tools those the file records (`tool_defs`), else the domain's agent tools.

    Raises:
        UsageError: on a file of another domain than `domain`, or of an unknown domain.
        DataError: when the domain's data cannot be loaded.
    """
    name = domain_of(results, source, domain)
    environment = results.info.get("environment_info")
    environment = environment if isinstance(environment, dict) else {}
    loaded = get_domain(name, data_dir)
    policy = environment.get("policy")
    system = system_prompt(policy if isinstance(policy, str) and policy else loaded.policy)
    defs = environment.get("tool_defs")
    tools = list(defs.values()) if isinstance(defs, dict) else defs
    if not isinstance(tools, list) or not tools:
        tools = loaded.toolkit_classes()[0].openai_tools()
    declared = {t.get("function", {}).get("name") for t in tools if isinstance(t, dict)}
    stem = Path(source).stem
    contexts: list[Context] = []
    undeclared = 0
    for simulation in results.simulations:
        for index, message in _assistant_turns(simulation):
            history = agent_view(simulation.messages[:index])
            if not any(isinstance(m, UserMessage) for m in history):
                continue
            recorded = tuple(RecordedCall.of(c) for c in message.tool_calls or ())
            undeclared += sum(1 for c in recorded if c.name not in declared)
            contexts.append(
                Context(
                    id=f"{stem}/{simulation.id}/{index}",
                    source=source,
                    domain=name,
                    simulation_id=simulation.id,
                    task_id=simulation.task_id,
                    turn=index,
                    messages=tuple(to_openai_messages(system, history)),
                    tools=tuple(tools),
                    recorded=recorded,
                )
            )
    return contexts, undeclared


def _assistant_turns(simulation: SimulationRun) -> list[tuple[int, AssistantMessage]]:
    return [(i, m) for i, m in enumerate(simulation.messages) if isinstance(m, AssistantMessage)]


def load_contexts(
    paths: Sequence[Path],
    *,
    domain: str | None = None,
    data_dir: Path | None = None,
    per_file: int | None = None,
    seed: int = 0,
) -> ContextSet:
    """The contexts of `paths`; with `per_file`, that many drawn at random (uniformly, without
    replacement, `seed`ed) from each file, kept in file order so that the turns of a trajectory
    stay together (and a server's prefix cache sees them in a row).

    Raises:
        ResultsFileError: when a file cannot be read or is not a results file.
        UsageError: on a wrong domain, or when the files hold no context at all.
    """
    selected: list[Context] = []
    available: dict[str, int] = {}
    undeclared = 0
    for path in paths:
        source = str(path)
        found, missing = cut_contexts(read_results(path), source, domain=domain, data_dir=data_dir)
        available[source] = len(found)
        undeclared += missing
        if per_file is not None and per_file < len(found):
            keep = set(
                random.Random(f"{seed}:{Path(source).name}").sample(range(len(found)), per_file)
            )
            found = [c for i, c in enumerate(found) if i in keep]
        selected.extend(found)
    if not selected:
        names = ", ".join(str(p) for p in paths)
        raise UsageError(f"no assistant turn to probe in {names}")
    return ContextSet(tuple(selected), available, undeclared)
