"""Trace context into and out of the proxy, as `OTEL_PROPAGATORS` names it (DESIGN §9).

The variable lists propagators, comma-separated, as every OpenTelemetry SDK reads it; unset, it
is `tracecontext,baggage`, and `none` turns propagation off. A request's parent is extracted by
each propagator in turn, a later one's context replacing an earlier one's (the SDK's composite
propagator); each upstream try carries the context in every listed format.

- `tracecontext` (W3C `traceparent` / `tracestate`) is read and written here: it is on the path
  of every traced request, where the SDK's context objects cost more than the parsing.
- `baggage` (W3C `baggage`) goes upstream as the client sent it, as every end-to-end header does
  (proxy/upstream.py's forwarding); the proxy adds no entries of its own.
- Any other name (`b3`, `b3multi`, `jaeger`, `xray`, …) is the OpenTelemetry propagator
  registered under it (the `opentelemetry_propagator` entry points: `pip install
  opentelemetry-propagator-b3` for B3), so its reading of the headers is the library's.

A name that is unknown, or whose package is not installed, is a configuration error at start.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from functools import partial
from importlib.metadata import entry_points
from typing import Any

from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
    TraceState,
    get_current_span,
    set_span_in_context,
)

from proxy.errors import ConfigError

DEFAULT = ("tracecontext", "baggage")

_TRACEPARENT = re.compile(
    r"^[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?[ \t]*$"
)


@dataclass(frozen=True, slots=True)
class Parent:
    """The client's span a request's trace continues."""

    trace_id: int
    span_id: int
    flags: int
    trace_state: str = ""


def parse_traceparent(value: str | None) -> tuple[int, int, int] | None:
    """(trace id, span id, flags) of a `traceparent` header, None when it is absent or invalid
    (W3C trace context: version ff, all-zero ids, or a version-00 header with more fields)."""
    if not value:
        return None
    match = _TRACEPARENT.match(value)
    if match is None:
        return None
    version, trace_hex, span_hex, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, int(flags, 16)


def traceparent(trace_id: int, span_id: int, sampled: bool) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def _trace_context(headers: Mapping[str, str]) -> Parent | None:
    parent = parse_traceparent(headers.get("traceparent"))
    if parent is None:
        return None
    state = headers.get("tracestate")
    trace_state = TraceState.from_header([state]).to_header() if state else ""
    return Parent(*parent, trace_state=trace_state)


def _registered(name: str) -> TextMapPropagator:
    """The OpenTelemetry propagator registered as `name`; ConfigError when there is none."""
    found = entry_points(group="opentelemetry_propagator", name=name)
    if not found:
        hint = " (pip install opentelemetry-propagator-b3)" if name.startswith("b3") else ""
        raise ConfigError(
            f"OTEL_PROPAGATORS: no propagator named {name!r} is installed{hint}; "
            f"known here: tracecontext, baggage, none"
            + "".join(f", {e.name}" for e in entry_points(group="opentelemetry_propagator"))
        )
    propagator: Any = next(iter(found)).load()()
    if not isinstance(propagator, TextMapPropagator):
        raise ConfigError(f"OTEL_PROPAGATORS: {name!r} is not a text-map propagator")
    return propagator


def _library_parent(propagator: TextMapPropagator, headers: Mapping[str, str]) -> Parent | None:
    context = get_current_span(propagator.extract(headers)).get_span_context()
    if context is INVALID_SPAN_CONTEXT or not context.is_valid:
        return None
    state = context.trace_state.to_header() if context.trace_state else ""
    return Parent(context.trace_id, context.span_id, int(context.trace_flags), state)


class Propagation:
    """The propagators `OTEL_PROPAGATORS` lists, reading a request's headers and writing an
    upstream try's."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        self._w3c = "tracecontext" in self.names
        self._others = [_registered(n) for n in self.names if n not in ("tracecontext", "baggage")]
        # Readers in the listed order: a later one's parent replaces an earlier one's.
        others = iter(self._others)
        self._readers: list[Callable[[Mapping[str, str]], Parent | None]] = [
            _trace_context if n == "tracecontext" else partial(_library_parent, next(others))
            for n in self.names
            if n != "baggage"
        ]

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Propagation:
        value = environ.get("OTEL_PROPAGATORS", "")
        names = [n.strip().lower() for n in value.split(",") if n.strip()]
        if not names:
            return cls(DEFAULT)
        if "none" in names:
            return cls(())
        return cls(list(dict.fromkeys(names)))

    def extract(self, headers: Mapping[str, str]) -> Parent | None:
        """The client's span the request continues; None: a new trace."""
        parent = None
        for read in self._readers:
            parent = read(headers) or parent
        return parent

    def inject(
        self,
        headers: MutableMapping[str, str],
        parent: Parent,
        sampled: bool,
    ) -> None:
        """Write the context of `parent` (an upstream try's span) in every listed format."""
        if self._w3c:
            headers["traceparent"] = traceparent(parent.trace_id, parent.span_id, sampled)
            if parent.trace_state:
                headers["tracestate"] = parent.trace_state
        if self._others:
            context = SpanContext(
                parent.trace_id,
                parent.span_id,
                is_remote=False,
                trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT),
                trace_state=TraceState.from_header([parent.trace_state])
                if parent.trace_state
                else None,
            )
            carrier = set_span_in_context(NonRecordingSpan(context))
            for propagator in self._others:
                propagator.inject(headers, context=carrier)


W3C = Propagation(DEFAULT)
"""The default: W3C trace context (and baggage, forwarded as it came)."""
