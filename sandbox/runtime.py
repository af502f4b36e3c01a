"""The local sandbox: one etcd, a hub API server and, per member cluster, an API server,
controller manager, scheduler and kwok, all as processes on 127.0.0.1.

:class:`Sandbox` is the Python API behind ``gpufed local up|status|down`` and the test fixtures::

    info = Sandbox(state_dir).up(FleetSpec.load("manifests/fleets/example.yaml"))
    info.kubeconfig        # <state>/kubeconfig, contexts "hub" + one per member, current "hub"
    info.clusters["hub"].server, info.etcd_url, info.hub_etcd_prefix
    Sandbox(state_dir).status(); Sandbox(state_dir).down()

Every API server stores its objects in the one etcd under its own ``--etcd-prefix``
(``/sandbox/<cluster>/registry``); the hub process (a later component) uses the same etcd under
:data:`HUB_ETCD_PREFIX`. Ports are picked free at start. State dir layout::

    sandbox.json  fleet.yaml  kubeconfig
    pki/          CA, serving cert, service-account key, tokens.csv
    etcd/         etcd data
    clusters/<name>/  admin.kubeconfig, scheduler.yaml, kwok.yaml, kwok/ (KWOK_WORKDIR)
    components/ run/ logs/    see gpufed.sandbox.supervisor
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import structlog
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, Field
from urllib3.exceptions import HTTPError

from gpufed.api.fleet import HUB_CLUSTER_NAME, FleetError, FleetSpec, NodeSpec, node_specs
from gpufed.sandbox.binaries import CORE_BINARIES, BinariesError, BinDir, ensure_binaries
from gpufed.sandbox.inventory import ClusterGPUs, cluster_gpus
from gpufed.sandbox.kube import api_client, list_nodes_raw, node_is_ready
from gpufed.sandbox.pki import Pki, create_pki
from gpufed.sandbox.supervisor import (
    ComponentError,
    ComponentSpec,
    ComponentStatus,
    Probe,
    Supervisor,
    http_ok,
)

log = structlog.get_logger("gpufed.sandbox")

#: etcd key prefix reserved for the hub process's own state in the sandbox's etcd.
HUB_ETCD_PREFIX = "/gpufed/hub/"
#: How long kwok's node Leases last in a member of up to :data:`NODES_PER_LEASE_STEP` nodes;
#: kwok renews them every quarter of this (10 s, as the kubelet does).
NODE_LEASE_SECONDS = 40
NODES_PER_LEASE_STEP = 250


def node_lease_seconds(nodes: int) -> int:
    """Lease duration for a member with ``nodes`` kwok nodes: 40 s up to 250 nodes, then 40 s
    more per 250 nodes, so lease renewals stay near 25 writes/s (2,000 nodes: 320 s, renewed
    every 80 s). The controller manager's ``--node-monitor-grace-period`` is set to the same
    value, so a stopped kwok turns its nodes NotReady after about that long."""
    return NODE_LEASE_SECONDS * max(1, -(-nodes // NODES_PER_LEASE_STEP))


KWOK_STAGES = Path(__file__).resolve().parent / "kwok" / "stages.yaml"

Progress = Callable[[str], None]


class SandboxError(RuntimeError):
    """``up``/``down``/``status`` failed. The message is one paragraph naming the cause and,
    when a process is involved, its log file; ``up`` has stopped whatever it started."""


def default_state_dir() -> Path:
    """``$GPUFED_STATE_DIR``, else ``$XDG_STATE_HOME/gpufed/sandbox``, else
    ``~/.local/state/gpufed/sandbox``."""
    if env := os.environ.get("GPUFED_STATE_DIR"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_STATE_HOME")
    return (Path(base) if base else Path.home() / ".local" / "state") / "gpufed" / "sandbox"


class ClusterEndpoint(BaseModel):
    """How to reach one sandbox cluster. ``context``: its name in the sandbox kubeconfig;
    ``kubeconfig``: a single-context admin kubeconfig for this cluster alone."""

    name: str
    role: Literal["hub", "member"]
    context: str
    server: str
    etcd_prefix: str
    kubeconfig: Path
    nodes: int = 0


class SandboxInfo(BaseModel):
    """What a started sandbox offers (``<state>/sandbox.json``).

    ``clusters``: ``hub`` first, then members in fleet order; ``etcd_url``: the shared etcd's
    client URL; ``hub_etcd_prefix``: the key prefix reserved for the hub process;
    ``up_seconds``: how long ``up`` took.
    """

    state_dir: Path
    kubeconfig: Path
    etcd_url: str
    hub_etcd_prefix: str = HUB_ETCD_PREFIX
    bin_dir: Path
    fleet_file: Path
    clusters: dict[str, ClusterEndpoint]
    token: str
    ca_file: Path
    up_seconds: float | None = None
    phase: Literal["starting", "running", "failed", "stopped"] = "starting"

    @property
    def hub(self) -> ClusterEndpoint:
        return self.clusters[HUB_CLUSTER_NAME]

    @property
    def members(self) -> list[str]:
        """Member cluster names in fleet order."""
        return [n for n, c in self.clusters.items() if c.role == "member"]

    def api_client(self, cluster: str, *, pool_size: int = 8) -> k8s.ApiClient:
        """A Kubernetes client for ``cluster`` (``"hub"`` or a member name)."""
        return api_client(self.kubeconfig, self.clusters[cluster].context, pool_size=pool_size)


class ClusterStatus(BaseModel):
    """One cluster in ``status``: ``reachable`` = ``/readyz`` answered; ``gpus``: read from its
    Nodes (None when unreachable)."""

    name: str
    role: str
    server: str
    reachable: bool
    gpus: ClusterGPUs | None = None


class SandboxStatus(BaseModel):
    """``gpufed local status``: ``running`` when every component runs; ``rss_bytes``: summed
    resident memory of all components."""

    state_dir: Path
    exists: bool
    running: bool = False
    phase: str = "absent"
    kubeconfig: Path | None = None
    components: list[ComponentStatus] = Field(default_factory=list)
    clusters: list[ClusterStatus] = Field(default_factory=list)
    rss_bytes: int = 0


# --- ports ----------------------------------------------------------------------------------------


def _free_ports(count: int) -> list[int]:
    # Bind them all at once so they differ, then release for the processes to take.
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# --- the sandbox ------------------------------------------------------------------------------------


class Sandbox:
    """A sandbox rooted at ``state_dir`` (default :func:`default_state_dir`).

    ``bin_dir``: where the binaries are (default :func:`ensure_binaries`, which builds them when
    missing); ``progress``: receives one line per bring-up step (``None``: silent).
    """

    def __init__(
        self,
        state_dir: str | Path | None = None,
        *,
        bin_dir: BinDir | str | Path | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.state_dir = Path(state_dir) if state_dir else default_state_dir()
        self.state_dir = self.state_dir.expanduser().absolute()
        if bin_dir is not None and not isinstance(bin_dir, BinDir):
            bin_dir = BinDir(Path(bin_dir))
        self._bin_dir = bin_dir
        self._say = progress or (lambda _m: None)
        self.supervisor = Supervisor(self.state_dir)

    # --- info files -----------------------------------------------------------------------------

    @property
    def info_path(self) -> Path:
        return self.state_dir / "sandbox.json"

    def info(self) -> SandboxInfo:
        """The recorded :class:`SandboxInfo`; :class:`SandboxError` when there is no sandbox."""
        try:
            return SandboxInfo.model_validate_json(self.info_path.read_text())
        except OSError:
            raise SandboxError(
                f"no sandbox in {self.state_dir} (no sandbox.json); start one with "
                "`gpufed local up --fleet FILE`"
            ) from None

    def _write_info(self, info: SandboxInfo) -> None:
        tmp = self.info_path.with_suffix(".tmp")
        tmp.write_text(info.model_dump_json(indent=2) + "\n")
        tmp.chmod(0o600)  # holds the admin token
        tmp.replace(self.info_path)

    def running_components(self) -> list[str]:
        """Registered components whose processes are alive."""
        return [n for n in self.supervisor.names() if self.supervisor.is_running(n)]

    # --- up ---------------------------------------------------------------------------------------

    def up(
        self,
        fleet: FleetSpec | str | Path,
        *,
        ports: Mapping[str, int] | None = None,
        apiserver_timeout_s: float = 240.0,
        nodes_timeout_s: float | None = None,
    ) -> SandboxInfo:
        """Start the sandbox for ``fleet`` and return when every API server answers and every
        node is Ready.

        ``ports`` pins ports by component name (``etcd``, ``etcd-peer``, ``apiserver/<cluster>``,
        ``controller-manager/<cluster>``, ``scheduler/<cluster>``); the rest are picked free.
        Refuses a state dir whose sandbox still runs; a state dir whose processes are all gone
        is wiped and reused. Raises :class:`SandboxError` (invalid fleet, missing binary, port
        clash, a process dying or not getting ready), after stopping whatever it started.
        """
        started = time.monotonic()
        fleet_file: Path | None = None
        if not isinstance(fleet, FleetSpec):
            fleet_file = Path(fleet)
            try:
                fleet = FleetSpec.load(fleet_file)
            except FleetError as exc:
                raise SandboxError(str(exc)) from None
        bins = self._binaries()
        pinned = set((ports or {}).values())
        for attempt in (1, 2):
            self._prepare_state_dir()
            try:
                info = self._configure(fleet, fleet_file, bins, dict(ports or {}))
                self._start(info, fleet, apiserver_timeout_s, nodes_timeout_s, started)
                return self.info()
            except BaseException as exc:
                self._say("bring-up failed; stopping what was started")
                # Short grace: an API server interrupted mid-start can sit in its shutdown
                # for 10 s; nothing it holds is worth waiting for.
                self.supervisor.stop_all(grace_s=2.0)
                with contextlib.suppress(SandboxError, OSError, ValueError):
                    self._write_info(self.info().model_copy(update={"phase": "failed"}))
                if not isinstance(exc, ComponentError):
                    raise
                # A port picked free was taken before the process bound it (other sandboxes
                # start concurrently): pick new ones once. A pinned port is the caller's.
                raced = "port clash" in exc.cause and not pinned.intersection(
                    self.supervisor.spec(exc.component).ports
                )
                if attempt == 1 and raced:
                    log.warning("sandbox.port_raced", component=exc.component)
                    self._say(f"{exc.component}: a picked port was taken meanwhile; retrying")
                    continue
                raise SandboxError(f"sandbox failed to start: {exc}") from None
        raise AssertionError("unreachable")

    def _binaries(self) -> BinDir:
        try:
            bins = self._bin_dir or ensure_binaries(progress=self._say)
        except BinariesError as exc:
            raise SandboxError(str(exc)) from None
        if missing := bins.missing(CORE_BINARIES):
            raise SandboxError(
                f"missing binaries in {bins.path}: {', '.join(missing)}; run `gpufed local "
                "build` (or point GPUFED_BIN_DIR at a directory that has them)"
            )
        return bins

    def _prepare_state_dir(self) -> None:
        d = self.state_dir
        if d.exists() and any(d.iterdir()):
            if not (d / "sandbox.json").exists() and not (d / "components").exists():
                raise SandboxError(
                    f"{d} is not empty and holds no gpufed sandbox; choose another --state-dir "
                    "(or an empty or new directory)"
                )
            if running := self.running_components():
                raise SandboxError(
                    f"a sandbox is already running in {d} ({len(running)} processes, e.g. "
                    f"{running[0]}); stop it with `gpufed local down --state-dir {d}` or use "
                    "another --state-dir"
                )
            log.info("sandbox.reuse_state_dir", state_dir=str(d))
            for child in d.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        d.mkdir(parents=True, exist_ok=True)

    def _configure(
        self, fleet: FleetSpec, fleet_file: Path | None, bins: BinDir, ports: dict[str, int]
    ) -> SandboxInfo:
        d = self.state_dir
        names = [HUB_CLUSTER_NAME, *fleet.names]
        wanted = ["etcd", "etcd-peer"] + [f"apiserver/{n}" for n in names]
        for m in fleet.names:
            wanted += [f"controller-manager/{m}", f"scheduler/{m}"]
        free = iter(_free_ports(len(wanted)))
        for key in wanted:
            ports.setdefault(key, next(free))
        pki = create_pki(d / "pki")
        (d / "fleet.yaml").write_text(fleet.to_yaml())
        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        clusters: dict[str, ClusterEndpoint] = {}
        for n in names:
            cdir = d / "clusters" / n
            cdir.mkdir(parents=True, exist_ok=True)
            ep = ClusterEndpoint(
                name=n,
                role="hub" if n == HUB_CLUSTER_NAME else "member",
                context=n,
                server=f"https://127.0.0.1:{ports[f'apiserver/{n}']}",
                etcd_prefix=f"/sandbox/{n}/registry",
                kubeconfig=cdir / "admin.kubeconfig",
                nodes=0 if n == HUB_CLUSTER_NAME else fleet.cluster(n).node_count,
            )
            clusters[n] = ep
            _write_kubeconfig(ep.kubeconfig, [ep], pki, current=n)
        kubeconfig = d / "kubeconfig"
        _write_kubeconfig(kubeconfig, list(clusters.values()), pki, current=HUB_CLUSTER_NAME)
        info = SandboxInfo(
            state_dir=d,
            kubeconfig=kubeconfig,
            etcd_url=etcd_url,
            bin_dir=bins.path,
            fleet_file=(fleet_file.absolute() if fleet_file else d / "fleet.yaml"),
            clusters=clusters,
            token=pki.token,
            ca_file=pki.ca_crt,
        )
        self._write_info(info)
        self._register(info, fleet, bins, pki, ports)
        return info

    def _register(
        self, info: SandboxInfo, fleet: FleetSpec, bins: BinDir, pki: Pki, ports: dict[str, int]
    ) -> None:
        d = self.state_dir
        sup = self.supervisor
        sup.register(
            ComponentSpec(
                name="etcd",
                argv=[
                    str(bins.etcd),
                    "--name=sandbox",
                    f"--data-dir={d / 'etcd'}",
                    f"--listen-client-urls={info.etcd_url}",
                    f"--advertise-client-urls={info.etcd_url}",
                    f"--listen-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{ports['etcd-peer']}",
                    f"--initial-cluster=sandbox=http://127.0.0.1:{ports['etcd-peer']}",
                    "--unsafe-no-fsync=true",
                    "--auto-compaction-retention=1",
                    "--quota-backend-bytes=4294967296",
                    "--log-level=warn",
                ],
                ports=[ports["etcd"], ports["etcd-peer"]],
                probe=Probe(kind="http", url=f"{info.etcd_url}/health"),
                start_timeout_s=60,
            )
        )
        for ep in info.clusters.values():
            port = ports[f"apiserver/{ep.name}"]
            sup.register(
                ComponentSpec(
                    name=f"apiserver/{ep.name}",
                    argv=[
                        str(bins.kube_apiserver),
                        f"--etcd-servers={info.etcd_url}",
                        f"--etcd-prefix={ep.etcd_prefix}",
                        "--bind-address=127.0.0.1",
                        "--advertise-address=127.0.0.1",
                        f"--secure-port={port}",
                        f"--cert-dir={d / 'clusters' / ep.name / 'pki'}",
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
            )
        for m in info.members:
            ep = info.clusters[m]
            cdir = d / "clusters" / m
            kcm_port, sched_port = ports[f"controller-manager/{m}"], ports[f"scheduler/{m}"]
            lease_s = node_lease_seconds(ep.nodes)
            sup.register(
                ComponentSpec(
                    name=f"controller-manager/{m}",
                    argv=[
                        str(bins.kube_controller_manager),
                        f"--kubeconfig={ep.kubeconfig}",
                        "--controllers=*",
                        "--use-service-account-credentials=false",
                        "--leader-elect=false",
                        "--bind-address=127.0.0.1",
                        f"--secure-port={kcm_port}",
                        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                        "--node-monitor-period=5s",
                        f"--node-monitor-grace-period={lease_s}s",
                        "--kube-api-qps=300",
                        "--kube-api-burst=600",
                        "--profiling=false",
                    ],
                    ports=[kcm_port],
                    probe=Probe(kind="http", url=f"https://127.0.0.1:{kcm_port}/healthz"),
                    start_timeout_s=90,
                )
            )
            sched_cfg = cdir / "scheduler.yaml"
            sched_cfg.write_text(yaml.safe_dump(_scheduler_config(ep.kubeconfig), sort_keys=False))
            sup.register(
                ComponentSpec(
                    name=f"scheduler/{m}",
                    argv=[
                        str(bins.kube_scheduler),
                        f"--config={sched_cfg}",
                        "--bind-address=127.0.0.1",
                        f"--secure-port={sched_port}",
                        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                        "--profiling=false",
                    ],
                    ports=[sched_port],
                    probe=Probe(kind="http", url=f"https://127.0.0.1:{sched_port}/healthz"),
                    start_timeout_s=90,
                )
            )
            kwok_cfg = cdir / "kwok.yaml"
            kwok_cfg.write_text(_kwok_configuration() + KWOK_STAGES.read_text())
            (cdir / "kwok").mkdir(exist_ok=True)
            sup.register(
                ComponentSpec(
                    name=f"kwok/{m}",
                    argv=[
                        str(bins.kwok),
                        f"--kubeconfig={ep.kubeconfig}",
                        f"--config={kwok_cfg}",
                        "--manage-all-nodes=true",
                        f"--node-lease-duration-seconds={lease_s}",
                        "--cidr=10.0.0.0/16",
                        "--node-ip=10.0.0.1",
                    ],
                    # KWOK_WORKDIR keeps ~/.kwok/kwok.yaml (always loaded when present) out.
                    env={"KWOK_WORKDIR": str(cdir / "kwok")},
                    probe=Probe(kind="process", settle_s=1.0),
                    start_timeout_s=30,
                )
            )

    def _start(
        self,
        info: SandboxInfo,
        fleet: FleetSpec,
        apiserver_timeout_s: float,
        nodes_timeout_s: float | None,
        started: float,
    ) -> None:
        sup, say = self.supervisor, self._say

        def step(what: str, names: list[str], timeout: float | None = None) -> None:
            t0 = time.monotonic()
            sup.start_many(names, timeout=timeout)
            say(f"  {what:<44} ready in {time.monotonic() - t0:5.1f}s")

        say(f"starting sandbox in {self.state_dir}")
        step("etcd", ["etcd"])
        # Started together: on 2 cores this is CPU-bound (bootstrap RBAC, OpenAPI), so the
        # timeout is generous rather than the start sequential.
        step(
            f"API servers ({', '.join(info.clusters)})",
            [f"apiserver/{n}" for n in info.clusters],
            apiserver_timeout_s,
        )
        step(
            "controller managers, schedulers, kwok",
            [f"{c}/{m}" for m in info.members for c in ("controller-manager", "scheduler", "kwok")],
        )
        t0 = time.monotonic()
        total = 0
        for cluster in fleet.clusters:
            specs = node_specs(cluster)
            total += len(specs)
            _create_nodes(info.api_client(cluster.name, pool_size=16), specs)
        say(f"  {f'{total} nodes created':<44} in {time.monotonic() - t0:5.1f}s")
        t0 = time.monotonic()
        limit = nodes_timeout_s if nodes_timeout_s is not None else 90 + 0.1 * total
        self._wait_nodes_ready(info, fleet, limit)
        say(f"  {'all nodes Ready':<44} in {time.monotonic() - t0:5.1f}s")
        final = info.model_copy(
            update={"phase": "running", "up_seconds": round(time.monotonic() - started, 1)}
        )
        self._write_info(final)
        log.info(
            "sandbox.up",
            state_dir=str(self.state_dir),
            seconds=final.up_seconds,
            clusters=len(info.clusters),
            nodes=total,
        )

    def _wait_nodes_ready(self, info: SandboxInfo, fleet: FleetSpec, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pending = {c.name: {n.name for n in node_specs(c)} for c in fleet.clusters}
        clients = {m: info.api_client(m) for m in pending}
        while True:
            for m in list(pending):
                self._check_alive(m)
                with contextlib.suppress(ApiException, HTTPError, OSError):
                    ready = {
                        n["metadata"]["name"]
                        for n in list_nodes_raw(clients[m])
                        if node_is_ready(n)
                    }
                    pending[m] -= ready
                if not pending[m]:
                    del pending[m]
            if not pending:
                return
            if time.monotonic() > deadline:
                m, names = next(iter(pending.items()))
                raise SandboxError(
                    f"sandbox failed to start: {len(names)} nodes of {m} not Ready after "
                    f"{timeout_s:.0f}s (e.g. {sorted(names)[0]}); kwok marks nodes Ready and "
                    "the controller manager removes their not-ready taint: see "
                    f"{self.supervisor.log_path(f'kwok/{m}')} and "
                    f"{self.supervisor.log_path(f'controller-manager/{m}')}"
                )
            time.sleep(1.0)

    def _check_alive(self, member: str) -> None:
        for comp in (
            "etcd",
            f"apiserver/{member}",
            f"controller-manager/{member}",
            f"kwok/{member}",
        ):
            if not self.supervisor.is_running(comp):
                raise SandboxError(
                    f"sandbox failed to start: {comp} exited while nodes were coming up "
                    f"(log: {self.supervisor.log_path(comp)})"
                )

    # --- down / status -----------------------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop every component (reverse start order) and wait until its ports are free.

        Returns the names of components that were running. The state dir stays (logs); the next
        ``up`` reuses it. Safe to call when nothing runs.
        """
        running = self.running_components()
        self.supervisor.stop_all()
        with contextlib.suppress(SandboxError, OSError, ValueError):
            self._write_info(self.info().model_copy(update={"phase": "stopped"}))
        log.info("sandbox.down", state_dir=str(self.state_dir), stopped=len(running))
        return running

    def status(self, *, with_nodes: bool = True) -> SandboxStatus:
        """Components (pid, memory, ports, log) and, for reachable clusters, the GPU inventory
        read from their Nodes."""
        if not self.info_path.exists():
            return SandboxStatus(state_dir=self.state_dir, exists=False)
        info = self.info()
        comps = self.supervisor.statuses()
        running = bool(comps) and all(c.running for c in comps)
        clusters = []
        for ep in info.clusters.values():
            reachable = http_ok(f"{ep.server}/readyz")
            gpus = None
            if reachable and with_nodes and ep.role == "member":
                with contextlib.suppress(ApiException, HTTPError, OSError):
                    gpus = cluster_gpus(ep.name, list_nodes_raw(info.api_client(ep.name)))
            clusters.append(
                ClusterStatus(
                    name=ep.name, role=ep.role, server=ep.server, reachable=reachable, gpus=gpus
                )
            )
        phase = (
            info.phase
            if running
            else ("stopped" if not any(c.running for c in comps) else "degraded")
        )
        return SandboxStatus(
            state_dir=self.state_dir,
            exists=True,
            running=running,
            phase=phase,
            kubeconfig=info.kubeconfig,
            components=comps,
            clusters=clusters,
            rss_bytes=sum(c.rss_bytes for c in comps),
        )

    def inventory(self) -> list[ClusterGPUs]:
        """GPU inventory of every member, read from its API server's Nodes."""
        info = self.info()
        return [cluster_gpus(m, list_nodes_raw(info.api_client(m))) for m in info.members]


# --- helpers ----------------------------------------------------------------------------------------


def _write_kubeconfig(
    path: Path, clusters: list[ClusterEndpoint], pki: Pki, *, current: str
) -> None:
    import base64

    ca = base64.b64encode(pki.ca_crt.read_bytes()).decode()
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": c.name, "cluster": {"server": c.server, "certificate-authority-data": ca}}
            for c in clusters
        ],
        "users": [{"name": "admin", "user": {"token": pki.token}}],
        "contexts": [
            {"name": c.context, "context": {"cluster": c.name, "user": "admin"}} for c in clusters
        ],
        "current-context": current,
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)


def _kwok_configuration() -> str:
    """kwok options (the stages follow in the same file). kwok applies stages with 4 workers
    by default, which makes 2,000 nodes take over a minute to turn Ready; 16 keeps the API
    server busy instead."""
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


def _scheduler_config(kubeconfig: Path) -> dict[str, Any]:
    """kube-scheduler configuration: bin-pack GPUs (MostAllocated weighs nvidia.com/gpu), so
    whole nodes and NVLink domains stay free for large jobs."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": 100, "burst": 200},
        "leaderElection": {"leaderElect": False},
        "profiles": [
            {
                "schedulerName": "default-scheduler",
                "pluginConfig": [
                    {
                        "name": "NodeResourcesFit",
                        "args": {
                            "scoringStrategy": {
                                "type": "MostAllocated",
                                "resources": [
                                    {"name": "nvidia.com/gpu", "weight": 5},
                                    {"name": "cpu", "weight": 1},
                                    {"name": "memory", "weight": 1},
                                ],
                            }
                        },
                    }
                ],
            }
        ],
    }


def node_manifest(spec: NodeSpec) -> dict[str, Any]:
    """A kwok-managed Node for ``spec``: labels, taints, and status capacity/allocatable set on
    create (allowed for Nodes), which kwok's node-initialize stage keeps."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": dict(spec.labels),
            "annotations": {
                "kwok.x-k8s.io/node": "fake",
                "node.alpha.kubernetes.io/ttl": "0",
            },
        },
        "spec": {"taints": [t.model_dump() for t in spec.taints]},
        "status": {
            "capacity": dict(spec.capacity),
            "allocatable": dict(spec.allocatable),
            # Empty fields are filled in by kwok's node-initialize stage.
            "nodeInfo": {
                "architecture": spec.labels.get("kubernetes.io/arch", "amd64"),
                "operatingSystem": "linux",
                **dict.fromkeys(
                    (
                        "bootID",
                        "containerRuntimeVersion",
                        "kernelVersion",
                        "kubeProxyVersion",
                        "kubeletVersion",
                        "machineID",
                        "osImage",
                        "systemUUID",
                    ),
                    "",
                ),
            },
        },
    }


def _create_nodes(api: k8s.ApiClient, specs: list[NodeSpec]) -> None:
    core = k8s.CoreV1Api(api)

    def create(spec: NodeSpec) -> None:
        for attempt in range(5):
            try:
                # A plain dict body is sent as JSON unchanged (status included, which the
                # API server accepts on Node create).
                body: Any = node_manifest(spec)
                core.create_node(body, _request_timeout=30)
                return
            except ApiException as exc:
                if exc.status == 409:
                    return
                if exc.status and exc.status < 500 and exc.status != 429:
                    raise SandboxError(
                        f"sandbox failed to start: the API server refused node {spec.name}: "
                        f"{exc.status} {exc.reason}: {exc.body}"
                    ) from None
            except (HTTPError, OSError):
                pass
            time.sleep(0.5 * (attempt + 1))
        raise SandboxError(f"sandbox failed to start: could not create node {spec.name}")

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(create, specs))
