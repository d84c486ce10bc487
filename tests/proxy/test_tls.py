"""The client side's TLS contexts (`proxy.tls.client_context`), for the upstreams and the OTLP
sender alike."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from proxy.otlp import Sender
from proxy.tls import client_context
from tests.proxy.certificates import issue


def test_a_default_context_checks_the_certificate_and_the_name() -> None:
    context = client_context()
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname


def test_a_ca_file_is_the_only_trust_and_verify_false_trusts_anything(tmp_path: Path) -> None:
    certificates = issue(tmp_path)
    trusting = client_context(ca_file=str(certificates.ca))
    assert [c["subject"] for c in trusting.get_ca_certs()] == [
        ((("commonName", "toolsentry test CA"),),)
    ]
    unchecked = client_context(ca_file=str(certificates.ca), verify=False)
    assert unchecked.verify_mode == ssl.CERT_NONE
    assert not unchecked.check_hostname


def test_a_client_certificate_needs_its_key(tmp_path: Path) -> None:
    certificates = issue(tmp_path)
    client_context(
        client_cert=str(certificates.client_cert), client_key=str(certificates.client_key)
    )
    with pytest.raises(ssl.SSLError):
        client_context(client_cert=str(certificates.client_cert))  # the key is in another file


class _Accepting(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _https_server(context: ssl.SSLContext) -> Iterator[int]:
    """The standard library's HTTP server over TLS on a free loopback port, answering every POST
    200; its port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Accepting)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.handle_error = lambda *args: None  # type: ignore[method-assign]  # refused handshakes
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_the_otlp_sender_trusts_its_ca_and_shows_its_client_certificate(tmp_path: Path) -> None:
    certificates = issue(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificates.server_cert, certificates.server_key)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(certificates.ca)
    environ = {
        "OTEL_EXPORTER_OTLP_CERTIFICATE": str(certificates.ca),
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE": str(certificates.client_cert),
        "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(certificates.client_key),
    }
    with _https_server(context) as port:
        url = f"https://127.0.0.1:{port}/v1/traces"
        sender = Sender(url, environ, timeout_s=5)
        assert sender(b"spans")
        sender.close()
        anonymous = {"OTEL_EXPORTER_OTLP_CERTIFICATE": str(certificates.ca)}
        refused = Sender(url, anonymous, timeout_s=0.5)
        assert not refused(b"spans")
        refused.close()
