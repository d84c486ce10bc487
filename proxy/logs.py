"""Structured JSON logs (structlog): one event per request, secrets always redacted.

Message bodies are not logged unless `log_bodies` is on; `authorization` and anything that looks
like an API key is masked whatever the setting, at any depth of the event.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping, MutableMapping
from datetime import UTC, datetime
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
    # Strings first: nearly every value of a request event is a string or a number.
    if isinstance(value, str):
        return REDACTED if value[:7].lower() == "bearer " else value
    if isinstance(value, dict):
        return {
            k: REDACTED if str(k).lower() in _SECRET_KEYS else redact(v) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value


def _redact_processor(
    logger: Any, method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    # The per-request event (one a request) holds short strings, numbers and None under a few
    # fixed keys: those are settled here without a call per value, and in place (the event is
    # the logger's own copy, or the request's fields, used up).
    for key, value in event.items():
        secret = _secret_keys.get(key)
        if secret is None:
            secret = key.lower() in _SECRET_KEYS
            if len(_secret_keys) < _MAX_REMEMBERED_KEYS:
                _secret_keys[key] = secret
        if secret:
            event[key] = REDACTED
        elif type(value) is str:
            if value[:7].lower() == "bearer ":
                event[key] = REDACTED
        elif value is not None and type(value) not in _PLAIN:
            event[key] = redact(value)
    return event


_secret_keys: dict[str, bool] = {}
_MAX_REMEMBERED_KEYS = 1024
_PLAIN = frozenset({int, float, bool})


class _UTCStamper:
    """`timestamp`: ISO 8601 in UTC with microseconds (`2026-11-30T09:55:49.375315Z`), the
    date and time of day formatted once a second (1.9 → 0.8 µs an event)."""

    def __init__(self) -> None:
        self._cached = (-1, "")

    def __call__(
        self, logger: Any, method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        second, micro = divmod(time.time_ns() // 1000, 1_000_000)
        cached_second, prefix = self._cached
        if second != cached_second:
            prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
            self._cached = (second, prefix)
        event["timestamp"] = f"{prefix}{micro:06d}Z"
        return event


def _render_bytes(logger: Any, method: str, event: MutableMapping[str, Any]) -> bytes:
    return _encode(event, 0)


def _bytes_line(event: MutableMapping[str, Any]) -> bytes:
    return _encode(event, orjson.OPT_APPEND_NEWLINE)


def _encode(event: MutableMapping[str, Any], option: int) -> bytes:
    try:
        return orjson.dumps(event, default=str, option=option)
    except TypeError:  # an integer beyond 64 bits, which orjson refuses: written as its digits
        return orjson.dumps(_big_ints_as_text(event), default=str, option=option)


def _big_ints_as_text(value: Any) -> Any:
    if isinstance(value, int) and not -(2**63) <= value < 2**64:
        return str(value)
    if isinstance(value, Mapping):
        return {k: _big_ints_as_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_big_ints_as_text(v) for v in value]
    return value


def _render_text(logger: Any, method: str, event: MutableMapping[str, Any]) -> str:
    return _render_bytes(logger, method, event).decode()


def _text_line(event: MutableMapping[str, Any]) -> str:
    return _bytes_line(event).decode()


# Writes one request event; None while the level is above info. Set by configure_logging.
_request_sink: Callable[[dict[str, Any]], None] | None = None


def log_request(fields: dict[str, Any]) -> None:
    """Log the per-request `request` event at info level.

    The line is the one `get_logger().info("request", **fields)` writes: the same
    processors run in the same order on the same stream, without structlog's per-call
    machinery (binding, copying the context, the logger's lock), which cost about as much as
    the processors themselves on an event a request. `fields` is used up.
    """
    sink = _request_sink
    if sink is not None:
        sink(fields)


def configure_logging(level: str = "info", stream: TextIO | None = None) -> None:
    """Set up structlog to write one JSON object per line to `stream` (stderr by default)."""
    global _request_sink
    stream = stream or sys.stderr
    # A stream over a binary buffer (stderr, a file) gets orjson's bytes as they are, skipping a
    # decode and re-encode per event; a text-only stream (StringIO) gets text.
    binary = getattr(stream, "buffer", None)
    factory: Any
    write: Callable[[Any], Any]
    line: Callable[[MutableMapping[str, Any]], Any]
    if binary is not None:
        stream.flush()
        render: Any = _render_bytes
        factory = structlog.BytesLoggerFactory(binary)
        write, flush, line = binary.write, binary.flush, _bytes_line
    else:
        render = _render_text
        factory = structlog.WriteLoggerFactory(stream)
        write, flush, line = stream.write, stream.flush, _text_line
    merge, stamp = structlog.contextvars.merge_contextvars, _UTCStamper()
    processors = [merge, structlog.processors.add_log_level, stamp, _redact_processor, render]
    threshold = _LEVELS.get(level, logging.INFO)

    def request_sink(fields: dict[str, Any]) -> None:
        # The processors above in their order, called as structlog calls them for an info event
        # (`add_log_level` sets the level it is called for).
        fields["event"] = "request"
        event = merge(None, "info", fields)
        event["level"] = "info"
        # The renderer's bytes with the newline: one write a line, so that lines from other
        # threads never interleave.
        rendered: Any = line(_redact_processor(None, "info", stamp(None, "info", event)))
        write(rendered)
        flush()

    _request_sink = request_sink if threshold <= logging.INFO else None
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=factory,
        # Bind once per logger instead of on every event (3 µs each): a logger keeps the
        # configuration it first logged with, so configure before create_app.
        cache_logger_on_first_use=True,
    )


def get_logger(name: str = "toolsentry") -> Any:
    """The proxy's logger."""
    return structlog.get_logger(name)
