"""`on_unrepaired` read into a policy per channel (proxy/guard/unrepaired.py)."""

from __future__ import annotations

import pytest

from proxy.guard.channels import Channel, Violation
from proxy.guard.repair import OnUnrepaired
from proxy.guard.unrepaired import DEFAULT_ON_UNREPAIRED, UnrepairedPolicy

UNKNOWN = Violation(Channel.UNKNOWN_TOOL, "no such tool", "x", 0)
SCHEMA = Violation(Channel.SCHEMA_VIOLATION, "missing order_id", "y", 1)
LEAKED = Violation(Channel.LEAKED_TOOL_CALL, "a call in the text", "y")


def test_one_value_applies_to_every_channel() -> None:
    policy = UnrepairedPolicy.read("reject")
    assert {policy.of(channel) for channel in Channel} == {OnUnrepaired.REJECT}


def test_the_default_strips_an_undeclared_tool_and_passes_every_other_failure() -> None:
    policy = UnrepairedPolicy.read(DEFAULT_ON_UNREPAIRED)
    assert policy.of(Channel.UNKNOWN_TOOL) is OnUnrepaired.STRIP
    others = {policy.of(channel) for channel in Channel if channel is not Channel.UNKNOWN_TOOL}
    assert others == {OnUnrepaired.PASSTHROUGH}


def test_a_mapping_without_default_passes_the_channels_it_does_not_name() -> None:
    policy = UnrepairedPolicy.read({"schema_violation": "reject"})
    assert policy.of(Channel.SCHEMA_VIOLATION) is OnUnrepaired.REJECT
    assert policy.of(Channel.UNKNOWN_TOOL) is OnUnrepaired.PASSTHROUGH


@pytest.mark.parametrize(
    ("violations", "expected"),
    [
        ([SCHEMA], OnUnrepaired.PASSTHROUGH),
        ([UNKNOWN, SCHEMA], OnUnrepaired.STRIP),
        ([UNKNOWN, SCHEMA, LEAKED], OnUnrepaired.REJECT),
    ],
)
def test_a_message_gets_the_strongest_policy_of_its_failures(
    violations: list[Violation], expected: OnUnrepaired
) -> None:
    policy = UnrepairedPolicy.read({"unknown_tool": "strip", "leaked_tool_call": "reject"})
    assert policy.strongest(violations) is expected


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"tool_error": "strip"}, "unknown channel 'tool_error'"),  # nothing to repair there
        ({"unknown_tool": "drop"}, "'drop' is not one of passthrough, strip, reject"),
        ("sometimes", "'sometimes' is not one of"),
    ],
)
def test_a_key_or_value_it_does_not_know_is_refused_by_name(value: object, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        UnrepairedPolicy.read(value)  # type: ignore[arg-type]
