"""A real OTLP/HTTP trace receiver on loopback: it decodes the protobuf payloads the exporter
sends (`opentelemetry-proto`) into plain span records that tests can query."""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from proxy.testing import LoopbackServer

_KINDS = {1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
_STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which is None:
        return None
    return getattr(v, which)


@dataclass
class ReceivedSpan:
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    status: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    start_ns: int
    end_ns: int


@dataclass
class OTLPReceiver:
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    headers: list[dict[str, str]] = field(default_factory=list)
    refuse: list[int] = field(default_factory=list)
    """Statuses to answer the next exports with, before taking any (a busy collector's 503)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    server: LoopbackServer | None = None

    def take(self, raw: bytes) -> None:
        """Record the spans of one export request's protobuf bytes."""
        payload = ExportTraceServiceRequest.FromString(raw)
        received = []
        for resource_spans in payload.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for s in scope.spans:
                    received.append(
                        ReceivedSpan(
                            name=s.name,
                            kind=_KINDS.get(s.kind, str(s.kind)),
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            status=_STATUS.get(s.status.code, str(s.status.code)),
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            resource=resource,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(received)

    def app(self) -> Starlette:
        async def traces(request: Request) -> Response:
            with self._lock:
                self.headers.append(dict(request.headers))
                refused = self.refuse.pop(0) if self.refuse else None
            if refused is not None:
                return Response(status_code=refused)
            raw = await request.body()
            encoding = request.headers.get("content-encoding")
            if encoding == "gzip":
                raw = gzip.decompress(raw)
            elif encoding == "deflate":
                raw = zlib.decompress(raw)
            self.take(raw)
            return Response(
                ExportTraceServiceResponse().SerializeToString(),
                media_type="application/x-protobuf",
            )

        return Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])

    def start(self) -> OTLPReceiver:
        self.server = LoopbackServer(self.app()).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return self.server.url

    def wait_for(
        self, count: int, *, name: str | None = None, timeout: float = 15
    ) -> list[ReceivedSpan]:
        """The spans received (of `name` when given) once at least `count` have arrived."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                found = [s for s in self.spans if name is None or s.name == name]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.02)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]


@dataclass
class OTLPGrpcReceiver(OTLPReceiver):
    """The same receiver as a real gRPC server (grpcio) serving `TraceService/Export` on a
    loopback port; `refuse` holds gRPC status names (e.g. "UNAVAILABLE"), `headers` each call's
    metadata. With `tls` (server certificate, key, and the CA that must have signed a client's
    certificate, all PEM), it serves TLS and asks for a client certificate."""

    tls: tuple[bytes, bytes, bytes] | None = None
    port: int = 0
    _server: Any = None

    def _export(self, raw: bytes, context: Any) -> bytes:
        import grpc

        with self._lock:
            self.headers.append(dict(context.invocation_metadata()))
            refused = self.refuse.pop(0) if self.refuse else None
        if refused is not None:
            context.abort(getattr(grpc.StatusCode, str(refused)), "refused by the test")
        self.take(raw)
        return ExportTraceServiceResponse().SerializeToString()

    def start(self) -> OTLPGrpcReceiver:
        from concurrent.futures import ThreadPoolExecutor

        import grpc

        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler(
            "opentelemetry.proto.collector.trace.v1.TraceService",
            {"Export": grpc.unary_unary_rpc_method_handler(self._export)},
        )
        server.add_generic_rpc_handlers((handler,))
        if self.tls is None:
            self.port = server.add_insecure_port("127.0.0.1:0")
        else:
            cert, key, client_ca = self.tls
            credentials = grpc.ssl_server_credentials(
                [(key, cert)], root_certificates=client_ca, require_client_auth=True
            )
            self.port = server.add_secure_port("127.0.0.1:0", credentials)
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None)

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"
