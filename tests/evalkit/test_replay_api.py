"""`evalkit replay --api chat|responses|messages`: the same episodes, seed for seed, over each wire
protocol — the real proxy in front of the real simulated upstream on loopback, the agent side on
the real `openai` SDK (chat, Responses) and the real `anthropic` SDK (Messages) — give the same
results, figure for figure, as `evalkit.analysis` computes them.

The retail data is changed in one way: the orders two tasks cancel are no longer pending, so
their valid gold call fails in the environment — a tool error that only the protocol's own form
of a tool result (text starting with `Error`, or `is_error: true`) tells the proxy about.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import evalkit.domains
from evalkit.analysis.budget import Budget
from evalkit.analysis.run import RunAnalysis
from evalkit.cli import app
from evalkit.domains import domain_names, get_domain
from evalkit.formats import SimulationRun
from evalkit.messages import AssistantMessage, ToolMessage
from evalkit.replay import Replay
from evalkit.summary import summarize_replay
from evalkit.wire import API_NAMES

runner = CliRunner()

TASKS = "0,1,2,3,4,5"
SEED = 1
MAX_ERRORS = 2
# Tasks 2 and 5 end with `cancel_pending_order` of these orders.
NO_LONGER_PENDING = ("#W1063476", "#W7989008")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped retail data, with the orders of `NO_LONGER_PENDING` delivered."""
    shipped = Path(evalkit.domains.__file__).parent / "retail" / "data"
    directory = tmp_path_factory.mktemp("retail-data")
    shutil.copytree(shipped, directory, dirs_exist_ok=True)
    db_path = directory / "db.json"
    db = json.loads(db_path.read_text(encoding="utf-8"))
    for order in NO_LONGER_PENDING:
        db["orders"][order]["status"] = "delivered"
    db_path.write_text(json.dumps(db), encoding="utf-8")
    return directory


def replay_over_each_api(out: Path, *options: str) -> dict[str, Replay]:
    """One `evalkit replay --api API *options` per protocol, in `out/API`."""
    replays: dict[str, Replay] = {}
    for api in API_NAMES:
        directory = out / api
        result = runner.invoke(app, ["replay", "--api", api, *options, "--out", str(directory)])
        assert result.exit_code == 0, result.output
        replays[api] = Replay.resume(directory)
    return replays


@pytest.fixture(scope="module")
def replays(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Replay]:
    """Retail over every protocol, same tasks, seed and options: int4, repair off and on."""
    return replay_over_each_api(
        tmp_path_factory.mktemp("retail"),
        *("--tasks", TASKS, "--seed", str(SEED), "--profile", "int4", "--repair", "off,reask"),
        *("--max-errors", str(MAX_ERRORS), "--data-dir", str(data_dir)),
    )


def trajectory(simulation: SimulationRun) -> list[tuple[Any, ...]]:
    """What was said and done, message by message: role, text, calls, tool errors."""
    out: list[tuple[Any, ...]] = []
    for m in simulation.messages:
        made = getattr(m, "tool_calls", None) or []
        calls = [(c.id, c.name, c.arguments, c.raw_arguments) for c in made]
        error = m.error if isinstance(m, ToolMessage) else None
        out.append((m.role, m.content, calls, error))
    return out


def outcomes(replay: Replay) -> dict[str, list[tuple[Any, ...]]]:
    """Per arm, per episode: reward, termination reason, what ended it, the proxy's counts."""
    out = {}
    for arm in replay.arms:
        rows = []
        for s in replay.results(arm).simulations:
            block = s.toolsentry or {}
            session = block["proxy_session"]
            rows.append(
                (
                    s.task_id,
                    s.reward_info.reward if s.reward_info is not None else None,
                    s.termination_reason,
                    # The session id holds the run's id, which differs from run to run.
                    (block["failure"] or "").replace(block["session_id"], "<session>"),
                    block["episode_errors"],
                    block["tool_errors"],
                    block["channels"],
                    {k: session[k] for k in ("errors", "repairs", "requests", "channels")},
                    trajectory(s),
                )
            )
        out[arm.name] = rows
    return out


def figures(run: RunAnalysis) -> dict[str, Any]:
    """What `evalkit.analysis` says of a run: per-episode failures by channel, the proxy's
    record, and both budget curves."""
    return {
        "episodes": [
            (
                e.task_id,
                e.reward,
                e.termination_reason,
                [f.channel.value for f in e.failures],
                dict(e.experienced()),
                [v.channel for v in e.silent],
                e.proxy,
            )
            for e in run.episodes
        ],
        "channels": dict(run.channels()),
        "curves": {b.value: [p.to_dict() for p in run.curve(b)] for b in Budget},
        "mean_reward": run.mean_reward,
    }


def assert_the_results_of_chat_completions(replays: dict[str, Replay]) -> None:
    """Every protocol's episodes and figures equal those of chat."""
    expected_outcomes = outcomes(replays["chat"])
    expected_figures = [figures(r) for r in summarize_replay(replays["chat"])]
    for api in ("responses", "messages"):
        assert outcomes(replays[api]) == expected_outcomes, api
        assert [figures(r) for r in summarize_replay(replays[api])] == expected_figures, api


def test_every_protocol_gives_the_results_of_chat_completions(
    replays: dict[str, Replay],
) -> None:
    expected_outcomes = outcomes(replays["chat"])
    # The episodes hold what the comparison is about: tool errors of valid calls that only the
    # protocol's tool result form reports, guard violations, repairs and budget refusals.
    rows = [row for arm_rows in expected_outcomes.values() for row in arm_rows]
    assert any(row[7]["channels"].get("tool_error") for row in rows)
    assert len({c for row in rows for c in row[7]["channels"]}) >= 3
    assert any(row[7]["repairs"] for row in rows)
    assert any(row[2] == "too_many_errors" for row in rows)
    assert any("refused the turn (error_budget_exhausted)" in row[3] for row in rows)
    assert_the_results_of_chat_completions(replays)


@pytest.mark.skipif(
    "telecom" not in domain_names(),
    reason="the telecom domain is not registered (evalkit/domains/telecom is not in this tree)",
)
def test_telecom_episodes_with_device_actions_are_the_same_on_every_protocol(
    tmp_path: Path,
) -> None:
    tasks = ",".join(t.id for t in get_domain("telecom").tasks[:4])
    replays = replay_over_each_api(
        tmp_path,
        *("--domain", "telecom", "--tasks", tasks, "--seed", "1", "--profile", "int4"),
        *("--repair", "off", "--max-errors", "3"),
    )
    rows = [row for arm_rows in outcomes(replays["chat"]).values() for row in arm_rows]
    # The customer acts on their device (calls the agent does not see) and the model errs.
    assert any(m[0] == "user" and m[2] for row in rows for m in row[8])
    assert any(row[7]["channels"] for row in rows)
    assert_the_results_of_chat_completions(replays)


def test_results_are_labelled_with_the_protocol_that_carried_them(
    replays: dict[str, Replay],
) -> None:
    for api, replay in replays.items():
        assert replay.options.api == api
        for arm in replay.arms:
            results = replay.results(arm)
            assert results.info["toolsentry"]["api"] == api
            for simulation in results.simulations:
                assert (simulation.toolsentry or {})["api"] == api
                answers = [m for m in simulation.messages[1:] if isinstance(m, AssistantMessage)]
                assert answers
                assert all((m.raw_data or {}).get("api") == api for m in answers)


def test_an_unknown_protocol_is_refused_naming_the_valid_ones(tmp_path: Path) -> None:
    result = runner.invoke(app, ["replay", "--api", "grpc", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "--api must be one of chat, responses, messages" in result.output
