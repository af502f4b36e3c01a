"""The shared webhook certificate helper: the serving certificate verifies under its CA for
every name the API servers and a rotator check, keys are PKCS#1, and a webhook's Service
becomes a ``url:`` (or the manifest's shape change is named)."""

from __future__ import annotations

import datetime as dt
import ipaddress

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from gpufed.sandbox import webhookcerts as wc


def check_issued(certs: wc.WebhookCerts, *, ca_name: str, organization: str, service: str) -> None:
    """What cert-controller's rotator and the API servers check of seeded certificates: the CA
    named ``ca_name`` (CN, DNS SAN) of ``organization``, the serving certificate signed by it,
    valid now, for ``service``, ``localhost`` and ``127.0.0.1``; PKCS#1 RSA keys (the rotator
    parses them with x509.ParsePKCS1PrivateKey). Shared by the Kueue and operator tests."""
    ca = x509.load_pem_x509_certificate(certs.ca_crt)
    leaf = x509.load_pem_x509_certificate(certs.tls_crt)
    assert ca.subject.rfc4514_string() == f"CN={ca_name},O={organization}"
    ca_sans = ca.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ca_sans.get_values_for_type(x509.DNSName) == [ca_name]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(sans.get_values_for_type(x509.DNSName)) == sorted(["localhost", service])
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert leaf.issuer == ca.subject
    ca_pub = ca.public_key()
    assert isinstance(ca_pub, rsa.RSAPublicKey)
    assert leaf.signature_hash_algorithm is not None
    ca_pub.verify(
        leaf.signature,
        leaf.tbs_certificate_bytes,
        padding.PKCS1v15(),
        leaf.signature_hash_algorithm,
    )
    now = dt.datetime.now(dt.UTC)
    assert leaf.not_valid_before_utc < now < leaf.not_valid_after_utc
    for key in (certs.ca_key, certs.tls_key):
        assert key.startswith(b"-----BEGIN RSA PRIVATE KEY-----")
        assert isinstance(load_pem_private_key(key, None), rsa.RSAPrivateKey)


def test_the_serving_certificate_is_signed_by_its_ca_and_names_the_service_and_127_0_0_1() -> None:
    certs = wc.create_webhook_certs(ca_name="x-ca", organization="x", service="x.ns.svc")
    check_issued(certs, ca_name="x-ca", organization="x", service="x.ns.svc")


def test_a_webhook_service_becomes_a_url_and_a_missing_path_is_named() -> None:
    hook = {"name": "v.x.io", "clientConfig": {"service": {"name": "s", "path": "/validate"}}}
    out = wc.url_webhook(hook, "https://127.0.0.1:9443", "Q0E=", source="m.yaml")
    assert out["clientConfig"] == {"url": "https://127.0.0.1:9443/validate", "caBundle": "Q0E="}
    assert out["name"] == "v.x.io"
    with pytest.raises(ValueError, match=r"m\.yaml: webhook 'v\.x\.io' has no clientConfig"):
        wc.url_webhook({"name": "v.x.io", "clientConfig": {}}, "https://h", "", source="m.yaml")


def test_the_secret_holds_the_four_pem_files_base64() -> None:
    import base64

    certs = wc.WebhookCerts(b"a", b"b", b"c", b"d")
    secret = wc.webhook_secret(certs, name="n", namespace="ns")
    assert secret["metadata"] == {"name": "n", "namespace": "ns"}
    got = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert got == {"ca.crt": b"a", "ca.key": b"b", "tls.crt": b"c", "tls.key": b"d"}
