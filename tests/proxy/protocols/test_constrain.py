"""Tests for proxy/protocols/constrain.py: every protocol's constrain, by its `api`."""

from __future__ import annotations

from proxy.guard.repair import ReaskPlan
from proxy.protocols.base import API
from proxy.protocols.constrain import FOR_API
from tests.proxy.protocols.constrain_plans import chat_body, messages_body, responses_body


def test_a_plan_with_no_choice_leaves_the_requests_own() -> None:
    plan = ReaskPlan(None, "no tools")
    assert FOR_API[API.CHAT](chat_body(), plan) == chat_body()
    assert FOR_API[API.RESPONSES](responses_body(), plan) == responses_body()
    assert FOR_API[API.MESSAGES](messages_body(), plan) == messages_body()


def test_every_protocol_has_its_constrain() -> None:
    assert set(FOR_API) == set(API)
