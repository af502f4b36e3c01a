"""Webhooks served by a sandbox process outside a pod: their CA and serving certificate, the
files and Secret that hold them, and the ``url:`` client configuration the API servers dial.

One helper for every such process (Kueue, :mod:`gpufed.sandbox.kueue_config`; the workload
operators, :mod:`gpufed.sandbox.operators`). Each listens on ``127.0.0.1``, so the serving
certificate carries the SANs ``127.0.0.1`` and ``localhost`` beside the in-cluster Service name
a certificate rotator (open-policy-agent/cert-controller, which Kueue, JobSet and the
training-operator embed) checks; the CA carries the name and organization that rotator checks,
so a rotator keeps the certificates it is seeded with instead of issuing its own. Pure functions:
no cluster, no process.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class WebhookCerts:
    """PEM bytes of a webhook CA and the serving certificate it signed."""

    ca_crt: bytes
    ca_key: bytes
    tls_crt: bytes
    tls_key: bytes

    @property
    def ca_bundle(self) -> str:
        """``caBundle`` value (base64 of the CA PEM)."""
        return base64.b64encode(self.ca_crt).decode()


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    # PKCS#1 RSA: the rotator parses the CA key with x509.ParsePKCS1PrivateKey.
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def create_webhook_certs(
    *,
    ca_name: str,
    organization: str,
    service: str,
    now: dt.datetime | None = None,
    days: int = 3650,
) -> WebhookCerts:
    """A CA (CN and DNS SAN ``ca_name``, organization ``organization``) and a serving
    certificate for the DNS name ``service``, ``127.0.0.1`` and ``localhost``, valid ``days``
    days from ``now`` (default: now, less 5 minutes of clock skew). RSA 2048, PKCS#1 keys."""
    start = (now or dt.datetime.now(dt.UTC)) - dt.timedelta(minutes=5)
    end = start + dt.timedelta(days=days)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization),
            x509.NameAttribute(NameOID.COMMON_NAME, ca_name),
        ]
    )
    usage = {
        "content_commitment": False,
        "key_encipherment": False,
        "data_encipherment": False,
        "key_agreement": False,
        "encipher_only": False,
        "decipher_only": False,
    }
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_subject)
        .issuer_name(ca_subject)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, **usage),
            critical=True,
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(ca_name)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sans: list[x509.GeneralName] = [
        x509.DNSName(service),
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, service)]))
        .issuer_name(ca_subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False, **usage),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return WebhookCerts(
        ca_crt=ca.public_bytes(pem),
        ca_key=_pem_key(ca_key),
        tls_crt=cert.public_bytes(pem),
        tls_key=_pem_key(key),
    )


def write_cert_dir(certs: WebhookCerts, cert_dir: Path) -> None:
    """``tls.crt`` (0644) and ``tls.key`` (0600) in ``cert_dir``, as a pod would mount them."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    (cert_dir / "tls.crt").write_bytes(certs.tls_crt)
    key = cert_dir / "tls.key"
    key.write_bytes(certs.tls_key)
    key.chmod(0o600)


def webhook_secret(certs: WebhookCerts, *, name: str, namespace: str) -> dict[str, Any]:
    """The Secret ``namespace/name`` a certificate rotator manages, seeded with ``certs``
    (keys ``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key``)."""
    data = {
        "ca.crt": certs.ca_crt,
        "ca.key": certs.ca_key,
        "tls.crt": certs.tls_crt,
        "tls.key": certs.tls_key,
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }


def url_webhook(
    hook: Mapping[str, Any], base_url: str, ca_bundle: str, *, source: str
) -> dict[str, Any]:
    """Upstream's webhook ``hook`` (one entry of a webhook configuration's ``webhooks``) with
    its ``clientConfig.service`` (path kept) turned into ``{url: <base_url><path>, caBundle}``.
    Raises ``ValueError`` naming ``source`` (the manifest) when the webhook has no service
    path: the upstream layout changed, read it and adjust the caller."""
    path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path")
    if not path:
        raise ValueError(
            f"{source}: webhook {hook.get('name')!r} has no clientConfig.service.path; the "
            "upstream webhook manifest changed shape"
        )
    return {**hook, "clientConfig": {"url": base_url + path, "caBundle": ca_bundle}}
