"""The local sandbox's lifecycle: bring up, wait for, report on and stop one etcd, a hub API
server and, per member cluster, an API server, controller manager, scheduler and kwok, all as
processes on 127.0.0.1 (and, on request, the hub and agents of :mod:`gpufed.sandbox.controlplane`).

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

The parts it puts together, one module each: :mod:`~gpufed.sandbox.components` (the processes'
command lines), :mod:`~gpufed.sandbox.scheduler` (the kube-scheduler configuration),
:mod:`~gpufed.sandbox.nodes` (the fleet's Node objects), :mod:`~gpufed.sandbox.state`
(``sandbox.json``, kubeconfigs, status records, :class:`SandboxError`; re-exported here).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import structlog
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from gpufed.api.fleet import HUB_CLUSTER_NAME, FleetError, FleetSpec, node_specs
from gpufed.sandbox import cddriver as cd_driver
from gpufed.sandbox import components, controlplane, identities, operators
from gpufed.sandbox import dradriver as dra_driver
from gpufed.sandbox.binaries import CORE_BINARIES, BinariesError, BinDir, ensure_binaries
from gpufed.sandbox.controlplane import ControlPlaneError, ControlPlaneOptions
from gpufed.sandbox.inventory import ClusterGPUs, cluster_gpus
from gpufed.sandbox.kube import dra_gpus_by_node, list_nodes_raw, node_is_ready
from gpufed.sandbox.nodes import create_nodes, node_manifest
from gpufed.sandbox.pki import create_pki, load_pki
from gpufed.sandbox.state import (
    HUB_ETCD_PREFIX,
    ClusterEndpoint,
    ClusterStatus,
    SandboxError,
    SandboxInfo,
    SandboxStatus,
    default_state_dir,
    write_kubeconfig,
)
from gpufed.sandbox.supervisor import ComponentError, Supervisor, http_ok

# The records and node_manifest are re-exported: the CLI, tests, the e2e harness and
# scripts/bench_agent.py import them from here.
__all__ = [
    "HUB_ETCD_PREFIX",
    "ClusterEndpoint",
    "ClusterStatus",
    "Progress",
    "Sandbox",
    "SandboxError",
    "SandboxInfo",
    "SandboxStatus",
    "default_state_dir",
    "node_manifest",
]

log = structlog.get_logger("gpufed.sandbox")

Progress = Callable[[str], None]


# --- ports ----------------------------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (bound all at once so they differ, then
    released for the processes to take)."""
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
        control_plane: ControlPlaneOptions | None = None,
    ) -> SandboxInfo:
        """Start the sandbox for ``fleet`` and return when every API server answers and every
        node is Ready.

        With ``control_plane``, also install the CRDs on the hub cluster, join every member,
        start the hub and one agent per member (:mod:`gpufed.sandbox.controlplane`) and return
        once every member is Ready on the hub with all its nodes. Without it (the default of
        this Python API; ``gpufed local up`` passes options unless ``--clusters-only``), only
        the clusters run, e.g. for tests that run hubs of their own.

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
                picked = dict(ports or {})
                info = self._configure(fleet, fleet_file, bins, picked, control_plane)
                self._start(info, fleet, picked, apiserver_timeout_s, nodes_timeout_s, started)
                return self.info()
            except BaseException as exc:
                self._say("bring-up failed; stopping what was started")
                # Short grace: an API server interrupted mid-start can sit in its shutdown
                # for 10 s; nothing it holds is worth waiting for.
                self.supervisor.stop_all(grace_s=2.0)
                with contextlib.suppress(SandboxError, OSError, ValueError):
                    self._write_info(self.info().model_copy(update={"phase": "failed"}))
                if isinstance(exc, ControlPlaneError):
                    raise SandboxError(f"sandbox failed to start: {exc}") from None
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
        self,
        fleet: FleetSpec,
        fleet_file: Path | None,
        bins: BinDir,
        ports: dict[str, int],
        control_plane: ControlPlaneOptions | None,
    ) -> SandboxInfo:
        d = self.state_dir
        names = [HUB_CLUSTER_NAME, *fleet.names]
        wanted = components.port_names(fleet) + operators.port_names(fleet)
        if control_plane is not None:
            wanted += controlplane.port_names(fleet)
        free = iter(free_ports(len(wanted)))
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
            write_kubeconfig(ep.kubeconfig, [ep], pki, current=n)
        kubeconfig = d / "kubeconfig"
        write_kubeconfig(kubeconfig, list(clusters.values()), pki, current=HUB_CLUSTER_NAME)
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
        components.write_config_files(info)
        for spec in components.cluster_components(info, bins, pki, ports):
            self.supervisor.register(spec)
        for cluster in fleet.clusters:
            if cluster.compute_domains:  # the simulated ComputeDomain controller
                self.supervisor.register(components.cd_driver(clusters[cluster.name]))
        if control_plane is not None:
            cp = controlplane.configure(
                self.supervisor,
                state_dir=d,
                fleet=fleet,
                etcd_url=etcd_url,
                hub_etcd_prefix=info.hub_etcd_prefix,
                # The hub and agents run as their ServiceAccounts (sandbox/identities.py).
                kubeconfigs={n: identities.kubeconfig_path(d, n) for n in clusters},
                ports=ports,
                options=control_plane,
            )
            info = info.model_copy(update={"control_plane": cp})
        self._write_info(info)
        return info

    def _start(
        self,
        info: SandboxInfo,
        fleet: FleetSpec,
        ports: Mapping[str, int],
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
            client = info.api_client(cluster.name, pool_size=16)
            create_nodes(client, specs)
            dra_driver.publish(client, specs)  # the simulated DRA driver (dra: true pools)
            if cluster.compute_domains:  # its ComputeDomain CRD, channel class and slices
                cd_driver.install(client, specs)
        created = f"{total} node{'' if total == 1 else 's'} created"
        say(f"  {created:<44} in {time.monotonic() - t0:5.1f}s")
        t0 = time.monotonic()
        limit = nodes_timeout_s if nodes_timeout_s is not None else 90 + 0.1 * total
        self._wait_nodes_ready(info, fleet, limit)
        say(f"  {'all nodes Ready':<44} in {time.monotonic() - t0:5.1f}s")
        drivers = [f"cd-driver/{c.name}" for c in fleet.clusters if c.compute_domains]
        if drivers:
            sup.start_many(drivers)
        t0 = time.monotonic()
        # before the agents: they discover the kinds a member serves when they connect
        if ops := operators.start_operators(sup, info, fleet, ports):
            say(
                f"  {f'operators ({len(ops)} processes)':<44} ready in {time.monotonic() - t0:5.1f}s"
            )
        if info.control_plane is not None:
            self._start_control_plane(info, fleet)
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

    def _start_control_plane(self, info: SandboxInfo, fleet: FleetSpec) -> None:
        cp = info.control_plane
        assert cp is not None
        say = self._say
        t0 = time.monotonic()
        hub_api = info.api_client(HUB_CLUSTER_NAME)
        controlplane.prepare_hub_cluster(self.state_dir, fleet, info.hub.kubeconfig, hub_api, cp)
        self._install_identities(info)
        say(
            f"  {'CRDs installed, members joined, RBAC applied':<44} in "
            f"{time.monotonic() - t0:5.1f}s"
        )
        t0 = time.monotonic()
        self.supervisor.start_many(
            [controlplane.HUB_COMPONENT, *(a.component for a in cp.agents.values())]
        )
        self.wait_control_plane(cp.options.ready_timeout_s, info=info)
        say(
            f"  {f'hub + {len(cp.agents)} agents, members Ready':<44} in {time.monotonic() - t0:5.1f}s"
        )

    def _install_identities(self, info: SandboxInfo) -> None:
        """The shipped RBAC and a ServiceAccount kubeconfig for the hub and every agent."""
        pki = load_pki(self.state_dir / "pki")
        for name, ep in info.clusters.items():
            hub = name == HUB_CLUSTER_NAME
            try:
                identities.install(
                    info.api_client(name),
                    ep,
                    pki,
                    identities.kubeconfig_path(self.state_dir, name),
                    component="hub" if hub else "agent",
                    account=identities.HUB_ACCOUNT if hub else identities.AGENT_ACCOUNT,
                )
            except identities.IdentityError as exc:
                raise SandboxError(f"sandbox failed to start: {exc}") from None

    def wait_control_plane(
        self, timeout_s: float = 120.0, *, info: SandboxInfo | None = None
    ) -> None:
        """Return once the hub leads, every agent is connected and every member is Ready on
        the hub with all its nodes; :class:`SandboxError` naming what is missing after
        ``timeout_s`` or when a control-plane process exits meanwhile."""
        info = info or self.info()
        cp = info.control_plane
        if cp is None:
            raise SandboxError(
                f"the sandbox in {self.state_dir} runs no hub or agents (started clusters only)"
            )
        comps = [controlplane.HUB_COMPONENT, *(a.component for a in cp.agents.values())]

        def dead() -> str | None:
            return next((c for c in ["etcd", *comps] if not self.supervisor.is_running(c)), None)

        expected = {m: info.clusters[m].nodes for m in cp.agents}
        try:
            controlplane.wait_ready(
                cp, info.api_client(HUB_CLUSTER_NAME), expected, timeout_s=timeout_s, alive=dead
            )
        except ControlPlaneError as exc:
            logs = ", ".join(str(self.supervisor.log_path(c)) for c in comps[:2])
            raise SandboxError(f"{exc} (logs: {logs}, ...)") from None

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
                    api = info.api_client(ep.name)
                    gpus = cluster_gpus(ep.name, list_nodes_raw(api), dra_gpus_by_node(api))
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
        return [
            cluster_gpus(m, list_nodes_raw(api), dra_gpus_by_node(api))
            for m in info.members
            for api in (info.api_client(m),)
        ]
