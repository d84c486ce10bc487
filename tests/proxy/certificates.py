"""Certificates for the TLS tests, made with `cryptography`: a private CA that issues a server
certificate for 127.0.0.1 and a client certificate, and a self-signed server certificate."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Certificates:
    """PEM files: the CA's certificate, the server's and the client's certificates and keys."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    *,
    ca: bool = False,
    usage: x509.ObjectIdentifier | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    # The identifiers and the CA's key usage that OpenSSL's strict checks (Python 3.13's
    # default) ask for.
    builder = builder.add_extension(
        x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
    ).add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
        critical=False,
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_file, key_file = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


def issue(directory: Path) -> Certificates:
    """A CA, and a server certificate for 127.0.0.1 and a client certificate it signed."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _certificate("toolsentry test CA", ca_key, None, ca=True)
    signer = (ca_cert.subject, ca_key)
    server_key = ec.generate_private_key(ec.SECP256R1())
    client_key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate("127.0.0.1", server_key, signer, usage=ExtendedKeyUsageOID.SERVER_AUTH)
    client = _certificate("the proxy", client_key, signer, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    ca_file, _ = _write(directory, "ca", ca_cert, ca_key)
    server_files = _write(directory, "server", server, server_key)
    client_files = _write(directory, "client", client, client_key)
    return Certificates(ca_file, *server_files, *client_files)


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A server certificate for 127.0.0.1 signed by its own key, and that key."""
    key = ec.generate_private_key(ec.SECP256R1())
    return _write(directory, "self-signed", _certificate("127.0.0.1", key, None), key)
