"""Tests for proxy/protocols/messages/constrain.py."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.guard.repair import ReaskPlan
from proxy.protocols.messages.constrain import constrain
from tests.proxy.protocols.constrain_plans import NAMED, NONE, REQUIRED, STRICT, messages_body


@pytest.mark.parametrize(
    ("plan", "choice"),
    [
        (NAMED, {"type": "tool", "name": "lookup", "disable_parallel_tool_use": True}),
        (REQUIRED, {"type": "any", "disable_parallel_tool_use": True}),
        (NONE, {"type": "none"}),
    ],
)
def test_messages_speaks_anthropics_tool_choice(plan: ReaskPlan, choice: dict[str, Any]) -> None:
    out = constrain(messages_body(), plan)
    assert out["tool_choice"] == choice
    lookup, free, bash = out["tools"]
    if plan.strict:
        assert (lookup["strict"], lookup["input_schema"]) == (True, STRICT.schema)
    assert "strict" not in free
    assert bash == {"type": "bash_20250124", "name": "bash"}
