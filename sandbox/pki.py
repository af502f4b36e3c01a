"""Sandbox credentials: one CA, one serving certificate for every API server, the service-account
signing key and the admin bearer token.

Every API server of a sandbox listens on 127.0.0.1 (different ports), so one certificate with
SANs ``127.0.0.1``, ``localhost`` and the in-cluster ``kubernetes.default.svc`` names serves them
all; the CA goes into the kubeconfig so clients verify TLS. Files (``<state>/pki/``): ``ca.crt``,
``ca.key``, ``apiserver.crt``, ``apiserver.key``, ``sa.key``, ``sa.pub``, ``tokens.csv``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    """Paths of the sandbox credentials and the admin token (user ``admin``, group
    ``system:masters``, authenticated through ``--token-auth-file``)."""

    dir: Path
    token: str

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def serving_crt(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    @property
    def tokens_csv(self) -> Path:
        return self.dir / "tokens.csv"


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, mode: int = 0o600) -> None:
    path.write_bytes(data)
    path.chmod(mode)


def _server_cert(
    cn: str,
    key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    ca_key: ec.EllipticCurvePrivateKey,
    sans: list[x509.GeneralName],
    now: dt.datetime,
) -> x509.Certificate:
    """A server certificate (one year, serverAuth) for ``key``, signed by the CA."""
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def create_pki(directory: Path) -> Pki:
    """Create a CA, a serving cert (valid one year), an RSA service-account key pair and a random
    admin token under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufed-sandbox-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.96.0.1")),
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
    ]
    cert = _server_cert("kube-apiserver", key, ca_name, ca_key, sans, now)

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = secrets.token_hex(24)
    pki = Pki(directory, token)
    _write(pki.ca_crt, ca.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(directory / "ca.key", _pem_key(ca_key))
    _write(pki.serving_crt, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(pki.serving_key, _pem_key(key))
    _write(pki.sa_key, _pem_key(sa_key))
    _write(
        pki.sa_pub,
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
        0o644,
    )
    _write(pki.tokens_csv, f'{token},admin,admin-uid,"system:masters"\n'.encode())
    return pki


def load_pki(directory: Path) -> Pki:
    """The credentials written by :func:`create_pki` (reads the token back from tokens.csv)."""
    token = (directory / "tokens.csv").read_text().split(",", 1)[0]
    return Pki(directory, token)


def issue_server_cert(pki: Pki, name: str, hosts: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """Sign a server certificate for ``name`` with the sandbox CA (``pki/ca.key``).

    SANs: ``127.0.0.1``, ``localhost`` and ``hosts`` (DNS names or IP addresses). Writes
    ``<pki>/<name>.crt`` (0644) and ``<pki>/<name>.key`` (0600) and returns their paths; valid
    one year. Used for the hub's agent listener, so agents verify it with ``ca.crt``.
    """
    ca = x509.load_pem_x509_certificate(pki.ca_crt.read_bytes())
    ca_key = serialization.load_pem_private_key((pki.dir / "ca.key").read_bytes(), None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{pki.dir / 'ca.key'}: not the sandbox's EC CA key")
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.DNSName("localhost"),
    ]
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _server_cert(name, key, ca.subject, ca_key, sans, now)
    crt_path, key_path = pki.dir / f"{name}.crt", pki.dir / f"{name}.key"
    _write(crt_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(key_path, _pem_key(key))
    return crt_path, key_path
