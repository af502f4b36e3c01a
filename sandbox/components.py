"""Command lines of the sandbox's cluster processes: etcd, and per cluster kube-apiserver,
kube-controller-manager, kube-scheduler and kwok, each as a supervisor
:class:`~gpufed.sandbox.supervisor.ComponentSpec` (argv, env, ports, readiness probe), and the
per-member configuration files their command lines name.

:meth:`gpufed.sandbox.runtime.Sandbox.up` calls :func:`write_config_files` and registers what
:func:`cluster_components` returns (which is pure: it starts nothing and reads no file); the
certificates and kubeconfigs they name come from :mod:`gpufed.sandbox.pki` and
:mod:`gpufed.sandbox.state`. The hub and agent processes are :mod:`gpufed.sandbox.controlplane`'s.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

import yaml

from gpufed.api.fleet import HUB_CLUSTER_NAME, FleetSpec
from gpufed.sandbox.binaries import BinDir
from gpufed.sandbox.pki import Pki
from gpufed.sandbox.scheduler import scheduler_configuration
from gpufed.sandbox.state import ClusterEndpoint, SandboxInfo
from gpufed.sandbox.supervisor import ComponentSpec, Probe

#: How long kwok's node Leases last in a member of up to :data:`NODES_PER_LEASE_STEP` nodes;
#: kwok renews them every quarter of this (10 s, as the kubelet does).
NODE_LEASE_SECONDS = 40
NODES_PER_LEASE_STEP = 250

#: gpufed's kwok stages (node heartbeat, pod lifecycle); the process sandbox appends them to
#: kwok's configuration file, the kind provider applies them as Stage objects.
KWOK_STAGES = Path(__file__).resolve().parent / "kwok" / "stages.yaml"

# Health endpoints the controller manager and scheduler serve without a token.
_OPEN_HEALTH_PATHS = "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"


def node_lease_seconds(nodes: int) -> int:
    """Lease duration for a member with ``nodes`` kwok nodes: 40 s up to 250 nodes, then 40 s
    more per 250 nodes, so lease renewals stay near 25 writes/s (2,000 nodes: 320 s, renewed
    every 80 s). The controller manager's ``--node-monitor-grace-period`` is set to the same
    value, so a stopped kwok turns its nodes NotReady after about that long."""
    return NODE_LEASE_SECONDS * max(1, -(-nodes // NODES_PER_LEASE_STEP))


def port_names(fleet: FleetSpec) -> list[str]:
    """The ports these components listen on, by the names ``Sandbox.up(ports=...)`` takes:
    ``etcd``, ``etcd-peer``, ``apiserver/<cluster>`` (hub first), then per member
    ``controller-manager/<member>`` and ``scheduler/<member>``. kwok listens on none."""
    names = ["etcd", "etcd-peer"] + [f"apiserver/{n}" for n in [HUB_CLUSTER_NAME, *fleet.names]]
    for m in fleet.names:
        names += [f"controller-manager/{m}", f"scheduler/{m}"]
    return names


def cluster_components(
    info: SandboxInfo, bins: BinDir, pki: Pki, ports: Mapping[str, int]
) -> list[ComponentSpec]:
    """Every cluster process of the sandbox ``info`` describes, in start order (the supervisor
    starts and stops in registration order): etcd, each API server (hub first), then per member
    its controller manager, scheduler and kwok. ``ports`` holds every :func:`port_names` key."""
    d = info.state_dir
    out = [etcd(bins, data_dir=d / "etcd", client_port=ports["etcd"], peer_port=ports["etcd-peer"])]
    for ep in info.clusters.values():
        out.append(
            apiserver(
                bins,
                ep,
                etcd_url=info.etcd_url,
                port=ports[f"apiserver/{ep.name}"],
                cert_dir=d / "clusters" / ep.name / "pki",
                pki=pki,
            )
        )
    for m in info.members:
        ep, cdir = info.clusters[m], _member_dir(info, m)
        lease_s = node_lease_seconds(ep.nodes)
        out += [
            controller_manager(bins, ep, port=ports[f"controller-manager/{m}"], lease_s=lease_s),
            scheduler(bins, m, config=cdir / "scheduler.yaml", port=ports[f"scheduler/{m}"]),
            kwok(bins, ep, config=cdir / "kwok.yaml", workdir=cdir / "kwok", lease_s=lease_s),
        ]
    return out


def cd_driver(ep: ClusterEndpoint) -> ComponentSpec:
    """Member ``ep``'s simulated ComputeDomain controller (:mod:`gpufed.sandbox.cddriver`), for a
    member with ``computeDomains: true``. Serves no port; counted ready when still alive after 1 s."""
    return ComponentSpec(
        name=f"cd-driver/{ep.name}",
        argv=[
            sys.executable,
            "-m",
            "gpufed.sandbox.cddriver",
            f"--kubeconfig={ep.kubeconfig}",
            f"--context={ep.context}",
        ],
        probe=Probe(kind="process", settle_s=1.0),
        start_timeout_s=30,
    )


def write_config_files(info: SandboxInfo) -> None:
    """Write what :func:`cluster_components` names under ``clusters/<member>/``: the scheduler
    configuration (``scheduler.yaml``), kwok's configuration with gpufed's stages
    (``kwok.yaml``) and kwok's empty work dir (``kwok/``)."""
    for m in info.members:
        cdir = _member_dir(info, m)
        config = scheduler_configuration(info.clusters[m].kubeconfig)
        (cdir / "scheduler.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (cdir / "kwok.yaml").write_text(kwok_configuration() + KWOK_STAGES.read_text())
        (cdir / "kwok").mkdir(exist_ok=True)


def _member_dir(info: SandboxInfo, member: str) -> Path:
    return info.state_dir / "clusters" / member


def etcd(bins: BinDir, *, data_dir: Path, client_port: int, peer_port: int) -> ComponentSpec:
    """The one etcd every API server (and the hub) stores in, serving clients at
    ``http://127.0.0.1:<client_port>`` (``SandboxInfo.etcd_url``); no fsync."""
    url, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    return ComponentSpec(
        name="etcd",
        argv=[
            str(bins.etcd),
            "--name=sandbox",
            f"--data-dir={data_dir}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=sandbox={peer}",
            "--unsafe-no-fsync=true",
            "--auto-compaction-retention=1",
            "--quota-backend-bytes=4294967296",
            "--log-level=warn",
        ],
        ports=[client_port, peer_port],
        probe=Probe(kind="http", url=f"{url}/health"),
        start_timeout_s=60,
    )


def apiserver(
    bins: BinDir, ep: ClusterEndpoint, *, etcd_url: str, port: int, cert_dir: Path, pki: Pki
) -> ComponentSpec:
    """The API server of cluster ``ep`` (hub or member) on 127.0.0.1:``port``, storing under
    ``ep.etcd_prefix``; token authentication from ``pki`` and RBAC. Ready at ``/readyz``."""
    return ComponentSpec(
        name=f"apiserver/{ep.name}",
        argv=[
            str(bins.kube_apiserver),
            f"--etcd-servers={etcd_url}",
            f"--etcd-prefix={ep.etcd_prefix}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={cert_dir}",
            f"--tls-cert-file={pki.serving_crt}",
            f"--tls-private-key-file={pki.serving_key}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--token-auth-file={pki.tokens_csv}",
            "--authorization-mode=RBAC",
            # ServiceAccount: no token controller runs (as in envtest).
            # TaintNodesByCondition would put node.kubernetes.io/not-ready on every
            # new Node for the controller manager to remove one by one (~30/s on 2
            # cores); kwok makes nodes Ready at once, and the node lifecycle
            # controller still taints nodes that turn NotReady later.
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            "--allow-privileged=true",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            "--endpoint-reconciler-type=none",
        ],
        ports=[port],
        probe=Probe(kind="http", url=f"{ep.server}/readyz"),
        start_timeout_s=240,
    )


def controller_manager(
    bins: BinDir, ep: ClusterEndpoint, *, port: int, lease_s: int
) -> ComponentSpec:
    """Member ``ep``'s controller manager: every default controller, no leader election, a node
    marked NotReady ``lease_s`` seconds after its last heartbeat (:func:`node_lease_seconds`)."""
    return ComponentSpec(
        name=f"controller-manager/{ep.name}",
        argv=[
            str(bins.kube_controller_manager),
            f"--kubeconfig={ep.kubeconfig}",
            "--controllers=*",
            "--use-service-account-credentials=false",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            _OPEN_HEALTH_PATHS,
            "--node-monitor-period=5s",
            f"--node-monitor-grace-period={lease_s}s",
            "--kube-api-qps=300",
            "--kube-api-burst=600",
            "--profiling=false",
        ],
        ports=[port],
        probe=Probe(kind="http", url=f"https://127.0.0.1:{port}/healthz"),
        start_timeout_s=90,
    )


def scheduler(bins: BinDir, member: str, *, config: Path, port: int) -> ComponentSpec:
    """Member ``member``'s kube-scheduler, run with ``config`` (the file holding
    :func:`gpufed.sandbox.scheduler.scheduler_configuration`, which names its kubeconfig)."""
    return ComponentSpec(
        name=f"scheduler/{member}",
        argv=[
            str(bins.kube_scheduler),
            f"--config={config}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            _OPEN_HEALTH_PATHS,
            "--profiling=false",
        ],
        ports=[port],
        probe=Probe(kind="http", url=f"https://127.0.0.1:{port}/healthz"),
        start_timeout_s=90,
    )


def kwok(
    bins: BinDir, ep: ClusterEndpoint, *, config: Path, workdir: Path, lease_s: int
) -> ComponentSpec:
    """Member ``ep``'s kwok, managing every node of that cluster: ``config`` holds
    :func:`kwok_configuration` and :data:`KWOK_STAGES`; node Leases last ``lease_s`` seconds.
    Serves no port; counted ready when still alive after 1 s."""
    return ComponentSpec(
        name=f"kwok/{ep.name}",
        argv=[
            str(bins.kwok),
            f"--kubeconfig={ep.kubeconfig}",
            f"--config={config}",
            "--manage-all-nodes=true",
            f"--node-lease-duration-seconds={lease_s}",
            "--cidr=10.0.0.0/16",
            "--node-ip=10.0.0.1",
        ],
        # KWOK_WORKDIR keeps ~/.kwok/kwok.yaml (always loaded when present) out.
        env={"KWOK_WORKDIR": str(workdir)},
        probe=Probe(kind="process", settle_s=1.0),
        start_timeout_s=30,
    )


def kwok_configuration() -> str:
    """The head of kwok's configuration file: its options and a document separator, for
    gpufed's stages (:data:`KWOK_STAGES`) to follow. kwok applies stages with 4 workers by default, which makes 2,000 nodes take over a minute
    to turn Ready; 16 keeps the API server busy instead."""
    doc = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "nodePlayStageParallelism": 16,
            "podPlayStageParallelism": 16,
            "nodeLeaseParallelism": 16,
        },
    }
    return yaml.safe_dump(doc, sort_keys=False) + "---\n"
