"""The numbers and tables of a replay summary, from hand-built simulations."""

from __future__ import annotations

from typing import Any

import pytest

from evalkit.domains import get_domain
from evalkit.formats import Results, SimulationRun
from evalkit.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from evalkit.scoring import RewardInfo
from evalkit.summary import (
    headline,
    markdown,
    proxy_accounting,
    summarize,
    trajectory_channels,
    wilson_interval,
)


@pytest.fixture(scope="module")
def tools() -> list[dict[str, Any]]:
    agent_tools, _ = get_domain("retail").toolkit_classes()
    return agent_tools.openai_tools()


def make_simulation(
    task_id: str = "0",
    reward: float = 1.0,
    messages: list[Any] | None = None,
    toolsentry: dict[str, Any] | None = None,
) -> SimulationRun:
    return SimulationRun(
        id=f"sim-{task_id}",
        task_id=task_id,
        termination_reason="user_stop",
        reward_info=RewardInfo(reward=reward),
        messages=messages or [AssistantMessage(content="Hi!")],
        toolsentry=toolsentry or {"episode_errors": 0, "errors": 0},
    )


def test_the_wilson_interval_has_known_values() -> None:
    assert wilson_interval(0, 0) == (0.0, 0.0)
    low, high = wilson_interval(0, 10)
    assert low == 0.0
    assert high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(40, 46)
    assert low == pytest.approx(0.743, abs=1e-3)
    assert high == pytest.approx(0.939, abs=1e-3)


def test_trajectory_channels_count_each_failure_once(tools: list[dict[str, Any]]) -> None:
    messages = [
        AssistantMessage(content="Hi!"),
        UserMessage(content="Cancel it."),
        AssistantMessage(
            tool_calls=[ToolCall(id="a", name="cancel_order", arguments={"order_id": "#W1"})]
        ),
        ToolMessage(id="a", content="Error: Tool 'cancel_order' not found.", error=True),
        AssistantMessage(
            tool_calls=[ToolCall(id="b", name="get_order_details", arguments={"order_id": "#W9"})]
        ),
        ToolMessage(id="b", content="Error: Order not found", error=True),
        AssistantMessage(
            content='<tool_call>{"name": "get_order_details", "arguments": {}}</tool_call>'
        ),
    ]
    channels, turns, wrong = trajectory_channels(make_simulation(messages=messages), tools)
    assert channels == {"unknown_tool": 1, "tool_error": 1, "leaked_tool_call": 1}
    assert turns == 3
    assert wrong == ["cancel_order"]


def test_proxy_accounting_prefers_the_session_record_then_the_headers() -> None:
    record = {"channels": {"unknown_tool": 3, "tool_error": 1}, "requests": 7, "repairs": 2}
    with_record = make_simulation(
        toolsentry={"proxy_session": record, "channels": {"unknown_tool": 1}}
    )
    assert proxy_accounting(with_record) == ({"unknown_tool": 3, "tool_error": 1}, 7, 2)
    turns = [
        {"turn_idx": 2, "headers": {"x-toolsentry-repairs": "1"}},
        {"turn_idx": 4, "headers": {"x-toolsentry-repairs": "0"}},
        {"turn_idx": 6, "headers": {"x-toolsentry-repairs": "2"}},
    ]
    headers_only = make_simulation(
        toolsentry={"proxy_session": None, "channels": {"unknown_tool": 3}, "turns": turns}
    )
    assert proxy_accounting(headers_only) == ({"unknown_tool": 3}, 3, 3)


def test_a_summary_has_pass_rates_pass_hat_k_and_the_budget_curve(
    tools: list[dict[str, Any]],
) -> None:
    simulations = [
        make_simulation("0", 1.0, toolsentry={"episode_errors": 0, "errors": 0}),
        make_simulation("0", 1.0, toolsentry={"episode_errors": 2, "errors": 2}),
        make_simulation("1", 0.0, toolsentry={"episode_errors": 0, "errors": 0}),
        make_simulation("1", 1.0, toolsentry={"episode_errors": 1, "errors": 1}),
    ]
    summary = summarize("int4", Results(simulations=simulations), tools, max_errors=3)
    assert summary.pass_rate == 0.75
    assert summary.pass_hat == {1: 0.75, 2: 0.5}
    assert summary.budget == [0.0, 0.25, 0.5, 0.75]
    assert summary.errors_per_episode == 0.75
    assert summary.terminations == {"user_stop": 4}


def test_the_headline_compares_models_and_says_what_repair_recovers(
    tools: list[dict[str, Any]],
) -> None:
    clean = [make_simulation(str(i)) for i in range(4)]
    damaged = [
        make_simulation(str(i), toolsentry={"episode_errors": i, "errors": i}) for i in range(4)
    ]
    arms = [("bf16", "off"), ("bf16", "reask"), ("int4", "off"), ("int4", "reask")]
    summaries = [
        summarize(f"{p}{'+repair' if r == 'reask' else ''}", Results(simulations=runs), tools, 10)
        for (p, r), runs in zip(arms, [clean, clean, damaged, clean], strict=True)
    ]
    lines = headline(arms, summaries, 10)
    assert lines[0].startswith(
        "int4 against bf16: 100.0% vs 100.0% at max_errors 10 (+0.0 points); 50.0% vs 100.0% at max_errors 2 (-50.0 points)"
    )
    assert "repair for int4 at max_errors 2: 50.0% → 100.0%" in lines[-1]
    text = markdown("replay", ["preamble"], arms, summaries, 10)
    assert text.startswith("# replay\n\npreamble\n")
    assert "| int4 | 0 | 25 | 50 | 75 | 100 |" in text
    assert "## Failure channels (count)" in text
