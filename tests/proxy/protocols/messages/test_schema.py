"""Tests for proxy/protocols/messages/schema.py: the Messages route and the request schema the OpenAPI
document shows."""

from __future__ import annotations

from proxy.protocols.messages.schema import REQUEST_BODY, ROUTE


def test_the_route_requires_its_conversation_and_lets_every_other_field_through() -> None:
    body = REQUEST_BODY["requestBody"]["content"]["application/json"]["schema"]
    assert ROUTE == "/v1/messages"
    assert body["required"] == ["messages"]
    assert body["additionalProperties"] is True
    assert {"model", "tools", "tool_choice", "stream"} <= set(body["properties"])
