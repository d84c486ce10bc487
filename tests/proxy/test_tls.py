"""The client side's TLS contexts (`proxy.tls.client_context`), for the upstreams and the OTLP
sender alike."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

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
