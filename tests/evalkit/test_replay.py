"""`evalkit replay` end to end: the embedded simulated upstream and proxy, a proxy and simulator
in separate processes, concurrency, interruption and resume, the budget curve, and the CLI."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from evalkit.analysis.budget import Budget, reward_at_budget
from evalkit.cli import app
from evalkit.domains import domain_names, get_domain
from evalkit.errors import EndpointError, UsageError
from evalkit.formats import SimulationRun, read_results
from evalkit.messages import AssistantMessage, ToolMessage
from evalkit.replay import (
    Arm,
    Replay,
    ReplayOptions,
    check_reachable,
    execute,
    plan_arms,
    select_tasks,
)
from evalkit.summary import summarize_replay
from tests.evalkit.conftest import Reply, ScriptedChatServer, completion
from tests.processes import OutputLines, port_options, reported_port, stop_process, tail

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()
VOLATILE = frozenset(
    {
        "timestamp",
        "start_time",
        "end_time",
        "duration",
        "id",
        "created_at",
        "updated_at",
        "session",
        "session_id",
        "x-toolsentry-session",
        "arm",
    }
)


def replay_run(out: Path, **options: Any) -> Replay:
    """A finished embedded replay of `options` in `out`."""
    replay = Replay.start(ReplayOptions(**options), out)
    asyncio.run(execute(replay))
    return replay


def stable(value: Any) -> Any:
    """`value` without the fields that differ from run to run (times, ids, session ids)."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def simulations_of(path: Path) -> list[Any]:
    return stable(json.loads(path.read_text(encoding="utf-8"))["simulations"])


# -- the mechanism, as properties of small seeded runs ------------------------------------------


TELECOM_MISSING = (
    "the telecom domain is not registered (evalkit/domains/telecom is not in this tree yet)"
)


def mechanism_tasks(domain: str) -> str:
    """Twelve tasks whose agent makes at least two gold calls (where mistakes can happen)."""
    tasks = [
        t.id
        for t in get_domain(domain).tasks
        if sum(1 for a in t.gold_actions if a.requestor == "assistant") >= 2
    ]
    return ",".join(tasks[:12])


@pytest.fixture(
    scope="module",
    params=[
        "retail",
        pytest.param(
            "telecom",
            marks=pytest.mark.skipif("telecom" not in domain_names(), reason=TELECOM_MISSING),
        ),
    ],
)
def mechanism(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[float]]:
    """Budget curves of bf16 and int4, repair off and on, from one run at max_errors 10."""
    domain = request.param
    replay = replay_run(
        tmp_path_factory.mktemp(f"mechanism-{domain}"),
        domain=domain,
        tasks=mechanism_tasks(domain),
        trials=3,
        seed=1,
    )
    return {r.label: [p.pass_rate for p in r.budget_curve] for r in summarize_replay(replay)}


def gap(curves: dict[str, list[float]], a: str, b: str, k: int) -> float:
    return 100 * (curves[a][k] - curves[b][k])


def test_int4_scores_within_a_few_points_of_bf16_at_the_default_budget(
    mechanism: dict[str, list[float]],
) -> None:
    assert abs(gap(mechanism, "bf16", "int4", 10)) <= 8


def test_a_tight_budget_opens_a_clearly_larger_gap(mechanism: dict[str, list[float]]) -> None:
    at_2 = gap(mechanism, "bf16", "int4", 2)
    assert at_2 >= 8
    assert at_2 >= abs(gap(mechanism, "bf16", "int4", 10)) + 6


def test_repair_at_a_tight_budget_shrinks_the_gap(mechanism: dict[str, list[float]]) -> None:
    without = gap(mechanism, "bf16", "int4", 2)
    assert gap(mechanism, "bf16+repair", "int4+repair", 2) <= without / 2
    assert gap(mechanism, "int4+repair", "int4", 2) >= 8


def test_the_budget_curve_matches_a_run_at_that_budget(tmp_path: Path) -> None:
    options = {
        "tasks": "0,1,2,3,4,5,6,7",
        "trials": 2,
        "seed": 1,
        "profiles": ("int4",),
        "repairs": ("off",),
    }
    at_10 = replay_run(tmp_path / "b10", max_errors=10, **options)
    at_2 = replay_run(tmp_path / "b2", max_errors=2, **options)
    (arm,) = at_10.arms
    (wide_run,) = summarize_replay(at_10)
    assert wide_run.budget is Budget.PROXY
    wide = {(e.task_id, e.trial): e for e in wide_run.episodes}
    tight = {(s.task_id, s.trial): s for s in at_2.results(arm).simulations}
    assert wide.keys() == tight.keys()
    for key, episode in wide.items():
        # The counterfactual of evalkit.analysis.budget, on the budget the run ran under.
        expected = reward_at_budget(episode.reward, episode.errors_for(Budget.PROXY), 2)
        assert tight[key].reward_info is not None
        assert tight[key].reward_info.reward == expected, key
    assert any(s.termination_reason == "too_many_errors" for s in tight.values())
    # The run at 2 itself: its proxy curve at k = 2 is its own mean reward.
    (tight_run,) = summarize_replay(at_2)
    assert tight_run.at_budget(2) == tight_run.mean_reward


# -- one results file, however it is served and scheduled ----------------------------------------


@contextlib.contextmanager
def serving(*command: str, health: str, logs: Path) -> Iterator[str]:
    """Run `python -m <command>` from the repository root on the port it binds and reports, until
    its `health` path answers; yields its root URL."""
    log = logs / f"{command[0]}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", *command, *port_options(logs / f"{command[0]}.port")],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        url = f"http://127.0.0.1:{reported_port(process, logs / f'{command[0]}.port', tail(log))}"
        deadline = time.monotonic() + 120  # a safety net against a hang, not a measure
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + health, timeout=1).status_code == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{command[0]} did not start: {tail(log)()}")
            time.sleep(0.1)
        yield url
    finally:
        stop_process(process, timeout=20)


def test_a_proxy_and_simulator_in_their_own_processes_give_the_embedded_results(
    tmp_path: Path,
) -> None:
    sim = ("evalkit.cli", "sim", "serve", "--domain", "retail", "--profile", "int4")
    proxy = ("proxy.cli", "serve", "--max-errors", "10", "--log-level", "warning")
    tasks = "0,3,5,8,13,21"
    embedded = replay_run(
        tmp_path / "embedded", tasks=tasks, seed=4, profiles=("int4",), repairs=("off",)
    )
    with (
        serving(*sim, health="/health", logs=tmp_path) as sim_url,
        serving(*proxy, "--upstream", f"{sim_url}/v1", health="/healthz", logs=tmp_path) as url,
    ):
        external = replay_run(
            tmp_path / "external",
            tasks=tasks,
            seed=4,
            base_url=f"{url}/v1",
            model="sim-int4",
            repairs=("off",),
        )
    assert external.out / "results.json" == external.runs["sim-int4"].path
    ours = simulations_of(embedded.out / "results.json")
    theirs = simulations_of(external.out / "results.json")
    assert [s["task_id"] for s in theirs] == tasks.split(",")
    assert any(s["toolsentry"]["channels"] for s in ours)
    assert theirs == ours


def test_concurrent_episodes_give_the_results_of_one_at_a_time_in_their_own_sessions(
    tmp_path: Path,
) -> None:
    options = {"tasks": "0,1,2,3,4,5,6,7", "seed": 2, "profiles": ("int4",)}
    one = replay_run(tmp_path / "one", concurrency=1, **options)
    eight = replay_run(tmp_path / "eight", concurrency=8, **options)
    for arm in one.arms:
        assert simulations_of(eight.runs[arm.name].path) == simulations_of(one.runs[arm.name].path)
    sessions = []
    for arm in eight.arms:
        for simulation in eight.results(arm).simulations:
            block = simulation.toolsentry or {}
            record = block["proxy_session"]
            assert record["session"] == block["session_id"]
            turns = [m for m in simulation.messages[1:] if isinstance(m, AssistantMessage)]
            assert record["requests"] == len(turns)
            sessions.append(block["session_id"])
    assert len(set(sessions)) == len(sessions) == 16


# -- interruption and resume ---------------------------------------------------------------


def test_an_interrupted_run_keeps_its_episodes_and_resume_finishes_it(tmp_path: Path) -> None:
    options = ReplayOptions(
        tasks="0,1,2,3,4,5", seed=3, profiles=("int4",), repairs=("off",), concurrency=2
    )
    replay = Replay.start(options, tmp_path / "cut")

    async def interrupted() -> None:
        main = asyncio.current_task()
        assert main is not None

        def stop_after_three(arm: Arm, simulation: SimulationRun) -> None:
            if sum(len(r.simulations) for r in replay.runs.values()) == 3:
                main.cancel()

        with contextlib.suppress(asyncio.CancelledError):
            await execute(replay, stop_after_three)

    asyncio.run(interrupted())
    kept = read_results(tmp_path / "cut" / "results.json").simulations
    assert 3 <= len(kept) < 6

    resumed = Replay.resume(tmp_path / "cut")
    assert len(resumed.pending()) == 6 - len(kept)
    asyncio.run(execute(resumed))
    whole = replay_run(tmp_path / "whole", **dataclasses.asdict(options))
    assert simulations_of(tmp_path / "cut" / "results.json") == simulations_of(
        whole.out / "results.json"
    )


def test_resume_needs_a_replay_directory(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no replay to resume"):
        Replay.resume(tmp_path)


# -- pure parts ------------------------------------------------------------------------------


def test_arms_are_profiles_times_repair_modes_or_the_external_model() -> None:
    replay = Replay.start(ReplayOptions(tasks="0"), Path("unused"))
    assert [a.name for a in replay.arms] == ["bf16", "bf16+repair", "int4", "int4+repair"]
    assert [a.model for a in replay.arms] == ["sim-bf16", "sim-bf16", "sim-int4", "sim-int4"]
    external = plan_arms(ReplayOptions(base_url="http://h/v1", model="org/m", repairs=()))
    assert [(a.name, a.repair) for a in external] == [("org_m", None)]
    assert external[0].headers(5) == {"x-toolsentry-max-errors": "5"}


def test_tasks_are_chosen_by_id_or_split_name(tau2_dir: Path) -> None:
    retail = get_domain("retail")
    assert [t.id for t in select_tasks(retail, "3, 1")] == ["3", "1"]
    with pytest.raises(UsageError, match="no task '999'"):
        select_tasks(retail, "1,999")
    data_dir = tau2_dir / "domains" / "retail"
    tau2 = get_domain("retail", data_dir)
    test_split = select_tasks(tau2, "test", data_dir)
    assert 0 < len(test_split) < len(tau2.tasks)


async def test_an_unreachable_endpoint_is_named(refused_port: int) -> None:
    url = f"http://127.0.0.1:{refused_port}/v1"
    with pytest.raises(EndpointError, match=url):
        await check_reachable(url, "agent endpoint")


# -- the command line ------------------------------------------------------------------------


def test_replay_command_prints_the_summary_and_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = runner.invoke(app, ["replay", "--tasks", "0,1,2", "--out", str(out), "--seed", "5"])
    assert result.exit_code == 0, result.output
    for heading in (
        "Runs",
        "Budget curve",
        "Failures the agent experienced",
        "Termination reasons",
    ):
        assert heading in result.output
    assert "int4 against bf16" in result.output
    for arm in ("bf16", "bf16+repair", "int4", "int4+repair"):
        assert len(read_results(out / arm / "results.json").simulations) == 3
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert "## Budget curve" in summary
    assert "| int4+repair |" in summary


def test_an_unreachable_base_url_fails_with_a_message_naming_it(
    tmp_path: Path, refused_port: int
) -> None:
    url = f"http://127.0.0.1:{refused_port}/v1"
    result = runner.invoke(
        app, ["replay", "--base-url", url, "--model", "m", "--out", str(tmp_path / "x")]
    )
    assert result.exit_code == EndpointError.exit_code
    assert url in result.output
    assert not (tmp_path / "x" / "results.json").exists()


def test_a_bad_domain_lists_the_valid_ones(tmp_path: Path) -> None:
    result = runner.invoke(app, ["replay", "--domain", "shop", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "unknown domain 'shop'" in result.output
    for name in domain_names():
        assert name in result.output


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--user", "robot"], "--user must be one of scripted, llm, got 'robot'"),
        (["--judge-model", "j"], "--judge-base-url and --judge-model go together"),
    ],
)
def test_bad_replay_options_are_refused_by_the_options_themselves(
    tmp_path: Path, options: list[str], message: str
) -> None:
    result = runner.invoke(app, ["replay", *options, "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    # The same check guards the library: the CLI only routes the flag to the options.
    name, value = options
    with pytest.raises(UsageError, match=message.split(",")[0]):
        ReplayOptions(**{name.removeprefix("--").replace("-", "_"): value}).check()


def test_ctrl_c_keeps_finished_episodes_and_says_how_to_resume(tmp_path: Path) -> None:
    import signal

    out = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "evalkit.cli", "replay", "--profile", "int4", "--repair", "off",
         "--concurrency", "1", "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    results = out / "results.json"
    lines = OutputLines(process.stdout)
    # The run says each finished episode (its progress, as plain lines off a terminal); the
    # signal goes when the first is kept, so however busy the machine, 45 remain to interrupt.
    lines.wait_for(r"^int4: 1/\d+ episodes")
    process.send_signal(signal.SIGINT)
    process.wait(timeout=60)
    output = lines.whole()
    assert process.returncode == 130, output[-2000:]
    assert f"finish with: evalkit replay --resume {out}\n" in output  # on one line
    kept = read_results(results).simulations
    assert 0 < len(kept) < 46


# -- telecom ---------------------------------------------------------------------------------


@pytest.mark.skipif("telecom" not in domain_names(), reason=TELECOM_MISSING)
def test_telecom_runs_through_the_proxy_with_user_actions(tmp_path: Path) -> None:
    domain = get_domain("telecom")
    with_user_actions = [
        t.id for t in domain.tasks if any(a.requestor == "user" for a in t.gold_actions)
    ]
    replay = replay_run(
        tmp_path,
        domain="telecom",
        tasks=",".join(with_user_actions[:4]),
        profiles=("bf16",),
        repairs=("reask",),
    )
    (arm,) = replay.arms
    simulations = replay.results(arm).simulations
    assert len(simulations) == min(4, len(with_user_actions))
    user_calls = [
        m
        for s in simulations
        for m in s.messages
        if isinstance(m, ToolMessage) and m.requestor == "user"
    ]
    assert user_calls
    assert all(s.termination_reason in ("user_stop", "agent_stop") for s in simulations)


async def test_a_session_with_any_characters_in_its_id_is_fetched_from_the_proxy() -> None:
    import httpx as http

    from evalkit.agent import episode_headers, episode_metadata
    from evalkit.replay import embedded_upstream, fetch_session

    domain = get_domain("retail")
    replay = Replay.start(ReplayOptions(tasks="0", profiles=("int4",)), Path("unused"))
    session = "[mobile_data]roaming|abroad+1 #2"
    with embedded_upstream(domain, replay.options, replay.profiles) as base_url:
        async with http.AsyncClient() as client:
            response = await client.post(
                f"{base_url}/chat/completions",
                json={
                    "model": "sim-int4",
                    "messages": [{"role": "user", "content": "Hi"}],
                    "metadata": episode_metadata("0", 0, 0),
                },
                headers=episode_headers(session, "0"),
            )
            assert response.status_code == 200
            record = await fetch_session(client, base_url, session)
            # No record is a reason, not a silent None.
            with pytest.raises(EndpointError, match=r"sessions/nobody answered HTTP 404"):
                await fetch_session(client, base_url, "nobody")
        async with http.AsyncClient() as nowhere:
            with pytest.raises(EndpointError, match="failed"):
                await fetch_session(nowhere, "http://127.0.0.1:9/v1", session)
    assert record["session"] == session
    assert record["requests"] == 1


def test_session_ids_stay_valid_for_any_task_id() -> None:
    from evalkit.replay import session_id

    arm = Arm("int4+repair", "sim-int4", "int4", "reask")
    assert session_id("r1", arm, "7", 2) == "r1-int4+repair-7-2"
    long_id = "[mobile_data_issue]" + "|".join(["airplane_mode_on"] * 10) + "[PERSONA:Easy]"
    for task in (long_id, "a/b", "tâche"):
        made = session_id("r1", arm, task, 0)
        assert made.startswith("r1-int4+repair-task-")
        assert len(made) < 64
        assert made != session_id("r1", arm, task + "x", 0)


async def test_an_llm_user_on_its_own_endpoint_plays_the_customer(
    chat_server: ScriptedChatServer, tmp_path: Path
) -> None:
    chat_server.replies.append(Reply(completion("Hi, I want to cancel order #W4034171.")))
    options = ReplayOptions(
        tasks="0",
        profiles=("bf16",),
        repairs=("reask",),
        user="llm",
        user_base_url=chat_server.base_url,
        user_model="user-model",
    )
    replay = Replay.start(options, tmp_path)
    await execute(replay)
    (simulation,) = replay.results(replay.arms[0]).simulations
    assert simulation.termination_reason == "agent_stop"
    assert simulation.reward_info is not None
    assert simulation.reward_info.reward == 1.0
    assert all(r["body"]["model"] == "user-model" for r in chat_server.requests)
    first = chat_server.requests[0]["body"]["messages"]
    assert first[0]["role"] == "system"
    assert "cancel your order #W4034171" in first[0]["content"]
    assert read_results(tmp_path / "results.json").info["user_info"]["llm"] == "user-model"
