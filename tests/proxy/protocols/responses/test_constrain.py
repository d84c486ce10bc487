"""Tests for proxy/protocols/responses/constrain.py."""

from __future__ import annotations

from proxy.guard.repair import ReaskPlan
from proxy.protocols.responses.constrain import constrain
from tests.proxy.protocols.constrain_plans import NAMED, REQUIRED, SCHEMA, STRICT, responses_body


def test_responses_names_a_function_its_own_way_and_leaves_built_in_tools_alone() -> None:
    out = constrain(responses_body(), NAMED)
    assert out["tool_choice"] == {"type": "function", "name": "lookup"}
    assert out["parallel_tool_calls"] is False
    lookup, free, search = out["tools"]
    assert (lookup["strict"], lookup["parameters"]) == (True, STRICT.schema)
    assert "strict" not in free
    assert search == {"type": "web_search"}
    assert constrain(responses_body(), REQUIRED)["tool_choice"] == "required"


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
    out = constrain(body, plan)
    assert out["tool_choice"] == "required"
    (namespace,) = out["tools"]
    assert namespace["tools"][0] == {
        "type": "function",
        "name": "spawn",
        "parameters": STRICT.schema,
        "strict": True,
    }
