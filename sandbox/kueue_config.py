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
under that CA, so :func:`create_kueue_certs` issues exactly that (through
:mod:`gpufed.sandbox.webhookcerts`, shared with the workload operators), plus the SAN ``127.0.0.1`` the
API servers dial. The same files go into the webhook ``certDir`` (where a pod would mount the
Secret).
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

import yaml

from gpufed.api.fleet import ClusterSpec, node_specs
from gpufed.api.resources import parse_quantity
from gpufed.sandbox import webhookcerts as wc
from gpufed.sandbox.webhookcerts import WebhookCerts, create_webhook_certs, write_cert_dir

__all__ = ["WebhookCerts", "create_kueue_certs", "webhook_secret", "write_cert_dir"]

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


def create_kueue_certs(*, now: dt.datetime | None = None, days: int = 3650) -> WebhookCerts:
    """A CA ``kueue-ca`` (organization ``kueue``) and a serving certificate for
    ``kueue-webhook-service.kueue-system.svc``, ``127.0.0.1`` and ``localhost``: what Kueue's
    rotator accepts (:func:`gpufed.sandbox.webhookcerts.create_webhook_certs`); one set serves
    every Kueue of a sandbox (all listen on 127.0.0.1)."""
    return create_webhook_certs(
        ca_name="kueue-ca",
        organization="kueue",
        service=f"{WEBHOOK_SERVICE}.{KUEUE_NAMESPACE}.svc",
        now=now,
        days=days,
    )


def webhook_secret(certs: WebhookCerts) -> dict[str, Any]:
    """Kueue's rotator's Secret (``kueue-system/kueue-webhook-server-cert``) seeded with
    ``certs``."""
    return wc.webhook_secret(certs, name=WEBHOOK_SECRET, namespace=KUEUE_NAMESPACE)


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
            hooks.append(wc.url_webhook(hook, base_url, ca_bundle, source="kueue webhooks"))
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
