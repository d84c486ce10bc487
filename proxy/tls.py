"""The client side's TLS: the one function that builds an `ssl.SSLContext` from a CA bundle, a
client certificate and a verify switch, for the upstreams (`UpstreamTLS`) and the OTLP sender
(`OTEL_EXPORTER_OTLP_*CERTIFICATE` variables) alike."""

from __future__ import annotations

import ssl


def client_context(
    *,
    ca_file: str | None = None,
    client_cert: str | None = None,
    client_key: str | None = None,
    verify: bool = True,
) -> ssl.SSLContext:
    """A client context with the standard library's defaults (TLS 1.2 or later, hostname checked).

    `ca_file` replaces the system's trusted certificates (as curl's `--cacert` does); without it
    the system's are trusted (`SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured by OpenSSL).
    `client_cert` (PEM, the key in it or in `client_key`) is shown to a server that asks for
    one (mutual TLS). `verify=False` trusts any certificate for any name.

    Raises OSError when a file cannot be read, ssl.SSLError when it holds no usable certificate
    or key.
    """
    context = ssl.create_default_context(cafile=ca_file if verify else None)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if client_cert:
        context.load_cert_chain(client_cert, client_key or None)
    return context
