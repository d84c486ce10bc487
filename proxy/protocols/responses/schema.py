"""The Responses route and its request schema, as the proxy's OpenAPI document shows it: the
fields the turn reads; every other field is allowed and passed through (DESIGN §8)."""

from __future__ import annotations

from typing import Final

from proxy.protocols.schema import request_body

ROUTE: Final = "/v1/responses"
"""The route the proxy serves the protocol at."""

REQUEST_BODY: Final = request_body(
    "input",
    {
        "model": {"type": "string"},
        "input": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "object"}},
            ]
        },
        "instructions": {"type": "string"},
        "tools": {"type": "array", "items": {"type": "object"}},
        "tool_choice": {},
        "previous_response_id": {"type": "string"},
        "stream": {"type": "boolean"},
    },
)
"""The route's `requestBody`, as FastAPI's `openapi_extra` takes it."""
