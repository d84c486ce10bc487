"""OTLP over gRPC (`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`): the payload OTLP/HTTP carries (an
`ExportTraceServiceRequest`, proxy/otlp.py's encoding) sent to the collector's
`TraceService/Export` with grpcio, an optional dependency (`pip install 'toolsentry[otlp-grpc]'`).

The exporter variables are read as the OpenTelemetry SDK's gRPC exporter reads them: the endpoint's
scheme says whether the channel is plain (`http`) or TLS (`https`; without a scheme,
`OTEL_EXPORTER_OTLP_INSECURE` decides, TLS by default), `…_CERTIFICATE`, `…_CLIENT_CERTIFICATE`
and `…_CLIENT_KEY` are files, `…_HEADERS` become call metadata, `…_COMPRESSION=gzip` compresses.
A status OTLP calls retryable is retried with backoff until the export timeout has passed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.util.re import parse_env_headers

from proxy.errors import ConfigError
from proxy.otlp import exporter_var, retried

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
DEFAULT_ENDPOINT = "http://localhost:4317"
_RETRYABLE = frozenset(
    {"CANCELLED", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "OUT_OF_RANGE"}
    | {"UNAVAILABLE", "DATA_LOSS"}
)


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


class GrpcSender:
    """Sends payloads on one gRPC channel; a call is `__call__(payload) -> taken`."""

    def __init__(self, endpoint: str, environ: Mapping[str, str], timeout_s: float) -> None:
        try:
            import grpc
        except ImportError:
            raise ConfigError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs grpcio: pip install 'toolsentry[otlp-grpc]'"
            ) from None
        self._grpc: Any = grpc
        parts = urlsplit(endpoint if "://" in endpoint else f"//{endpoint}")
        if parts.scheme not in ("", "http", "https") or not parts.hostname:
            raise ConfigError(f"not an OTLP/gRPC endpoint: {endpoint!r}")
        insecure = exporter_var(environ, "INSECURE").lower() == "true"
        secure = parts.scheme == "https" or (not parts.scheme and not insecure)
        target = f"{parts.hostname}:{parts.port or 4317}"
        compression = None
        if exporter_var(environ, "COMPRESSION").lower() == "gzip":
            compression = grpc.Compression.Gzip
        if secure:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(exporter_var(environ, "CERTIFICATE")),
                private_key=_read(exporter_var(environ, "CLIENT_KEY")),
                certificate_chain=_read(exporter_var(environ, "CLIENT_CERTIFICATE")),
            )
            self._channel = grpc.secure_channel(target, credentials, compression=compression)
        else:
            self._channel = grpc.insecure_channel(target, compression=compression)
        headers = parse_env_headers(exporter_var(environ, "HEADERS"), liberal=True)
        self._metadata = tuple((key.lower(), value) for key, value in headers.items())
        # No (de)serializers: the payload is already the request's protobuf bytes.
        self._export = self._channel.unary_unary(EXPORT)
        self.timeout_s = timeout_s

    def __call__(self, payload: bytes) -> bool:
        """Whether the collector took the payload (status OK)."""

        def attempt(deadline: float) -> bool | None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                self._export(payload, timeout=left, metadata=self._metadata)
            except self._grpc.RpcError as failed:
                return None if failed.code().name in _RETRYABLE else False
            return True

        return retried(attempt, self.timeout_s)

    def close(self) -> None:
        self._channel.close()
