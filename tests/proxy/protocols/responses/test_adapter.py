"""Tests for proxy/protocols/responses/adapter.py: the Responses adapter's view and reading of an
upstream's body, without a network (and the builders the package's other tests share)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.errors import BadRequestError, UpstreamProtocolError
from proxy.guard.toolcheck import validate
from proxy.protocols.responses.adapter import ResponsesProtocol

PROTOCOL = ResponsesProtocol()
FUNCTION = {"type": "function", "name": "get", "parameters": {"type": "object"}}
NAMESPACE = {"type": "namespace", "name": "crm", "tools": [{"type": "function", "name": "find"}]}


def call_item(name: str, call_id: str, arguments: str = "{}", **extra: Any) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": "completed", **extra}  # fmt: skip


@pytest.mark.parametrize("body", [{}, {"input": 3}, {"input": "x", "tools": {}}])
def test_a_body_the_protocol_cannot_serve_is_a_bad_request(body: dict[str, Any]) -> None:
    with pytest.raises(BadRequestError):
        PROTOCOL.view(body, None)


LEAK = '<tool_call>\n{"name": "get", "arguments": {}}\n</tool_call>'


def leaks_in_reasoning(message: dict[str, Any]) -> list[tuple[str, bool, str | None]]:
    found = validate(message, None, index=PROTOCOL.compile_tools([FUNCTION]))
    return [(v.channel.value, v.in_reasoning, v.format) for v in found]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"output": [call_item("get", "c1"), "stray"]}, "output item that is not an object"),
        ({"output": [[call_item("get", "c1")]]}, "output item that is not an object"),
        ({"output": None}, "not a response"),
        (["not", "a", "body"], "not a response"),
    ],
)
def test_an_answer_that_is_not_a_response_is_the_upstreams_protocol_error(
    body: Any, says: str
) -> None:
    with pytest.raises(UpstreamProtocolError, match=f"upstream 'up'.*{says}"):
        PROTOCOL.read(body, "up")
    assert PROTOCOL.read({"output": [call_item("get", "c1")]}, "up").choices
