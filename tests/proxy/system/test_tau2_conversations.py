"""τ²-bench's own simulations replayed through a real `toolsentry serve` WITHOUT any session header:
one session per simulation, and each session's `tool_error` count equals the tool messages with
`error: true` in τ²-bench's results file for that simulation.

τ²-bench's harness cannot run here (it needs Python ≥ 3.12), so its files stand in: every agent
turn of a simulation is sent as τ²-bench's agent sends it — the system prompt and the history so
far in chat form, by the real openai SDK — and the scripted upstream answers with the assistant
message the file recorded. The simulations are played interleaved, one agent turn of each in
turn, with a second trial of one task: the same recorded run, whose calls the model named anew
(call ids differ between runs), so the two trials are identical until the first call and apart
from it. Played on the memory store and on Redis.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from evalkit.agent import system_prompt
from evalkit.domains import get_domain
from proxy.headers import SESSION_HEADER
from proxy.testing import LoopbackServer, ScriptedUpstream, completion, tool_call
from tests.processes import served_with
from tests.require import require

REPO = Path(__file__).resolve().parents[3]
RESULTS = "gpt-4.1_retail_1trial.json"
# Tasks of the file: those whose simulations report failed tool calls (3, 2, 2, 1) and two
# without; task 62 is also played as a second trial.
TASKS = ("62", "27", "38", "45", "40", "17")
SECOND_TRIAL = "62"


def tau2_dir() -> Path:
    configured = os.environ.get("TAU2_DATA_DIR")
    candidates = [*([Path(configured)] if configured else []), REPO.parent / "shared" / "tau2"]
    found = next((c for c in candidates if (c / "results" / RESULTS).is_file()), None)
    if found is None:
        require("tau2", f"τ²-bench's results file {RESULTS} not found: set TAU2_DATA_DIR")
    return found


def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """A τ²-bench message as its agent sends it to the model (chat completions)."""
    if message["role"] == "tool":
        return {"role": "tool", "tool_call_id": message["id"], "content": message["content"]}
    sent: dict[str, Any] = {"role": message["role"], "content": message["content"]}
    if message.get("tool_calls"):
        sent["tool_calls"] = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
            for c in message["tool_calls"]
        ]  # fmt: skip
    return sent


def recorded_reply(message: dict[str, Any]) -> dict[str, Any]:
    """The upstream's answer that is the recorded assistant message."""
    calls = [tool_call(c["name"], c["arguments"], id=c["id"]) for c in message["tool_calls"] or []]
    return completion(message["content"], calls or None)


def renamed_calls(messages: list[dict[str, Any]], trial: str) -> list[dict[str, Any]]:
    """A simulation's messages with every call id renamed, as another run of the model names them."""
    renamed = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {**c, "id": f"{trial}-{c['id']}"} for c in message["tool_calls"]
            ]
        if message["role"] == "tool":
            message["id"] = f"{trial}-{message['id']}"
        renamed.append(message)
    return renamed


class Simulation:
    """One simulation of the file, played turn by turn as τ²-bench's agent would."""

    def __init__(self, name: str, messages: list[dict[str, Any]], system: str) -> None:
        self.name = name
        self.messages = messages
        self.system = system
        # The agent's turns: every assistant message but the opening greeting, which τ²-bench
        # writes itself without asking the model.
        self.turns = [i for i, m in enumerate(messages) if m["role"] == "assistant" and i > 0]
        self.errors = sum(1 for m in messages if m["role"] == "tool" and m.get("error"))
        self.sessions: list[str] = []
        self.bodies: list[list[dict[str, Any]]] = []

    def request(self, turn: int) -> list[dict[str, Any]]:
        history = self.messages[: self.turns[turn]]
        return [{"role": "system", "content": self.system}, *map(chat_message, history)]


def simulations(directory: Path) -> list[Simulation]:
    domain = get_domain("retail", directory / "domains" / "retail")
    system = system_prompt(domain.policy)
    recorded = json.loads((directory / "results" / RESULTS).read_text())["simulations"]
    by_task = {s["task_id"]: s for s in recorded if s["task_id"] in TASKS}
    played = [Simulation(f"task {t}", by_task[t]["messages"], system) for t in TASKS]
    second = renamed_calls(by_task[SECOND_TRIAL]["messages"], "trial-2")
    played.insert(1, Simulation(f"task {SECOND_TRIAL}, trial 2", second, system))
    return played


@pytest.fixture
def store_url(request: pytest.FixtureRequest) -> str:
    if request.param == "redis":
        return str(request.getfixturevalue("redis_url"))
    return "memory"


@pytest.fixture
def proxy(store_url: str, tmp_path: Path) -> Iterator[tuple[str, ScriptedUpstream]]:
    script = ScriptedUpstream()
    with LoopbackServer(script.app) as upstream:
        entry = {"name": "scripted", "base_url": f"{upstream.url}/v1"}
        # Repair off: every recorded answer goes to the agent as recorded, one upstream call a
        # turn; the budget of τ²-bench's own runs (max_errors 10).
        settings = {"upstreams": [entry], "retries": 0, "store": store_url, "repair": "off"}
        with served_with(settings, tmp_path) as (port, _):
            yield f"http://127.0.0.1:{port}", script


@pytest.mark.parametrize(
    "store_url", ["memory", pytest.param("redis", marks=pytest.mark.redis)], indirect=True
)
def test_tau2_simulations_without_a_session_header_are_one_session_each_counting_their_errors(
    proxy: tuple[str, ScriptedUpstream],
) -> None:
    url, script = proxy
    played = simulations(tau2_dir())
    domain = get_domain("retail", tau2_dir() / "domains" / "retail")
    tools = domain.toolkit_classes()[0].openai_tools()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    for turn in range(max(len(s.turns) for s in played)):
        for simulation in played:  # interleaved: one agent turn of each in turn
            if turn >= len(simulation.turns):
                continue
            script.push(recorded_reply(simulation.messages[simulation.turns[turn]]))
            body = simulation.request(turn)
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-4.1", messages=body, tools=tools
            )
            simulation.sessions.append(raw.headers[SESSION_HEADER])
            simulation.bodies.append(body)
    client.close()

    finals = [s.sessions[-1] for s in played]
    assert len(set(finals)) == len(played)  # one session per simulation
    first, second = played[0], played[1]  # the two trials of one task
    for simulation in played:
        for body, session in zip(simulation.bodies, simulation.sessions, strict=True):
            if simulation is second and body in first.bodies:
                assert session == first.sessions[-1]  # identical so far: one session
            else:
                assert session == simulation.sessions[-1]
    assert second.sessions[0] == first.sessions[0]  # they do open alike
    with httpx.Client(base_url=url, timeout=30) as http:
        for simulation in played:
            record = http.get(f"/v1/sessions/{simulation.sessions[-1]}").json()
            assert record["channels"].get("tool_error", 0) == simulation.errors, simulation.name
    assert [s.errors for s in played] == [3, 3, 2, 2, 1, 0, 0]
