"""A sandbox certificate authority and server certificate for the agent gRPC listener.

Used by ``gpufed hub certs --out DIR`` and by the hub when it starts without certificates
(it then writes them into its data directory once and reuses them). Real deployments pass
their own certificates with ``--tls-cert``/``--tls-key``. Keys are ECDSA P-256; the server
certificate covers ``localhost``, ``127.0.0.1`` and any extra DNS names or IPs given.
"""

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
class CertFiles:
    """Paths of a generated set (PEM): CA certificate, server certificate and its key."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpufed sandbox"),
            x509.NameAttribute(NameOID.COMMON_NAME, cn),
        ]
    )


def generate(
    out_dir: Path,
    *,
    hosts: tuple[str, ...] = (),
    days: int = 365,
    overwrite: bool = False,
) -> CertFiles:
    """Write ``ca.crt``, ``ca.key``, ``server.crt`` and ``server.key`` into ``out_dir``.

    ``hosts``: extra DNS names or IP addresses for the server certificate. Existing files are
    kept (and returned) unless ``overwrite``. Keys are written with mode 0600.
    """
    files = CertFiles(out_dir / "ca.crt", out_dir / "server.crt", out_dir / "server.key")
    if not overwrite and all(
        p.exists() for p in (files.ca_cert, files.server_cert, files.server_key)
    ):
        return files
    out_dir.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("gpufed sandbox CA"))
        .issuer_name(_name("gpufed sandbox CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    ips = {"127.0.0.1", "::1"}
    for host in hosts:
        try:
            ips.add(str(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in sorted(ips)]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("gpufed-hub"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    _write(out_dir / "ca.key", _key_pem(ca_key), private=True)
    _write(files.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(files.server_key, _key_pem(key), private=True)
    _write(files.server_cert, cert.public_bytes(serialization.Encoding.PEM))
    return files


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)


def not_after(pem: bytes) -> float:
    """The ``notAfter`` of the first certificate in ``pem``, Unix seconds (for the
    ``gpufed_hub_tls_certificate_expiry_timestamp_seconds`` gauge). ``ValueError`` when
    ``pem`` holds no certificate."""
    cert = x509.load_pem_x509_certificate(pem)
    return cert.not_valid_after_utc.timestamp()
