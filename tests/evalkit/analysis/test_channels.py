"""Every recorded tool error falls in exactly one channel, with and without tool schemas."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from evalkit.analysis.channels import (
    DeclaredTools,
    ErrorChannel,
    classify_error_text,
    classify_simulation,
)
from evalkit.analysis.load import default_tool_source, load_runs
from evalkit.domains.retail.tools import RetailTools
from evalkit.formats import SimulationRun
from proxy.guard.toolcheck import compile_tools
from tests.evalkit.analysis.builders import (
    BUSINESS,
    EXTRA_ARG,
    MALFORMED,
    OK,
    SCHEMA,
    UNKNOWN,
    USER_ERROR,
    USER_OK,
    Call,
    episode,
)

RETAIL = DeclaredTools(compile_tools(RetailTools.openai_tools()), "retail tools")


def _classify(calls: list[Call], tools: DeclaredTools | None = RETAIL) -> Any:
    return classify_simulation(SimulationRun.model_validate(episode("1", calls)), tools)


@pytest.mark.parametrize(
    ("kind", "name", "with_schemas", "without_schemas"),
    [
        (UNKNOWN, "get_weather", ErrorChannel.UNKNOWN_TOOL, ErrorChannel.UNKNOWN_TOOL),
        (
            MALFORMED,
            "get_order_details",
            ErrorChannel.MALFORMED_ARGUMENTS,
            ErrorChannel.MALFORMED_ARGUMENTS,
        ),
        # A wrong type that the tool reports as a business error: only the schema sees it.
        (
            SCHEMA,
            "get_order_details",
            ErrorChannel.SCHEMA_VIOLATION,
            ErrorChannel.ENVIRONMENT_ERROR,
        ),
        # An extra argument the schema allows but Python refuses: the text tells.
        (
            EXTRA_ARG,
            "get_order_details",
            ErrorChannel.SCHEMA_VIOLATION,
            ErrorChannel.SCHEMA_VIOLATION,
        ),
        (
            BUSINESS,
            "get_order_details",
            ErrorChannel.ENVIRONMENT_ERROR,
            ErrorChannel.ENVIRONMENT_ERROR,
        ),
        (USER_ERROR, "toggle_data", ErrorChannel.USER_TOOL_ERROR, ErrorChannel.USER_TOOL_ERROR),
    ],
)
def test_each_kind_of_error_lands_in_its_channel(
    kind: str, name: str, with_schemas: ErrorChannel, without_schemas: ErrorChannel
) -> None:
    for tools, expected in ((RETAIL, with_schemas), (None, without_schemas)):
        result = _classify([Call(OK), Call(kind, name), Call(OK)], tools)
        assert result.errors == 1
        assert [f.channel for f in result.failures] == [expected]
        assert result.failures[0].tool_name == name


def test_calls_are_counted_per_side_and_wrong_tool_names_per_name() -> None:
    result = _classify(
        [
            Call(UNKNOWN, "get_weather"),
            Call(OK),
            Call(UNKNOWN, "get_weather"),
            Call(UNKNOWN, "lookup_order"),
            Call(USER_OK, "check_status_bar"),
            Call(USER_ERROR, "toggle_data"),
        ]
    )
    assert (result.agent_calls, result.user_calls) == (4, 2)
    assert result.wrong_tool_names() == Counter({"get_weather": 2, "lookup_order": 1})
    assert result.channels() == Counter(
        {ErrorChannel.UNKNOWN_TOOL: 3, ErrorChannel.USER_TOOL_ERROR: 1}
    )


def test_a_violation_that_raised_no_error_is_silent_and_spends_no_budget() -> None:
    data = episode("1", [Call(SCHEMA)])
    data["messages"][3].update(content='{"order_id": "#W0000001"}', error=False)
    result = classify_simulation(SimulationRun.model_validate(data), RETAIL)
    assert result.errors == 0
    assert [v.channel.value for v in result.silent] == ["schema_violation"]


def test_a_tool_call_leaked_into_the_text_is_a_silent_violation() -> None:
    data = episode("1")
    data["messages"][2]["content"] = (
        '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "#W1"}}</tool_call>'
    )
    result = classify_simulation(SimulationRun.model_validate(data), RETAIL)
    assert [v.channel.value for v in result.silent] == ["leaked_tool_call"]


def test_an_error_answering_no_recorded_call_is_classified_by_its_text() -> None:
    data = episode("1")
    data["messages"].append(
        {"role": "tool", "id": "nowhere", "content": "Error: Tool 'foo' not found.", "error": True}
    )
    result = classify_simulation(SimulationRun.model_validate(data), RETAIL)
    assert [(f.channel, f.tool_name) for f in result.failures] == [
        (ErrorChannel.UNKNOWN_TOOL, "foo")
    ]


def test_the_raw_response_text_of_the_arguments_is_what_gets_validated() -> None:
    data = episode("1", [Call(BUSINESS)])
    message = data["messages"][2]
    message["raw_data"] = {
        "finish_reason": "tool_calls",
        "message": {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": "get_order_details", "arguments": '{"order_id": 7}'},
                }
            ],
        },
    }
    result = classify_simulation(SimulationRun.model_validate(data), RETAIL)
    assert [f.channel for f in result.failures] == [ErrorChannel.SCHEMA_VIOLATION]


def test_a_missing_reward_counts_as_zero() -> None:
    data = episode("1", termination="infrastructure_error")
    del data["reward_info"]
    assert classify_simulation(SimulationRun.model_validate(data)).reward == 0.0


@pytest.mark.parametrize(
    ("text", "channel"),
    [
        ("Error: Tool 'x' not found.", ErrorChannel.UNKNOWN_TOOL),
        ("Error: Arguments of tool 'x' are not a JSON object: {", ErrorChannel.MALFORMED_ARGUMENTS),
        ("Error: f() missing 1 required positional argument: 'a'", ErrorChannel.SCHEMA_VIOLATION),
        ("Error: 1 validation error for Args\nx\n  Field required", ErrorChannel.SCHEMA_VIOLATION),
        ("Error: Order not found", None),
        ("Error: User not found", None),
        (None, None),
    ],
)
def test_error_texts_name_their_channel(text: str | None, channel: ErrorChannel | None) -> None:
    assert classify_error_text(text) is channel


def _recorded_errors(path: Path) -> tuple[int, Counter[str]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    errors = [
        m
        for s in data["simulations"]
        for m in s["messages"]
        if m["role"] == "tool" and m.get("error") is True
    ]
    return len(errors), Counter(m.get("requestor", "assistant") for m in errors)


@pytest.mark.parametrize(
    "fixture", ["tau2_results_file", "tau2_telecom_results_file"], ids=["retail", "telecom"]
)
@pytest.mark.parametrize("with_schemas", [True, False], ids=["schemas", "texts"])
def test_on_taus_results_every_recorded_error_falls_in_exactly_one_channel(
    fixture: str, with_schemas: bool, request: pytest.FixtureRequest, tau2_dir: Path
) -> None:
    path: Path = request.getfixturevalue(fixture)
    tools = default_tool_source(tau2_dir) if with_schemas else (lambda domain, results: None)
    (run,) = load_runs([path], tools=tools, resamples=200)
    recorded, by_requestor = _recorded_errors(path)
    channels = run.channels()
    assert sum(channels.values()) == run.errors == recorded
    assert channels[ErrorChannel.USER_TOOL_ERROR] == by_requestor["user"]
    assert sum(len(e.failures) for e in run.episodes) == recorded


def test_taus_retail_errors_are_business_errors_checked_against_the_retail_schemas(
    tau2_results_file: Path, tau2_dir: Path
) -> None:
    (run,) = load_runs([tau2_results_file], tools=default_tool_source(tau2_dir), resamples=200)
    assert run.schema_source is not None
    assert "retail" in run.schema_source
    # gpt-4.1 never called a tool that does not exist nor sent arguments its schema refuses;
    # its errors are the shop's refusals ("User not found", "Order not found", ...).
    assert run.channels()[ErrorChannel.ENVIRONMENT_ERROR] == run.errors > 0
    assert not run.wrong_tool_names()
