"""The telecom domain: loading shipped and τ²-bench data, the policy, the sync step between the
carrier and the phone, dual-control episodes, and oracles scoring 1.0."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from evalkit.agent import OracleAgent
from evalkit.domains import get_domain
from evalkit.domains.base import Domain
from evalkit.domains.telecom import TelecomDomain, load_telecom
from evalkit.domains.telecom.tools import TelecomTools
from evalkit.domains.telecom.user_tools import TelecomUserTools
from evalkit.env import Environment
from evalkit.errors import DataError
from evalkit.formats import read_results
from evalkit.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from evalkit.orchestrator import run_episode
from evalkit.scoring import evaluate
from evalkit.tasks import EnvFunctionCall, Task
from evalkit.users import OracleUser


def phone_env(
    domain: Domain, name: str = "John Smith", number: str = "555-123-2002"
) -> Environment:
    env = Environment(domain)
    env.run_function(
        EnvFunctionCall(
            env_type="user",
            func_name="set_user_info",
            arguments={"name": name, "phone_number": number},
        )
    )
    return env


def sides(env: Environment) -> tuple[TelecomTools, TelecomUserTools]:
    assert isinstance(env.agent_tools, TelecomTools)
    assert isinstance(env.user_tools, TelecomUserTools)
    return env.agent_tools, env.user_tools


def agent_call(env: Environment, name: str, **arguments: Any) -> ToolMessage:
    return env.execute(ToolCall(id=name, name=name, arguments=arguments))


def user_call(env: Environment, name: str, **arguments: Any) -> ToolMessage:
    return env.execute(ToolCall(id=name, name=name, arguments=arguments, requestor="user"))


# -- loading -----------------------------------------------------------------------------------


def test_the_shipped_domain_loads_with_both_toolkits(telecom: Domain) -> None:
    assert isinstance(telecom, TelecomDomain)
    assert telecom.toolkit_classes() == (TelecomTools, TelecomUserTools)
    assert len(telecom.tasks) >= 40
    assert "<tech_support_policy>" in telecom.policy
    assert "Path 3: picture messages (MMS)" in telecom.policy


def test_tau2_benchs_files_load_unchanged_and_give_its_policy_text(
    tau2_telecom: Domain, tau2_telecom_results_file: Path
) -> None:
    assert len(tau2_telecom.tasks) == 114
    recorded = read_results(tau2_telecom_results_file).info["environment_info"]["policy"]
    assert tau2_telecom.policy == recorded


def test_the_workflow_guide_can_be_chosen_instead_of_the_manual(tau2_dir: Path) -> None:
    domain = load_telecom(tau2_dir / "domains" / "telecom", tech_support="workflow")
    assert "Technical Support Troubleshooting Workflow" in domain.policy


def test_a_directory_without_the_phone_database_is_a_data_error(
    tau2_dir: Path, tmp_path: Path
) -> None:
    for name in ("db.toml", "tasks.json", "main_policy.md", "tech_support_manual.md"):
        shutil.copy(tau2_dir / "domains" / "telecom" / name, tmp_path / name)
    with pytest.raises(DataError, match=r"no user_db\.json or user_db\.toml"):
        get_domain("telecom", tmp_path)
    (tmp_path / "user_db.toml").write_text("[device]\nairplane_mode = 'maybe'\n")
    with pytest.raises(DataError, match="not a TelecomUserDB"):
        get_domain("telecom", tmp_path)


# -- the sync step -------------------------------------------------------------------------------


def test_sync_puts_line_status_and_roaming_of_the_carrier_onto_the_phone(
    tau2_telecom: Domain,
) -> None:
    env = phone_env(tau2_telecom)
    _, phone = sides(env)
    assert phone.surroundings.line_active
    assert phone.surroundings.roaming_allowed  # L1002 has roaming on in τ²-bench's data
    agent_call(env, "suspend_line", customer_id="C1001", line_id="L1002", reason="trip")
    assert not phone.surroundings.line_active
    agent_call(env, "resume_line", customer_id="C1001", line_id="L1002")
    assert phone.surroundings.line_active
    agent_call(env, "disable_roaming", customer_id="C1001", line_id="L1002")
    assert not phone.surroundings.roaming_allowed


def test_sync_reflects_the_data_allowance_and_a_refuel(tau2_telecom: Domain) -> None:
    env = phone_env(tau2_telecom)
    _, phone = sides(env)
    env.run_function(
        EnvFunctionCall(
            env_type="assistant",
            func_name="set_data_usage",
            arguments={"customer_id": "C1001", "line_id": "L1002", "data_used_gb": 15.1},
        )
    )
    assert phone.surroundings.mobile_data_usage_exceeded
    assert user_call(env, "run_speed_test").content == "Speed test failed: No Connection."
    agent_call(env, "refuel_data", customer_id="C1001", line_id="L1002", gb_amount=1.0)
    assert not phone.surroundings.mobile_data_usage_exceeded


def test_sync_carries_a_payment_request_to_the_phone_and_the_payment_back(
    tau2_telecom: Domain,
) -> None:
    env = phone_env(tau2_telecom)
    carrier, phone = sides(env)
    assert phone.surroundings.payment_request is None
    agent_call(env, "send_payment_request", customer_id="C1001", bill_id="B1002")
    assert user_call(env, "check_payment_request").content == (
        "You have a payment request for bill B1002 of 150.0 USD."
    )
    assert user_call(env, "make_payment").content == (
        "Payment of 150.0 USD has been made for bill B1002."
    )
    assert carrier._get_bill_by_id("B1002").status == "Paid"
    assert phone.surroundings.payment_request is None


def test_sync_waits_until_the_phone_knows_its_number(tau2_telecom: Domain) -> None:
    env = Environment(tau2_telecom)
    _, phone = sides(env)
    agent_call(env, "suspend_line", customer_id="C1001", line_id="L1002", reason="trip")
    assert phone.surroundings.line_active


def test_a_phone_number_without_a_line_makes_the_call_an_error(tau2_telecom: Domain) -> None:
    env = Environment(tau2_telecom)
    _, phone = sides(env)
    phone.set_user_info("Nobody", "555-999-9999")
    answer = user_call(env, "check_status_bar")
    assert answer.error
    assert answer.content == "Error: Line with phone number 555-999-9999 not found"


# -- dual control ------------------------------------------------------------------------------


def test_a_user_tool_error_counts_one_error(tau2_telecom: Domain) -> None:
    env = phone_env(tau2_telecom)
    bad = user_call(env, "grant_app_permission", app_name="messaging")
    assert bad.error
    assert bad.requestor == "user"
    assert "missing 1 required positional argument: 'permission'" in (bad.content or "")
    assert env.errors == 1
    assert not user_call(env, "check_status_bar").error
    assert env.errors == 1


def test_an_agent_calling_a_user_tool_gets_tau2_benchs_not_found_error(
    tau2_telecom: Domain,
) -> None:
    env = phone_env(tau2_telecom)
    answer = agent_call(env, "toggle_airplane_mode")
    assert answer.error
    assert answer.content == "Error: Tool 'toggle_airplane_mode' not found."
    assert env.errors == 1


class _CheckingUser:
    """Asks for help, then calls a tool the phone does not have, then stops."""

    async def respond(self, history: Sequence[Any]) -> UserMessage:
        own = [m for m in history if isinstance(m, ToolMessage) and m.requestor == "user"]
        if not any(isinstance(m, UserMessage) for m in history):
            return UserMessage(content="My phone has no service.")
        if not own:
            return UserMessage(tool_calls=[ToolCall(id="u", name="fix_phone", requestor="user")])
        return UserMessage(content="Thanks! ###STOP###")


class _PoliteAgent:
    async def respond(self, history: Sequence[Any]) -> AssistantMessage:
        return AssistantMessage(content="Please check your phone.")


async def test_user_tool_errors_count_toward_the_episodes_error_budget(telecom: Domain) -> None:
    task = telecom.tasks[0]
    sim = await run_episode(telecom, task, _PoliteAgent(), _CheckingUser(), max_errors=5)
    assert sim.termination_reason == "user_stop"
    assert sim.toolsentry is not None
    assert sim.toolsentry["episode_errors"] == 1
    sim = await run_episode(telecom, task, _PoliteAgent(), _CheckingUser(), max_errors=1)
    assert sim.termination_reason == "too_many_errors"


def test_every_tool_answer_recorded_by_tau2_bench_is_reproduced(
    tau2_telecom: Domain, tau2_telecom_results_file: Path
) -> None:
    results = read_results(tau2_telecom_results_file)
    tasks = {t.id: t for t in results.tasks}
    compared = 0
    for sim in results.simulations:
        env = Environment(tau2_telecom, tasks[sim.task_id])
        calls: dict[str, ToolCall] = {}
        for message in sim.messages:
            if isinstance(message, AssistantMessage | UserMessage):
                calls.update({c.id: c for c in message.tool_calls or []})
            elif isinstance(message, ToolMessage):
                answer = env.execute(calls[message.id])
                assert (answer.content, answer.error) == (message.content, message.error)
                compared += 1
    assert compared > 600


# -- oracles -----------------------------------------------------------------------------------


async def _oracle_rewards(domain: Domain, tasks: list[Task]) -> dict[str, float]:
    rewards = {}
    for task in tasks:
        sim = await run_episode(domain, task, OracleAgent(task), OracleUser(task))
        rewards[task.id] = evaluate(domain, task, sim.messages, sim.termination_reason).reward
    return rewards


async def test_oracle_scores_one_on_every_shipped_task(telecom: Domain) -> None:
    rewards = await _oracle_rewards(telecom, telecom.tasks)
    assert {t: r for t, r in rewards.items() if r != 1.0} == {}


async def test_oracle_scores_one_on_every_tau2_telecom_task(tau2_telecom: Domain) -> None:
    rewards = await _oracle_rewards(tau2_telecom, tau2_telecom.tasks)
    assert len(rewards) == 114
    assert {t: r for t, r in rewards.items() if r != 1.0} == {}


async def test_an_oracle_that_skips_the_users_actions_fails_the_assertions(
    tau2_telecom: Domain,
) -> None:
    task = tau2_telecom.tasks[0]

    class NoDevice:
        async def respond(self, history: Sequence[Any]) -> UserMessage:
            if any(isinstance(m, UserMessage) for m in history):
                return UserMessage(content="Thanks! ###STOP###")
            return UserMessage(content="My data does not work.")

    sim = await run_episode(tau2_telecom, task, OracleAgent(task), NoDevice())
    info = evaluate(tau2_telecom, task, sim.messages, sim.termination_reason)
    assert info.reward == 0.0
    assert not all(a.met for a in info.env_assertions or [])
