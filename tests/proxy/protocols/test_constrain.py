import copy
from typing import Any

import pytest

from proxy.guard.repair import ReaskPlan
from proxy.guard.strict import strict_form
from proxy.protocols import constrain

SCHEMA = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
STRICT = strict_form(SCHEMA)
NAMED = ReaskPlan(
    {"type": "function", "function": {"name": "lookup"}},
    "clear",
    {"lookup": STRICT},
    single_call=True,
)
REQUIRED = ReaskPlan(
    "required", "unclear", {"lookup": STRICT}, {"free": "free-form"}, single_call=True
)
NONE = ReaskPlan("none", "not wanted")


def chat_body() -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [],
        "tool_choice": "auto",
        "tools": [
            {"type": "function", "function": {"name": "lookup", "parameters": SCHEMA}},
            {"type": "function", "function": {"name": "free", "parameters": {"type": "object"}}},
        ],
    }


def responses_body() -> dict[str, Any]:
    return {
        "model": "m",
        "input": "hi",
        "tools": [
            {"type": "function", "name": "lookup", "parameters": SCHEMA},
            {"type": "function", "name": "free", "parameters": {"type": "object"}},
            {"type": "web_search"},
        ],
    }


def messages_body() -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 10,
        "messages": [],
        "tools": [
            {"name": "lookup", "input_schema": SCHEMA},
            {"name": "free", "input_schema": {"type": "object"}},
            {"type": "bash_20250124", "name": "bash"},
        ],
    }


def test_chat_gets_the_named_choice_strict_tools_and_one_call() -> None:
    body = chat_body()
    before = copy.deepcopy(body)
    out = constrain.chat(body, NAMED)
    assert body == before
    assert out["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert out["parallel_tool_calls"] is False
    lookup, free = out["tools"]
    assert lookup["function"]["strict"] is True
    assert lookup["function"]["parameters"] == STRICT.schema
    assert free == before["tools"][1]


def test_chat_none_changes_only_the_choice() -> None:
    out = constrain.chat(chat_body(), NONE)
    assert out == {**chat_body(), "tool_choice": "none"}


def test_responses_names_a_function_its_own_way_and_leaves_built_in_tools_alone() -> None:
    out = constrain.responses(responses_body(), NAMED)
    assert out["tool_choice"] == {"type": "function", "name": "lookup"}
    assert out["parallel_tool_calls"] is False
    lookup, free, search = out["tools"]
    assert (lookup["strict"], lookup["parameters"]) == (True, STRICT.schema)
    assert "strict" not in free
    assert search == {"type": "web_search"}
    assert constrain.responses(responses_body(), REQUIRED)["tool_choice"] == "required"


def test_responses_marks_a_namespaced_function_inside_its_namespace_and_asks_required_for_it() -> (
    None
):
    body = {
        "model": "m",
        "input": "hi",
        "tools": [
            {
                "type": "namespace",
                "name": "agents",
                "tools": [{"type": "function", "name": "spawn", "parameters": SCHEMA}],
            },
        ],
    }
    plan = ReaskPlan(
        {"type": "function", "function": {"name": "agents.spawn"}},
        "clear",
        {"agents.spawn": STRICT},
        single_call=True,
    )
    out = constrain.responses(body, plan)
    assert out["tool_choice"] == "required"
    (namespace,) = out["tools"]
    assert namespace["tools"][0] == {
        "type": "function",
        "name": "spawn",
        "parameters": STRICT.schema,
        "strict": True,
    }


@pytest.mark.parametrize(
    ("plan", "choice"),
    [
        (NAMED, {"type": "tool", "name": "lookup", "disable_parallel_tool_use": True}),
        (REQUIRED, {"type": "any", "disable_parallel_tool_use": True}),
        (NONE, {"type": "none"}),
    ],
)
def test_messages_speaks_anthropics_tool_choice(plan: ReaskPlan, choice: dict[str, Any]) -> None:
    out = constrain.messages(messages_body(), plan)
    assert out["tool_choice"] == choice
    lookup, free, bash = out["tools"]
    if plan.strict:
        assert (lookup["strict"], lookup["input_schema"]) == (True, STRICT.schema)
    assert "strict" not in free
    assert bash == {"type": "bash_20250124", "name": "bash"}


def test_a_plan_with_no_choice_leaves_the_requests_own() -> None:
    plan = ReaskPlan(None, "no tools")
    assert constrain.chat(chat_body(), plan) == chat_body()
    assert constrain.responses(responses_body(), plan) == responses_body()
    assert constrain.messages(messages_body(), plan) == messages_body()
