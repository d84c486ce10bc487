"""The Anthropic Messages route and its request schema, as the proxy's OpenAPI document shows it: the
fields the turn reads; every other field is allowed and passed through (DESIGN §8)."""

from __future__ import annotations

from typing import Final

from proxy.protocols.schema import request_body

ROUTE: Final = "/v1/messages"
"""The route the proxy serves the protocol at."""

REQUEST_BODY: Final = request_body(
    "messages",
    {
        "model": {"type": "string"},
        "max_tokens": {"type": "integer"},
        "messages": {"type": "array", "items": {"type": "object"}},
        "system": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "object"}},
            ]
        },
        "tools": {"type": "array", "items": {"type": "object"}},
        "tool_choice": {"type": "object"},
        "stream": {"type": "boolean"},
    },
)
"""The route's `requestBody`, as FastAPI's `openapi_extra` takes it."""
