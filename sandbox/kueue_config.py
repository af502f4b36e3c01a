"""What a Kueue manager outside a pod needs, rendered as data: its Configuration file, its
webhook certificates, the webhook configurations and CRDs pointed at ``https://127.0.0.1:<port>``
instead of a Service, and the queue objects of a MultiKueue setup (manager and workers).

Pure functions (no cluster, no process); :mod:`gpufed.sandbox.multikueue` writes and applies
what they return. Upstream's YAML is an input read at run time from the Go module cache
(:func:`gpufed.sandbox.kueue.kueue_module_dir`), never a committed copy.

Certificates. Kueue v0.17 outside its internal certificate management reads a metrics
certificate from the fixed path ``/etc/kueue/metrics/certs`` (no flag moves it), so the sandbox
keeps internal certificate management *on* (Kueue's default install) and seeds the Secret it
manages (``kueue-system/kueue-webhook-server-cert``) with a CA and serving certificate of its
own. Kueue's rotator (open-policy-agent/cert-controller) keeps a Secret whose CA verifies as
``kueue-ca`` and whose serving certificate verifies as ``kueue-webhook-service.kueue-system.svc``
under that CA, so :func:`create_kueue_certs` issues exactly that, plus the SAN ``127.0.0.1`` the
API servers dial. The same files go into the webhook ``certDir`` (where a pod would mount the
Secret).
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpufed.api.fleet import ClusterSpec, node_specs
from gpufed.api.resources import parse_quantity

KUEUE_NAMESPACE = "kueue-system"
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"
#: Names Kueue's rotator injects its CA into (``<service base>-<type>-webhook-configuration``).
MUTATING_WEBHOOKS = "kueue-mutating-webhook-configuration"
VALIDATING_WEBHOOKS = "kueue-validating-webhook-configuration"
#: CRDs served with a conversion webhook (upstream's crd/kustomization.yaml patches and the
#: rotator's CRDConversion list).
CONVERSION_CRDS = (
    "localqueues.kueue.x-k8s.io",
    "clusterqueues.kueue.x-k8s.io",
    "cohorts.kueue.x-k8s.io",
    "workloads.kueue.x-k8s.io",
    "multikueueclusters.kueue.x-k8s.io",
)
#: API groups whose webhooks the sandbox installs: Kueue's own objects and batch/v1 Jobs (the
#: one integration enabled). A production install also registers the webhooks of every other
#: framework (pods, JobSets, Ray ...), answered by no-op handlers when the framework is off.
WEBHOOK_GROUPS = frozenset({"kueue.x-k8s.io", "batch"})
MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_API = "kueue.x-k8s.io/v1beta2"

FLAVOR = "default-flavor"
CLUSTER_QUEUE = "gpufed-bench"
LOCAL_QUEUE = "gpufed-bench"
ADMISSION_CHECK = "gpufed-multikueue"
MULTIKUEUE_CONFIG = "gpufed-multikueue"
#: Resources the ClusterQueues cover: what the bench Jobs request (nvidia.com/gpu) and what a
#: pod may add (cpu, memory). Every resource a Workload requests must be covered.
QUOTA_RESOURCES = ("cpu", "memory", "nvidia.com/gpu")


@dataclass(frozen=True)
class KueuePorts:
    """The TCP ports on 127.0.0.1 one Kueue manager listens on."""

    webhook: int
    metrics: int
    health: int

    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook}"


@dataclass(frozen=True)
class KueueCerts:
    """PEM bytes of the Kueue CA (``kueue-ca``) and the webhook serving certificate."""

    ca_crt: bytes
    ca_key: bytes
    tls_crt: bytes
    tls_key: bytes

    @property
    def ca_bundle(self) -> str:
        """``caBundle`` value (base64 of the CA PEM)."""
        return base64.b64encode(self.ca_crt).decode()


# --- configuration ---------------------------------------------------------------------------


def configuration(
    ports: KueuePorts,
    cert_dir: Path,
    *,
    qps: float | None = None,
    burst: int | None = None,
    role: str = "worker",
) -> dict[str, Any]:
    """The ``config.kueue.x-k8s.io/v1beta2`` Configuration of one manager (``--config``).

    Upstream's default (config/components/manager) with: every port on 127.0.0.1 and free-picked
    (``ports``), the webhook certificates in ``cert_dir``, leader election off (one replica),
    only the ``batch/job`` integration, ``clientConnection.qps/burst`` only when given (None
    leaves Kueue's built-in defaults, 20 and 30; upstream's shipped manifests say 50/100) and
    the visibility API server off (an aggregated API on a fixed port, which the sandbox does not
    register). ``role`` (``manager`` or ``worker``) only labels the file; MultiKueue runs in
    both and acts where MultiKueue objects exist.
    """
    if role not in ("manager", "worker"):
        raise ValueError(f"role: {role!r}; use 'manager' or 'worker'")
    cfg: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports.health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports.metrics}"},
        "webhook": {"host": "127.0.0.1", "port": ports.webhook, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": WEBHOOK_SERVICE,
            "webhookSecretName": WEBHOOK_SECRET,
        },
        "controller": {
            "groupKindConcurrency": {
                "Job.batch": 5,
                "Pod": 5,
                "Workload.kueue.x-k8s.io": 5,
                "LocalQueue.kueue.x-k8s.io": 1,
                "Cohort.kueue.x-k8s.io": 1,
                "ClusterQueue.kueue.x-k8s.io": 1,
                "ResourceFlavor.kueue.x-k8s.io": 1,
            }
        },
        "integrations": {"frameworks": ["batch/job"]},
        "featureGates": {"VisibilityOnDemand": False},
    }
    conn: dict[str, Any] = {}
    if qps is not None:
        if qps <= 0:
            raise ValueError(f"qps: {qps}; give a positive number of requests per second")
        conn["qps"] = qps
    if burst is not None:
        if burst <= 0:
            raise ValueError(f"burst: {burst}; give a positive number of requests")
        conn["burst"] = burst
    if conn:
        cfg["clientConnection"] = conn
    return cfg


# --- certificates ----------------------------------------------------------------------------


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    # PKCS#1 RSA: the rotator parses the CA key with x509.ParsePKCS1PrivateKey.
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def create_kueue_certs(
    *,
    now: dt.datetime | None = None,
    days: int = 3650,
    ca_name: str = "kueue-ca",
    organization: str = "kueue",
    service: str = f"{WEBHOOK_SERVICE}.{KUEUE_NAMESPACE}.svc",
) -> KueueCerts:
    """A CA (CN and DNS SAN ``ca_name``, organization ``organization``) and a serving
    certificate for ``service``, ``127.0.0.1`` and ``localhost``, valid ``days`` days from
    ``now`` (default: now, less 5 minutes of clock skew). The defaults are what Kueue's rotator
    accepts; one set serves every Kueue of a sandbox (all listen on 127.0.0.1). The workload
    operators' webhooks (:mod:`gpufed.sandbox.operators`) pass their own rotator's names."""
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
    return KueueCerts(
        ca_crt=ca.public_bytes(pem),
        ca_key=_pem_key(ca_key),
        tls_crt=cert.public_bytes(pem),
        tls_key=_pem_key(key),
    )


def write_cert_dir(certs: KueueCerts, cert_dir: Path) -> None:
    """``tls.crt`` (0644) and ``tls.key`` (0600) in ``cert_dir``, as a pod would mount them."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    (cert_dir / "tls.crt").write_bytes(certs.tls_crt)
    key = cert_dir / "tls.key"
    key.write_bytes(certs.tls_key)
    key.chmod(0o600)


def webhook_secret(
    certs: KueueCerts, *, name: str = WEBHOOK_SECRET, namespace: str = KUEUE_NAMESPACE
) -> dict[str, Any]:
    """The Secret a certificate rotator (open-policy-agent/cert-controller) manages, seeded
    (keys ``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key``); by default Kueue's."""
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


# --- webhooks and CRDs -----------------------------------------------------------------------


def _rules_groups(webhook: Mapping[str, Any]) -> set[str]:
    return {g for rule in webhook.get("rules") or [] for g in rule.get("apiGroups") or []}


def webhook_configurations(
    manifests: str, base_url: str, ca_bundle: str, *, groups: Iterable[str] = WEBHOOK_GROUPS
) -> list[dict[str, Any]]:
    """Upstream's ``config/components/webhook/manifests.yaml`` (text) rewritten for a manager
    outside a pod: each webhook's ``clientConfig.service`` (path kept) becomes
    ``{url: <base_url><path>, caBundle}``; only webhooks whose rules name nothing but
    ``groups`` are kept; the configurations are renamed to the names Kueue's rotator looks
    after (:data:`MUTATING_WEBHOOKS`, :data:`VALIDATING_WEBHOOKS`). Raises ``ValueError`` when
    the manifest holds no webhook configuration or a webhook without a service path (the
    upstream layout changed: read it and adjust this function)."""
    keep = set(groups)
    names = {
        "MutatingWebhookConfiguration": MUTATING_WEBHOOKS,
        "ValidatingWebhookConfiguration": VALIDATING_WEBHOOKS,
    }
    out: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(manifests):
        if not isinstance(doc, dict) or doc.get("kind") not in names:
            continue
        hooks = []
        for hook in doc.get("webhooks") or []:
            hook_groups = _rules_groups(hook)
            if not hook_groups or not hook_groups <= keep:
                continue
            path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path")
            if not path:
                raise ValueError(
                    f"webhook {hook.get('name')!r} has no clientConfig.service.path; the "
                    "upstream webhook manifest changed shape"
                )
            hooks.append({**hook, "clientConfig": {"url": base_url + path, "caBundle": ca_bundle}})
        out.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": doc["kind"],
                "metadata": {"name": names[doc["kind"]]},
                "webhooks": hooks,
            }
        )
    if not out:
        raise ValueError("no Mutating/ValidatingWebhookConfiguration in the webhook manifest")
    return out


def crds(documents: Sequence[str], base_url: str, ca_bundle: str) -> list[dict[str, Any]]:
    """The CRDs of upstream's ``config/components/crd/bases`` (one YAML text per file), those in
    :data:`CONVERSION_CRDS` with the conversion webhook upstream's patches add, pointed at
    ``<base_url>/convert`` with ``ca_bundle``. Sorted by name."""
    out = []
    for text in documents:
        for doc in yaml.safe_load_all(text):
            if not isinstance(doc, dict) or doc.get("kind") != "CustomResourceDefinition":
                continue
            name = doc["metadata"]["name"]
            meta = {"name": name}
            doc = {**doc, "metadata": meta}
            if name in CONVERSION_CRDS:
                doc["spec"] = {
                    **doc["spec"],
                    "conversion": {
                        "strategy": "Webhook",
                        "webhook": {
                            "clientConfig": {"url": f"{base_url}/convert", "caBundle": ca_bundle},
                            "conversionReviewVersions": ["v1"],
                        },
                    },
                }
            out.append(doc)
    return sorted(out, key=lambda d: str(d["metadata"]["name"]))


# --- queue objects ---------------------------------------------------------------------------


def cluster_quota(clusters: Iterable[ClusterSpec]) -> dict[str, str]:
    """Sum of node allocatable over ``clusters`` for :data:`QUOTA_RESOURCES` (whole units,
    rounded up: cpu in cores, memory in bytes, GPUs as counted by the device plugin)."""
    total = dict.fromkeys(QUOTA_RESOURCES, Decimal(0))
    for cluster in clusters:
        for node in node_specs(cluster):
            for res in QUOTA_RESOURCES:
                raw = node.allocatable.get(res)
                if raw is not None:
                    total[res] += parse_quantity(raw, field=f"node {node.name} {res}")
    return {r: str(int(v.to_integral_value(rounding=ROUND_CEILING))) for r, v in total.items()}


def resource_flavor() -> dict[str, Any]:
    return {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}}


def cluster_queue(
    quota: Mapping[str, str], *, admission_check: str | None = None
) -> dict[str, Any]:
    """The ClusterQueue :data:`CLUSTER_QUEUE`: one flavor, ``quota`` as nominal quota, every
    namespace; on the manager with the MultiKueue ``admission_check``."""
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": list(quota),
                "flavors": [
                    {
                        "name": FLAVOR,
                        "resources": [{"name": r, "nominalQuota": q} for r, q in quota.items()],
                    }
                ],
            }
        ],
    }
    if admission_check:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": admission_check}]}
    return {
        "apiVersion": KUEUE_API,
        "kind": "ClusterQueue",
        "metadata": {"name": CLUSTER_QUEUE},
        "spec": spec,
    }


def local_queue(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_API,
        "kind": "LocalQueue",
        "metadata": {"name": LOCAL_QUEUE, "namespace": namespace},
        "spec": {"clusterQueue": CLUSTER_QUEUE},
    }


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def kubeconfig_secret_name(member: str) -> str:
    return f"multikueue-{member}"


def kubeconfig_secret(member: str, kubeconfig: str) -> dict[str, Any]:
    """The Secret (key ``kubeconfig``) a MultiKueueCluster reads its worker's credentials from."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": kubeconfig_secret_name(member), "namespace": KUEUE_NAMESPACE},
        "type": "Opaque",
        "data": {"kubeconfig": base64.b64encode(kubeconfig.encode()).decode()},
    }


def multikueue_cluster(member: str) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_API,
        "kind": "MultiKueueCluster",
        "metadata": {"name": member},
        "spec": {
            "clusterSource": {
                "kubeConfig": {
                    "locationType": "Secret",
                    "location": kubeconfig_secret_name(member),
                }
            }
        },
    }


def multikueue_config(members: Sequence[str]) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_API,
        "kind": "MultiKueueConfig",
        "metadata": {"name": MULTIKUEUE_CONFIG},
        "spec": {"clusters": list(members)},
    }


def admission_check() -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_API,
        "kind": "AdmissionCheck",
        "metadata": {"name": ADMISSION_CHECK},
        "spec": {
            "controllerName": MULTIKUEUE_CONTROLLER,
            "parameters": {
                "apiGroup": "kueue.x-k8s.io",
                "kind": "MultiKueueConfig",
                "name": MULTIKUEUE_CONFIG,
            },
        },
    }
