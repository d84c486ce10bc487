"""Tests for each protocol's schema.py: the route and the request schema the OpenAPI document shows."""

from __future__ import annotations

from types import ModuleType

import pytest

from proxy.protocols.chat import schema as chat
from proxy.protocols.messages import schema as messages
from proxy.protocols.responses import schema as responses


@pytest.mark.parametrize(
    ("schema", "route", "required"),
    [
        (chat, "/v1/chat/completions", ["messages"]),
        (responses, "/v1/responses", ["input"]),
        (messages, "/v1/messages", ["messages"]),
    ],
)
def test_each_route_requires_its_conversation_and_lets_every_other_field_through(
    schema: ModuleType, route: str, required: list[str]
) -> None:
    body = schema.REQUEST_BODY["requestBody"]["content"]["application/json"]["schema"]
    assert route == schema.ROUTE
    assert body["required"] == required
    assert body["additionalProperties"] is True
    assert {"model", "tools", "tool_choice", "stream"} <= set(body["properties"])
