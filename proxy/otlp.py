"""The export side of the proxy's traces: the span record the event loop fills, its OTLP
protobuf encoding (what the OpenTelemetry SDK's exporter produces, tested against it), the
OTLP/HTTP sender, and the bounded queue its worker thread drains (proxy/tracing.py records the
spans; DESIGN §9)."""

from __future__ import annotations

import gzip
import http.client
import random
import ssl
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import (
    SpanKind,
)
from opentelemetry.util.re import parse_env_headers

from proxy.tls import client_context

# -- spans as the event loop records them ------------------------------------------------------

_KINDS = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3}


class SpanRecord:
    """One span: what the OTLP encoding needs and nothing else. `error` None is status UNSET;
    a string (possibly empty) is status ERROR with that description."""

    __slots__ = (
        "attributes",
        "end",
        "error",
        "kind",
        "name",
        "parent_id",
        "remote_parent",
        "span_id",
        "start",
        "trace_id",
        "trace_state",
    )

    def __init__(
        self,
        name: str,
        kind: SpanKind,
        trace_id: int,
        parent_id: int,
        attributes: dict[str, Any],
        *,
        trace_state: str = "",
        remote_parent: bool = False,
        start: int | None = None,
    ) -> None:
        self.name = name
        self.kind = kind
        self.trace_id = trace_id
        self.span_id = new_id(64)
        self.parent_id = parent_id
        self.remote_parent = remote_parent
        self.trace_state = trace_state
        self.attributes = attributes
        self.start = time.time_ns() if start is None else start
        self.end = self.start
        self.error: str | None = None


def new_id(bits: int) -> int:
    """A random, non-zero id (what the SDK's RandomIdGenerator draws)."""
    while True:
        value = random.getrandbits(bits)
        if value:
            return value


# -- OTLP protobuf -------------------------------------------------------------------------------
# ExportTraceServiceRequest of opentelemetry-proto's trace/v1 and common/v1, written field by
# field: a tag byte ((field << 3) | wire type), then a varint, fixed-size bytes, or a length and
# that many bytes.


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field."""
    return tag + _varint(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    """An AnyValue, as the SDK's exporter encodes attribute values (bool before int)."""
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int64: two's complement
    if isinstance(value, float):
        return b"\x21" + struct.pack("<d", value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(v)) for v in value))
    raise TypeError(f"an attribute value cannot be {type(value).__name__}")


def _key_value(key: str, value: Any) -> bytes:
    """A KeyValue message."""
    return _field(b"\x0a", key.encode()) + _field(b"\x12", _any_value(value))


_SEEN: dict[tuple[str, type, Any], bytes] = {}
"""Span attribute fields already encoded, by key, type and value: most repeat from request to
request (operation, model, route, status, channel). Bounded: past `_SEEN_MAX` entries a new
value is encoded each time it comes."""
_SEEN_MAX = 4096


def _span_attributes(attributes: Mapping[str, Any]) -> list[bytes]:
    """A span's attribute fields (9); None values are left out, as the SDK does."""
    out = []
    for key, value in attributes.items():
        if value is None:
            continue
        kind = value.__class__
        if kind is list:
            out.append(_field(b"\x4a", _key_value(key, value)))
            continue
        encoded = _SEEN.get((key, kind, value))
        if encoded is None:
            encoded = _field(b"\x4a", _key_value(key, value))
            if len(_SEEN) < _SEEN_MAX:
                _SEEN[key, kind, value] = encoded
        out.append(encoded)
    return out


def _span(span: SpanRecord) -> bytes:
    parts = [
        b"\x0a\x10" + span.trace_id.to_bytes(16, "big"),
        b"\x12\x08" + span.span_id.to_bytes(8, "big"),
    ]
    if span.trace_state:
        parts.append(_field(b"\x1a", span.trace_state.encode()))
    if span.parent_id:
        parts.append(b"\x22\x08" + span.parent_id.to_bytes(8, "big"))
    parts.append(_field(b"\x2a", span.name.encode()))
    parts.append(b"\x30" + _varint(_KINDS[span.kind]))
    parts.append(b"\x39" + struct.pack("<Q", span.start))
    parts.append(b"\x41" + struct.pack("<Q", span.end))
    parts.extend(_span_attributes(span.attributes))
    if span.error is None:
        parts.append(b"\x7a\x00")  # status UNSET
    else:
        status = _field(b"\x12", span.error.encode()) if span.error else b""
        parts.append(_field(b"\x7a", status + b"\x18\x02"))  # status ERROR
    # SpanFlags: whether the parent is remote is known (0x100), and whether it is (0x200).
    parts.append(b"\x85\x01" + struct.pack("<I", 0x300 if span.remote_parent else 0x100))
    return b"".join(parts)


class Encoder:
    """ExportTraceServiceRequest payloads for one resource and the proxy's one scope: what the
    SDK's OTLP exporter (`encode_spans`) sends for the same spans."""

    def __init__(self, resource: Resource, scope: str, schema_url: str) -> None:
        self._resource = _field(
            b"\x0a",
            b"".join(_field(b"\x0a", _key_value(k, v)) for k, v in resource.attributes.items()),
        )
        self._resource_schema = (
            _field(b"\x1a", resource.schema_url.encode()) if resource.schema_url else b""
        )
        self._scope = _field(b"\x0a", _field(b"\x0a", scope.encode()))
        self._scope_schema = _field(b"\x1a", schema_url.encode()) if schema_url else b""

    def encode(self, spans: Sequence[SpanRecord]) -> bytes:
        scope_spans = b"".join(
            [self._scope, *(_field(b"\x12", _span(s)) for s in spans), self._scope_schema]
        )
        resource_spans = self._resource + _field(b"\x12", scope_spans) + self._resource_schema
        return _field(b"\x0a", resource_spans)


# -- the OTLP/HTTP endpoint ------------------------------------------------------------------------

_RETRYABLE = frozenset({429, 502, 503, 504})


def exporter_var(environ: Mapping[str, str], name: str) -> str:
    """`OTEL_EXPORTER_OTLP_TRACES_<name>`, else `OTEL_EXPORTER_OTLP_<name>`, else ""."""
    return (
        environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}")
        or environ.get(f"OTEL_EXPORTER_OTLP_{name}")
        or ""
    ).strip()


def retried(attempt: Callable[[float], bool | None], timeout_s: float) -> bool:
    """`attempt(deadline)` until it says taken (True) or refused (False), retried with a backoff
    from 0.1 s, doubling, while it says worth retrying (None) and `timeout_s` has not passed.
    Whether the payload was taken."""
    deadline = time.monotonic() + timeout_s
    backoff = 0.1
    while True:
        outcome = attempt(deadline)
        if outcome is not None:
            return outcome
        pause = min(backoff, deadline - time.monotonic())
        if pause <= 0:
            return False
        time.sleep(pause)
        backoff *= 2


class Sender:
    """POSTs payloads to an OTLP/HTTP traces URL over one kept-alive connection, with the
    exporter variables' headers, compression and TLS files; a failure worth retrying (no
    connection, 429, 502-504) is retried with backoff until `timeout_s` has passed."""

    def __init__(self, url: str, environ: Mapping[str, str], timeout_s: float) -> None:
        def var(name: str) -> str:
            return exporter_var(environ, name)

        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an OTLP/HTTP URL: {url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.timeout_s = timeout_s
        self._headers = {"Content-Type": "application/x-protobuf"}
        self._headers.update(parse_env_headers(var("HEADERS"), liberal=True))
        compression = var("COMPRESSION").lower()
        self._compress: Callable[[bytes], bytes] | None = None
        if compression == "gzip":
            self._compress, self._headers["Content-Encoding"] = gzip.compress, "gzip"
        elif compression == "deflate":
            self._compress, self._headers["Content-Encoding"] = zlib.compress, "deflate"
        self._tls: ssl.SSLContext | None = None
        if self._https:
            self._tls = client_context(
                ca_file=var("CERTIFICATE") or None,
                client_cert=var("CLIENT_CERTIFICATE") or None,
                client_key=var("CLIENT_KEY") or None,
            )
        self._connection: http.client.HTTPConnection | None = None

    def __call__(self, payload: bytes) -> bool:
        """Whether the endpoint took the payload (a 2xx)."""
        body = self._compress(payload) if self._compress else payload

        def attempt(deadline: float) -> bool | None:
            status = self._post(body, deadline)
            if status is not None and 200 <= status < 300:
                return True
            return None if status is None or status in _RETRYABLE else False

        return retried(attempt, self.timeout_s)

    def _post(self, body: bytes, deadline: float) -> int | None:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            connection = self._connection
            if connection is None:
                if self._https:
                    connection = http.client.HTTPSConnection(
                        self._host, self._port, timeout=left, context=self._tls
                    )
                else:
                    connection = http.client.HTTPConnection(self._host, self._port, timeout=left)
                self._connection = connection
            else:
                connection.timeout = left
                if connection.sock is not None:
                    connection.sock.settimeout(left)
            connection.request("POST", self._path, body, self._headers)
            response = connection.getresponse()
            response.read()
            if response.will_close:
                self.close()
            return response.status
        except (OSError, http.client.HTTPException):
            self.close()
            return None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


# -- the queue and its worker ----------------------------------------------------------------------


class Exporter:
    """Spans queue here from the event loop (`add`, a lock and an append); a worker thread takes
    them in batches, encodes and sends them. The queue holds at most `capacity` spans: beyond,
    a span is dropped and counted (`queue_full`), and a batch the endpoint did not take is
    counted too (`export_failed`); every span ended is either delivered or counted."""

    def __init__(
        self,
        encode: Callable[[Sequence[SpanRecord]], bytes],
        send: Callable[[bytes], bool],
        *,
        capacity: int,
        batch: int,
        delay_s: float,
        on_drop: Callable[[str, int], None],
    ) -> None:
        self._encode = encode
        self._send = send
        self.capacity = capacity
        self._batch = batch
        self._delay_s = delay_s
        self._on_drop = on_drop
        self._queue: deque[SpanRecord] = deque()
        self._lock = threading.Lock()
        self._sending = threading.Lock()  # one batch in flight: the worker's or a flush's
        self._wake = threading.Event()
        self.stopping = False
        self._worker = threading.Thread(target=self._run, name="toolsentry-otlp", daemon=True)
        self._worker.start()

    def add(self, span: SpanRecord) -> None:
        with self._lock:
            queued = len(self._queue)
            if queued < self.capacity:
                self._queue.append(span)
        if queued >= self.capacity:
            self._on_drop("queue_full", 1)
        elif queued + 1 >= self._batch:
            self._wake.set()

    def _run(self) -> None:
        while not self.stopping:
            self._wake.wait(self._delay_s)
            self._wake.clear()
            self._drain()

    def _drain(self, *, last: bool = False) -> None:
        """Send batches until the queue is empty. At shutdown (`last`, or the worker's drain
        when shutdown began), after a batch the endpoint did not take, the rest is counted as
        failed too instead of waited for: stopping takes one export timeout, not one a batch."""
        with self._sending:
            while True:
                with self._lock:
                    n = min(len(self._queue), self._batch)
                    spans = [self._queue.popleft() for _ in range(n)]
                if not spans:
                    return
                try:
                    delivered = self._send(self._encode(spans))
                except Exception:  # a bug here must not end the worker: the spans are counted
                    delivered = False
                if not delivered:
                    if last or self.stopping:
                        with self._lock:
                            n += len(self._queue)
                            self._queue.clear()
                    self._on_drop("export_failed", n)

    def force_flush(self) -> bool:
        """Send what is queued now, in the caller's thread; whether the queue is empty after."""
        self._drain()
        with self._lock:
            return not self._queue

    def shutdown(self) -> None:
        self.stopping = True
        self._wake.set()
        self._worker.join()
        self._drain(last=True)
