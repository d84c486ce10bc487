"""Structured JSON logs (structlog): one event per request, secrets always redacted.

Message bodies are not logged unless `log_bodies` is on; `authorization` and anything that looks
like an API key is masked whatever the setting, at any depth of the event.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import orjson
import structlog

REDACTED = "[redacted]"
_SECRET_KEYS = frozenset(
    {
        "authorization",
        "api_key",
        "api-key",
        "x-api-key",
        "admin_key",
        "api_keys",
        "password",
        "token",
    }
)
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def redact(value: Any) -> Any:
    """A copy of `value` with every secret-named key masked, at any depth."""
    if isinstance(value, dict):
        return {
            k: REDACTED if str(k).lower() in _SECRET_KEYS else redact(v) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str) and value.lower().startswith("bearer "):
        return REDACTED
    return value


def _redact_processor(
    logger: Any, method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    return {k: REDACTED if k.lower() in _SECRET_KEYS else redact(v) for k, v in event.items()}


def _render(logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
    return orjson.dumps(event, default=str).decode()


def configure_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """Set up structlog to write one JSON object per line to `stream` (stderr by default)."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact_processor,
            _render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.WriteLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str = "toolsentry") -> Any:
    """The proxy's logger."""
    return structlog.get_logger(name)
