"""Traces over OTLP/gRPC (`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`): the real proxy exports to a real
grpcio collector serving `TraceService/Export`, plain and over TLS with a client certificate, with
the exporter variables' headers and compression; a busy collector is retried and a refusing one
is not; a protocol the proxy does not send is refused at start, in one line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from proxy.testing import completion, tool_call
from tests.proxy.builders import make_request
from tests.proxy.certificates import issue
from tests.proxy.conftest import RunningProxy, RunningUpstream
from tests.proxy.metrics_text import metric
from tests.proxy.otlp_receiver import OTLPGrpcReceiver

REPO = Path(__file__).resolve().parents[2]
TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE}-b7ad6b7169203331-01"
VALID = completion(tool_calls=[tool_call("get_order_details", {"order_id": "W1"})])


@pytest.fixture
def collector() -> Iterator[OTLPGrpcReceiver]:
    running = OTLPGrpcReceiver().start()
    yield running
    running.stop()


def traced_request(proxy: RunningProxy, upstream: RunningUpstream) -> None:
    upstream.script.push(VALID)
    with proxy.http() as http:
        response = http.post(
            "/v1/chat/completions", json=make_request(), headers={"traceparent": TRACEPARENT}
        )
    assert response.status_code == 200


def test_spans_reach_a_grpc_collector_with_the_variables_headers_gzip_compressed(
    make_proxy: Callable[..., RunningProxy],
    upstream: RunningUpstream,
    collector: OTLPGrpcReceiver,
) -> None:
    environ = {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20collector-token,x-tenant=agents",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    proxy = make_proxy(environ=environ)
    traced_request(proxy, upstream)
    spans = collector.wait_for(2)
    assert {s.kind for s in spans if s.trace_id == TRACE} == {"SERVER", "CLIENT"}
    metadata = collector.headers[0]
    assert metadata["authorization"] == "Bearer collector-token"
    assert metadata["x-tenant"] == "agents"
    assert metadata["user-agent"].startswith("grpc-python/")  # a real gRPC client's call


def test_a_tls_collector_that_asks_for_a_client_certificate_gets_the_configured_one(
    make_proxy: Callable[..., RunningProxy], upstream: RunningUpstream, tmp_path: Path
) -> None:
    # The collector's certificate and the proxy's, both issued by one CA the other side trusts.
    made = issue(tmp_path)
    tls = (made.server_cert.read_bytes(), made.server_key.read_bytes(), made.ca.read_bytes())
    files = {
        "ca.pem": str(made.ca),
        "client.pem": str(made.client_cert),
        "client-key.pem": str(made.client_key),
    }
    collector = OTLPGrpcReceiver(tls=tls).start()
    try:
        environ = {
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.endpoint,
            "OTEL_EXPORTER_OTLP_CERTIFICATE": files["ca.pem"],
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": files["client.pem"],
            "OTEL_EXPORTER_OTLP_CLIENT_KEY": files["client-key.pem"],
        }
        proxy = make_proxy(environ=environ)
        traced_request(proxy, upstream)
        assert proxy.app.state.pipeline.tracing.force_flush()
        assert {s.kind for s in collector.wait_for(2) if s.trace_id == TRACE} >= {"SERVER"}
        # Without the client certificate the collector refuses the handshake: counted drops.
        bare = {k: v for k, v in environ.items() if "CLIENT" not in k}
        refused = make_proxy(environ={**bare, "OTEL_EXPORTER_OTLP_TIMEOUT": "1"})
        traced_request(refused, upstream)
        refused.app.state.pipeline.tracing.shutdown()
        with refused.http() as http:
            text = http.get("/metrics").text
        assert metric(text, "toolsentry_trace_spans_dropped_total", reason="export_failed") >= 2
    finally:
        collector.stop()


def test_a_busy_collector_is_retried_and_a_refusing_one_is_not(
    make_proxy: Callable[..., RunningProxy],
    upstream: RunningUpstream,
    collector: OTLPGrpcReceiver,
) -> None:
    environ = {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
    }
    collector.refuse.extend(["UNAVAILABLE", "UNAVAILABLE"])
    busy = make_proxy(environ=environ)
    traced_request(busy, upstream)
    assert busy.app.state.pipeline.tracing.force_flush()
    assert len(collector.wait_for(2)) >= 2
    busy.app.state.pipeline.tracing.shutdown()  # nothing more comes from it
    calls = len(collector.headers)
    assert calls >= 3  # two refusals, then the export taken
    collector.refuse.append("INVALID_ARGUMENT")
    refusing = make_proxy(environ=environ)
    before = collector.requests
    traced_request(refusing, upstream)
    refusing.app.state.pipeline.tracing.force_flush()
    assert collector.requests == before
    assert len(collector.headers) == calls + 1  # refused once, not retried
    with refusing.http() as http:
        text = http.get("/metrics").text
    assert metric(text, "toolsentry_trace_spans_dropped_total", reason="export_failed") == 2


@pytest.mark.parametrize(
    ("variable", "message"),
    [
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL=http/json",
            "toolsentry sends traces as http/protobuf or grpc",
        ),
        ("OTEL_PROPAGATORS=tracecontext,nonesuch", "no propagator named 'nonesuch'"),
    ],
)
def test_what_the_proxy_cannot_do_is_refused_at_start_in_one_line(
    variable: str, message: str
) -> None:
    name, _, value = variable.partition("=")
    env = {
        "PATH": "/usr/bin:/bin",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        name: value,
    }
    started = subprocess.run(
        [
            sys.executable,
            "-m",
            "proxy.cli",
            "serve",
            "--upstream",
            "http://127.0.0.1:9/v1",
            "--port",
            "0",
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert started.returncode == 2, started.stderr
    assert message in started.stderr
    assert len(started.stderr.strip().splitlines()) == 1, started.stderr
