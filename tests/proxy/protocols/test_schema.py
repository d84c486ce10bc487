"""Tests for proxy/protocols/schema.py: the request schema envelope every turn route shows."""

from __future__ import annotations

from proxy.protocols.schema import request_body


def test_the_body_is_a_required_json_object_that_lets_every_other_field_through() -> None:
    properties = {"messages": {"type": "array"}}
    envelope = request_body("messages", properties)["requestBody"]
    schema = envelope["content"]["application/json"]["schema"]
    assert envelope["required"] is True
    assert list(envelope["content"]) == ["application/json"]
    assert schema == {
        "type": "object",
        "required": ["messages"],
        "properties": properties,
        "additionalProperties": True,
    }
