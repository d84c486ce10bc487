"""The request schema a turn route shows in the proxy's OpenAPI document: a JSON object with the
fields the turn reads, every other field allowed and passed through (DESIGN §8). Each protocol's
`schema.py` names its route and its fields; the envelope is written here once."""

from __future__ import annotations

from typing import Any


def request_body(required: str, properties: dict[str, Any]) -> dict[str, Any]:
    """The route's `requestBody`, as FastAPI's `openapi_extra` takes it: a required JSON body,
    an object that must have `required`, declares `properties` and allows any other field."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": [required],
                        "properties": properties,
                        "additionalProperties": True,
                    }
                }
            },
        }
    }
