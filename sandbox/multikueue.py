"""MultiKueue, the peer gpufed is measured against, run in a sandbox: one Kueue manager per
cluster as supervisor components (``kueue/hub``, ``kueue/<member>``), the hub's configured as
the MultiKueue manager and the members' as its workers.

Called on a sandbox started *without* the gpufed control plane (clusters only)::

    info = Sandbox(state_dir).up(fleet)                    # no control_plane
    mk = start_multikueue(Sandbox(state_dir), info, options=MultiKueueOptions(qps=1000, burst=1000))
    # a batch/v1 Job in mk.namespace on the hub labelled {mk.queue_label: mk.local_queue}
    # runs in exactly one member; its Complete status shows on the hub Job.

What it sets up, per cluster (docs/sandbox.md "MultiKueue (the peer)"): Kueue's CRDs read from
the pinned module (:mod:`gpufed.sandbox.kueue`) with their conversion webhook, the namespace
``kueue-system``, the webhook certificates and configurations pointing at
``https://127.0.0.1:<port>`` (:mod:`gpufed.sandbox.kueue_config`), a manager running with the
sandbox's admin kubeconfig, a ResourceFlavor, a ClusterQueue and, in the job namespace, a
LocalQueue of the same names everywhere. Members' ClusterQueues get their own GPUs (and cpu,
memory) as quota; the hub's gets the whole fleet's and the MultiKueue AdmissionCheck, whose
MultiKueueConfig lists one MultiKueueCluster per member, each reading the member's admin
kubeconfig from a Secret in ``kueue-system``. The hub runs no kube-controller-manager: the
hub's Jobs are suspended and handed to MultiKueue (``spec.managedBy``), so none is needed there.

Files: ``<state>/kueue/<cluster>/config.yaml`` and ``certs/``; logs under
``<state>/logs/kueue/<cluster>.log``. ``Sandbox.down()`` stops the managers with the rest.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, Field
from urllib3.exceptions import HTTPError

from gpufed.api.fleet import HUB_CLUSTER_NAME, FleetSpec
from gpufed.sandbox import kueue_config as kc
from gpufed.sandbox.binaries import BinariesError
from gpufed.sandbox.kube import CORE_PATHS, kube_request, server_side_apply
from gpufed.sandbox.kueue import ensure_kueue, kueue_crd_dir, kueue_webhook_manifests
from gpufed.sandbox.runtime import Sandbox, free_ports
from gpufed.sandbox.state import SandboxError, SandboxInfo
from gpufed.sandbox.supervisor import ComponentError, ComponentSpec, Probe

log = structlog.get_logger("gpufed.sandbox.multikueue")

Progress = Callable[[str], None]


class MultiKueueOptions(BaseModel):
    """Client rate limits of every Kueue manager (``clientConnection.qps/burst`` of its
    Configuration): None keeps Kueue's defaults (20 QPS, burst 30); the "fast" configuration
    of MultiKueue's published figures is ``qps=1000, burst=1000``."""

    qps: float | None = Field(default=None, gt=0, le=100_000, allow_inf_nan=False)
    burst: int | None = Field(default=None, ge=1, le=100_000)


class MultiKueueInfo(BaseModel):
    """What a caller needs to submit work to the MultiKueue manager."""

    namespace: str
    """Where Jobs are submitted on the hub (and copied to members)."""
    local_queue: str
    """Value for :attr:`queue_label` on a Job."""
    queue_label: str = kc.QUEUE_LABEL
    components: list[str]
    """Supervisor component names of the Kueue managers (``kueue/hub`` first)."""


def component_name(cluster: str) -> str:
    """``kueue/<cluster>``."""
    return f"kueue/{cluster}"


# --- small Kubernetes helpers (raw JSON, server-side apply) -------------------------------------

_KUEUE_PLURALS = {
    "ResourceFlavor": ("resourceflavors", False),
    "ClusterQueue": ("clusterqueues", False),
    "LocalQueue": ("localqueues", True),
    "AdmissionCheck": ("admissionchecks", False),
    "MultiKueueConfig": ("multikueueconfigs", False),
    "MultiKueueCluster": ("multikueueclusters", False),
}


def object_path(obj: Mapping[str, Any]) -> str:
    """REST path of ``obj`` (one of the kinds this module applies); ``KeyError`` otherwise."""
    kind = obj["kind"]
    meta = obj["metadata"]
    if kind in _KUEUE_PLURALS:
        plural, namespaced = _KUEUE_PLURALS[kind]
        prefix = f"/apis/{kc.KUEUE_API}"
    else:
        prefix, plural, namespaced = CORE_PATHS[kind]
    ns = f"/namespaces/{meta['namespace']}" if namespaced else ""
    return f"{prefix}{ns}/{plural}/{meta['name']}"


def _apply(api: k8s.ApiClient, obj: Mapping[str, Any]) -> None:
    server_side_apply(api, object_path(obj), obj)


def _get(api: k8s.ApiClient, obj: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        return kube_request(api, "GET", object_path(obj), timeout_s=10)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _condition_true(obj: Mapping[str, Any] | None, kind: str) -> bool:
    conds = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conds)


def _apply_retrying(api: k8s.ApiClient, obj: Mapping[str, Any], timeout_s: float) -> None:
    # Right after a manager turns ready its webhooks may still refuse (500 "failed calling
    # webhook") for a moment, and a CRD just created may 404 until served: retry those only.
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _apply(api, obj)
            return
        except ApiException as exc:
            if exc.status not in (404, 500, 503) or time.monotonic() > deadline:
                raise
        except (HTTPError, OSError):
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


# --- bring-up ------------------------------------------------------------------------------------


def start_multikueue(
    sandbox: Sandbox,
    info: SandboxInfo,
    *,
    namespace: str = "bench",
    options: MultiKueueOptions | None = None,
    progress: Progress | None = None,
    ready_timeout_s: float = 180.0,
) -> MultiKueueInfo:
    """Start and configure Kueue on every cluster of the running sandbox ``info`` (clusters
    only: no gpufed hub or agents) and return once every manager is ready, the MultiKueue
    AdmissionCheck and every MultiKueueCluster are Active and every ClusterQueue is Active.

    ``namespace``: where Jobs are submitted (created on the hub and every member);
    ``options``: client QPS/burst of every manager; ``ready_timeout_s`` bounds each wait
    (seconds). Builds Kueue when it is not built yet (minutes; see :func:`ensure_kueue`).
    Raises :class:`SandboxError` naming the step and the log to read; the managers it started
    are stopped then.
    """
    say = progress or (lambda _m: None)
    opts = options or MultiKueueOptions()
    if info.control_plane is not None:
        raise SandboxError(
            f"the sandbox in {info.state_dir} runs the gpufed hub and agents; MultiKueue needs a "
            "sandbox of clusters only (`gpufed local up --clusters-only`, or Sandbox.up(fleet) "
            "without control_plane)"
        )
    sup = sandbox.supervisor
    if running := [n for n in sup.names() if n.startswith("kueue/") and sup.is_running(n)]:
        raise SandboxError(
            f"MultiKueue already runs in {info.state_dir} ({', '.join(running)}); start it once "
            "per sandbox (`gpufed local down` and up again for other options)"
        )
    try:
        binary = ensure_kueue(progress=say)
        crd_dir = kueue_crd_dir()
        manifests = kueue_webhook_manifests().read_text()
    except (BinariesError, OSError) as exc:
        raise SandboxError(f"MultiKueue: Kueue is not available: {exc}") from None
    fleet = FleetSpec.load(info.state_dir / "fleet.yaml")
    crd_texts = [p.read_text() for p in sorted((crd_dir / "bases").glob("*.yaml"))]
    certs = kc.create_kueue_certs()
    clusters = [HUB_CLUSTER_NAME, *info.members]
    free = iter(free_ports(3 * len(clusters)))
    ports = {c: kc.KueuePorts(next(free), next(free), next(free)) for c in clusters}
    names = [component_name(c) for c in clusters]
    step = "installing CRDs and webhooks"
    t0 = time.monotonic()
    try:
        # 1. per cluster: CRDs, namespace, seeded cert Secret, webhooks, config file.
        apis = {c: info.api_client(c) for c in clusters}
        for c in clusters:
            _install_cluster(apis[c], c, ports[c], certs, crd_texts, manifests)
            sup.register(_component(info, c, binary, ports[c], certs, opts))
        for c in clusters:
            _wait_crds(apis[c], c, ready_timeout_s)
        say(f"  {'Kueue CRDs, certificates, webhooks':<44} in {time.monotonic() - t0:5.1f}s")
        # 2. the managers.
        step = "starting the Kueue managers"
        t0 = time.monotonic()
        sup.start_many(names, timeout=ready_timeout_s)
        say(f"  {f'{len(names)} Kueue managers':<44} ready in {time.monotonic() - t0:5.1f}s")
        # 3. queues: workers first, so the manager's clusters find their LocalQueues.
        step = "creating the queues"
        t0 = time.monotonic()
        for m in info.members:
            quota = kc.cluster_quota([fleet.cluster(m)])
            for obj in _worker_objects(namespace, quota):
                _apply_retrying(apis[m], obj, 60)
        for obj in _manager_objects(info, namespace, kc.cluster_quota(fleet.clusters)):
            _apply_retrying(apis[HUB_CLUSTER_NAME], obj, 60)
        # 4. wait for MultiKueue to connect and the queues to turn Active.
        step = "waiting for the AdmissionCheck, MultiKueueClusters and ClusterQueues"
        _wait_active(apis, info.members, ready_timeout_s)
        say(f"  {'MultiKueue queues Active':<44} in {time.monotonic() - t0:5.1f}s")
    except ComponentError as exc:
        sup.stop_many(names, grace_s=2.0)
        raise SandboxError(f"MultiKueue: {step} failed: {exc}") from None
    except (ApiException, HTTPError, OSError, TimeoutError, ValueError) as exc:
        sup.stop_many(names, grace_s=2.0)
        logs = ", ".join(str(sup.log_path(n)) for n in names[:2])
        detail = exc.body if isinstance(exc, ApiException) and exc.body else exc
        raise SandboxError(f"MultiKueue: {step} failed: {detail} (logs: {logs}, ...)") from None
    log.info("multikueue.up", state_dir=str(info.state_dir), members=len(info.members))
    return MultiKueueInfo(namespace=namespace, local_queue=kc.LOCAL_QUEUE, components=names)


def _cluster_dir(info: SandboxInfo, cluster: str) -> Path:
    return info.state_dir / "kueue" / cluster


def _component(
    info: SandboxInfo,
    cluster: str,
    binary: Path,
    ports: kc.KueuePorts,
    certs: kc.WebhookCerts,
    opts: MultiKueueOptions,
) -> ComponentSpec:
    d = _cluster_dir(info, cluster)
    cert_dir = d / "certs"
    kc.write_cert_dir(certs, cert_dir)
    role = "manager" if cluster == HUB_CLUSTER_NAME else "worker"
    cfg = kc.configuration(ports, cert_dir, qps=opts.qps, burst=opts.burst, role=role)
    (d / "config.yaml").write_text(
        f"# Kueue {role} of the gpufed sandbox (gpufed.sandbox.multikueue)\n"
        + yaml.safe_dump(cfg, sort_keys=False)
    )
    return ComponentSpec(
        name=component_name(cluster),
        argv=[str(binary), f"--config={d / 'config.yaml'}", "--zap-log-level=info"],
        # The sandbox's admin credentials (system:masters), not Kueue's ServiceAccount RBAC.
        env={"KUBECONFIG": str(info.clusters[cluster].kubeconfig)},
        ports=[ports.webhook, ports.metrics, ports.health],
        probe=Probe(kind="http", url=f"http://127.0.0.1:{ports.health}/readyz"),
        start_timeout_s=180,
    )


def _install_cluster(
    api: k8s.ApiClient,
    cluster: str,
    ports: kc.KueuePorts,
    certs: kc.WebhookCerts,
    crd_texts: list[str],
    manifests: str,
) -> None:
    base = ports.webhook_url()
    _apply(api, kc.namespace(kc.KUEUE_NAMESPACE))
    _apply(api, kc.webhook_secret(certs))
    for crd in kc.crds(crd_texts, base, certs.ca_bundle):
        _apply(api, crd)
    for hooks in kc.webhook_configurations(manifests, base, certs.ca_bundle):
        _apply(api, hooks)


def _wait_crds(api: k8s.ApiClient, cluster: str, timeout_s: float) -> None:
    ext = k8s.ApiextensionsV1Api(api)
    deadline = time.monotonic() + timeout_s
    while True:
        crds: Any = ext.list_custom_resource_definition(_request_timeout=30).items
        pending = [
            str(c.metadata.name)
            for c in crds
            if str(c.metadata.name).endswith(".kueue.x-k8s.io")
            and not any(
                x.type == "Established" and x.status == "True"
                for x in (c.status.conditions or [] if c.status else [])
            )
        ]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{cluster}: CRDs not Established after {timeout_s:.0f}s: {pending}")
        time.sleep(0.2)


def _worker_objects(namespace: str, quota: Mapping[str, str]) -> list[dict[str, Any]]:
    return [
        kc.namespace(namespace),
        kc.resource_flavor(),
        kc.cluster_queue(quota),
        kc.local_queue(namespace),
    ]


def _manager_objects(
    info: SandboxInfo, namespace: str, quota: Mapping[str, str]
) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = [kc.namespace(namespace), kc.resource_flavor()]
    for m in info.members:
        objs.append(kc.kubeconfig_secret(m, info.clusters[m].kubeconfig.read_text()))
        objs.append(kc.multikueue_cluster(m))
    objs += [
        kc.multikueue_config(info.members),
        kc.admission_check(),
        kc.cluster_queue(quota, admission_check=kc.ADMISSION_CHECK),
        kc.local_queue(namespace),
    ]
    return objs


def _wait_active(apis: Mapping[str, k8s.ApiClient], members: list[str], timeout_s: float) -> None:
    hub = apis[HUB_CLUSTER_NAME]
    waits: list[tuple[str, k8s.ApiClient, dict[str, Any]]] = [
        ("AdmissionCheck on the hub", hub, kc.admission_check()),
        *((f"MultiKueueCluster {m}", hub, kc.multikueue_cluster(m)) for m in members),
        *((f"ClusterQueue on {c}", apis[c], kc.cluster_queue({})) for c in apis),
    ]
    deadline = time.monotonic() + timeout_s
    for what, api, obj in waits:
        while True:
            current = _get(api, obj)
            if _condition_true(current, "Active"):
                break
            if time.monotonic() > deadline:
                conds = ((current or {}).get("status") or {}).get("conditions")
                raise TimeoutError(
                    f"{what} not Active after {timeout_s:.0f}s (conditions: {conds})"
                )
            time.sleep(0.3)
