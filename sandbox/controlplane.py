"""The gpufed control plane inside the sandbox: the hub and one agent per member, as processes.

:meth:`gpufed.sandbox.runtime.Sandbox.up` calls this module once the clusters are up (unless
asked for clusters only). Everything goes through the ``gpufed`` command a user would run, so
the sandbox imports nothing of the hub or the agent:

1. ``gpufed hub install`` applies the CRDs and the ``gpufed-system`` namespace to the hub
   cluster; the CRDs are awaited until ``Established``;
2. ``gpufed hub join <member> --label k=v --token-file <state>/tokens/<member>.token`` for
   every member (together): a join-token Secret and the MemberCluster with the fleet's labels;
3. the hub's server certificate ``pki/hub.crt`` is signed by the sandbox CA (agents verify it
   with ``pki/ca.crt``);
4. component ``hub``: ``gpufed hub`` on the sandbox's etcd under ``/gpufed/hub/``, agent gRPC
   on ``127.0.0.1:<port>`` (TLS), ``/metrics`` etc. on ``127.0.0.1:<port>``, a fixed replica id
   (``sandbox-hub``) so a restarted hub takes its own stale leader key over at once;
5. components ``agent/<member>``: ``gpufed agent`` with its ServiceAccount kubeconfig, its
   token and the CA;
6. :func:`wait_ready`: the hub answers ``/leaderz`` (leading, lists done), every agent answers
   ``/readyz`` (inventory listed, stream welcomed) and every MemberCluster is Ready with all its
   nodes reported.

Timers (member lease, member-lost timeout, heartbeat, leader lease) come from
:class:`ControlPlaneOptions`; tests shorten them for fault drills. Files in the state dir::

    tokens/<member>.token     join tokens (0600)
    pki/hub.crt, pki/hub.key  the hub's agent-listener certificate
    hub/                      the hub's --data-dir
    logs/hub.log, logs/agent/<member>.log, run/hub.pid, run/agent/<member>.pid
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, Field
from urllib3.exceptions import HTTPError

from gpufed.api.errors import GpufedError
from gpufed.api.fleet import FleetSpec
from gpufed.api.labels import GROUP, VERSION
from gpufed.api.membercluster import PLURAL as MEMBERCLUSTERS
from gpufed.api.membercluster import MemberCluster
from gpufed.sandbox.pki import issue_server_cert, load_pki
from gpufed.sandbox.supervisor import ComponentSpec, Probe, Supervisor, http_ok, log_tail

log = structlog.get_logger("gpufed.sandbox.controlplane")

#: Component name of the hub process.
HUB_COMPONENT = "hub"
#: Replica id of the sandbox's one hub (``--hub-id``).
SANDBOX_HUB_ID = "sandbox-hub"
#: Namespace of the join-token Secrets (``gpufed hub install`` creates it).
TOKEN_NAMESPACE = "gpufed-system"


def agent_component(member: str) -> str:
    """Component name of ``member``'s agent (``agent/<member>``)."""
    return f"agent/{member}"


class ControlPlaneError(GpufedError, RuntimeError):
    """Installing, joining or starting the hub or an agent failed (message names the step, the
    command or component and its log)."""


class ControlPlaneOptions(BaseModel):
    """How the sandbox runs the hub and the agents.

    ``member_lease_s``: hub ``--member-lease`` (silence until a member is NotReady);
    ``member_lost_s``: ``--member-lost-timeout``; ``heartbeat_s``: ``--heartbeat-interval``
    (what the hub asks agents to send); ``leader_lease_s``: ``--leader-lease``;
    ``hub_args`` / ``agent_args``: further flags appended to every ``gpufed hub`` / ``gpufed
    agent`` command line; ``ready_timeout_s``: how long ``up`` waits for the members to turn
    Ready on the hub.
    """

    member_lease_s: float = Field(default=40.0, gt=0)
    member_lost_s: float = Field(default=600.0, gt=0)
    heartbeat_s: float = Field(default=10.0, gt=0)
    leader_lease_s: int = Field(default=15, ge=2)
    hub_args: list[str] = Field(default_factory=list)
    agent_args: list[str] = Field(default_factory=list)
    ready_timeout_s: float = Field(default=120.0, gt=0)


class AgentEndpoint(BaseModel):
    """One member's agent: ``health``: base URL of its ``/healthz``, ``/readyz``, ``/metrics``;
    ``token_file``: its join token."""

    member: str
    component: str
    health: str
    token_file: Path


class ControlPlaneInfo(BaseModel):
    """What the sandbox's control plane offers (part of ``sandbox.json``).

    ``hub_address``: ``host:port`` agents dial (gRPC, TLS signed by ``ca_file``); ``hub_http``:
    base URL of the hub's ``/metrics``, ``/healthz``, ``/readyz``; ``hub_etcd_prefix``: where
    the hub keeps its state in the sandbox's etcd; ``agents``: by member name.
    """

    hub_address: str
    hub_http: str
    hub_etcd_prefix: str
    ca_file: Path
    agents: dict[str, AgentEndpoint]
    options: ControlPlaneOptions


def gpufed_command() -> list[str]:
    """How to run ``gpufed`` from this interpreter: the console script next to it when
    installed (a virtual environment), else ``python -m gpufed.cli``."""
    script = Path(sys.executable).with_name("gpufed")
    if script.is_file():
        return [str(script)]
    found = shutil.which("gpufed")
    return [found] if found else [sys.executable, "-m", "gpufed.cli"]


def configure(
    sup: Supervisor,
    *,
    state_dir: Path,
    fleet: FleetSpec,
    etcd_url: str,
    hub_etcd_prefix: str,
    kubeconfigs: dict[str, Path],
    ports: dict[str, int],
    options: ControlPlaneOptions,
) -> ControlPlaneInfo:
    """Write the tokens directory, the hub certificate and register ``hub`` and
    ``agent/<member>`` with the supervisor (nothing starts). ``kubeconfigs``: single-context
    admin kubeconfig by cluster name (``hub`` and members); ``ports``: ``hub-grpc``,
    ``hub-http`` and ``agent/<member>`` (health port)."""
    pki = load_pki(state_dir / "pki")
    crt, key = issue_server_cert(pki, "hub")
    tokens = state_dir / "tokens"
    tokens.mkdir(mode=0o700, parents=True, exist_ok=True)
    gpufed = gpufed_command()
    grpc_port, http_port = ports["hub-grpc"], ports["hub-http"]
    hub_address = f"127.0.0.1:{grpc_port}"
    hub_http = f"http://127.0.0.1:{http_port}"
    sup.register(
        ComponentSpec(
            name=HUB_COMPONENT,
            argv=[
                *gpufed,
                "hub",
                f"--kubeconfig={kubeconfigs['hub']}",
                f"--etcd={etcd_url.split('://', 1)[-1]}",
                f"--etcd-prefix={hub_etcd_prefix}",
                f"--listen={hub_address}",
                f"--http-listen=127.0.0.1:{http_port}",
                f"--tls-cert={crt}",
                f"--tls-key={key}",
                f"--data-dir={state_dir / 'hub'}",
                f"--hub-id={SANDBOX_HUB_ID}",
                f"--token-namespace={TOKEN_NAMESPACE}",
                f"--member-lease={options.member_lease_s:g}",
                f"--member-lost-timeout={options.member_lost_s:g}",
                f"--heartbeat-interval={options.heartbeat_s:g}",
                f"--leader-lease={options.leader_lease_s}",
                # plain Jobs and JobSets applied to the hub (off by default: docs/hub.md); the
                # demo and the e2e use them. A later --managed-kinds in hub_args wins.
                "--managed-kinds=Job,JobSet",
                *options.hub_args,
            ],
            ports=[grpc_port, http_port],
            probe=Probe(kind="http", url=f"{hub_http}/healthz"),
            start_timeout_s=60,
        )
    )
    agents: dict[str, AgentEndpoint] = {}
    for m in fleet.names:
        name = agent_component(m)
        health_port = ports[name]
        token_file = tokens / f"{m}.token"
        sup.register(
            ComponentSpec(
                name=name,
                argv=[
                    *gpufed,
                    "agent",
                    f"--cluster={m}",
                    f"--hub={hub_address}",
                    f"--token-file={token_file}",
                    f"--ca-file={pki.ca_crt}",
                    f"--kubeconfig={kubeconfigs[m]}",
                    f"--health-port={health_port}",
                    *options.agent_args,
                ],
                ports=[health_port],
                probe=Probe(kind="http", url=f"http://127.0.0.1:{health_port}/healthz"),
                start_timeout_s=60,
            )
        )
        agents[m] = AgentEndpoint(
            member=m,
            component=name,
            health=f"http://127.0.0.1:{health_port}",
            token_file=token_file,
        )
    return ControlPlaneInfo(
        hub_address=hub_address,
        hub_http=hub_http,
        hub_etcd_prefix=hub_etcd_prefix,
        ca_file=pki.ca_crt,
        agents=agents,
        options=options,
    )


def port_names(fleet: FleetSpec) -> list[str]:
    """The ports :func:`configure` needs picked: hub gRPC and HTTP, one health port per agent."""
    return ["hub-grpc", "hub-http", *(agent_component(m) for m in fleet.names)]


# --- hub cluster preparation ------------------------------------------------------------------


def _run(argv: list[str], what: str, log_file: Path) -> subprocess.Popen[bytes]:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        out.write(f"==== gpufed: {' '.join(argv)}\n".encode())
        out.flush()
        log.info("controlplane.run", what=what)
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)


def _check(proc: subprocess.Popen[bytes], what: str, log_file: Path, timeout_s: float) -> None:
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    if code != 0:
        tail = "\n".join(f"    {t}" for t in log_tail(log_file))
        cause = f"exited with code {code}" if code is not None else f"timed out ({timeout_s:.0f}s)"
        raise ControlPlaneError(f"{what} {cause} (log: {log_file})\n  last log lines:\n{tail}")


def prepare_hub_cluster(
    state_dir: Path,
    fleet: FleetSpec,
    hub_kubeconfig: Path,
    hub_api: k8s.ApiClient,
    cp: ControlPlaneInfo,
    *,
    timeout_s: float = 180.0,
) -> None:
    """Install the CRDs and join every member, through the ``gpufed hub`` sub-commands (their
    output goes to ``logs/hub-setup.log``). Raises :class:`ControlPlaneError`.

    ``timeout_s`` bounds each sub-command (seconds). The joins run side by side, one Python
    process each: on a loaded 2-core machine their start alone took over 60 s, so the bound is
    generous (it only matters when something is stuck)."""
    gpufed = gpufed_command()
    log_file = state_dir / "logs" / "hub-setup.log"
    kc = f"--kubeconfig={hub_kubeconfig}"
    install = _run([*gpufed, "hub", "install", kc], "gpufed hub install", log_file)
    _check(install, "gpufed hub install", log_file, timeout_s)
    wait_crds_established(hub_api, timeout_s)
    joins = []
    for cluster in fleet.clusters:
        argv = [*gpufed, "hub", "join", cluster.name, kc, f"--token-namespace={TOKEN_NAMESPACE}"]
        for k, v in sorted(cluster.labels.items()):
            argv.append(f"--label={k}={v}")
        argv.append(f"--token-file={cp.agents[cluster.name].token_file}")
        joins.append((cluster.name, _run(argv, f"gpufed hub join {cluster.name}", log_file)))
    for name, proc in joins:
        _check(proc, f"gpufed hub join {name}", log_file, timeout_s)


def wait_crds_established(api: k8s.ApiClient, timeout_s: float) -> None:
    """Until the ``gpujobs``, ``memberclusters`` and ``gpuqueues`` CRDs are served (condition
    Established)."""
    ext = k8s.ApiextensionsV1Api(api)
    names = [f"gpujobs.{GROUP}", f"{MEMBERCLUSTERS}.{GROUP}", f"gpuqueues.{GROUP}"]
    deadline = time.monotonic() + timeout_s
    while names:
        name = names[0]
        try:
            crd: Any = ext.read_custom_resource_definition(name, _request_timeout=10)
            conds = (crd.status.conditions or []) if crd.status else []
            if any(c.type == "Established" and c.status == "True" for c in conds):
                names.pop(0)
                continue
        except (ApiException, HTTPError, OSError):
            pass
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"CRD {name} not Established after {timeout_s:.0f}s")
        time.sleep(0.1)


# --- readiness --------------------------------------------------------------------------------


def member_clusters(api: k8s.ApiClient) -> dict[str, MemberCluster]:
    """The hub's MemberClusters by name (raw reads, validated with the API model)."""
    custom: Any = k8s.CustomObjectsApi(api)
    raw = custom.list_cluster_custom_object(GROUP, VERSION, MEMBERCLUSTERS, _request_timeout=10)
    out = {}
    for item in raw.get("items", []):
        mc = MemberCluster.model_validate(item)
        out[mc.metadata.name or ""] = mc
    return out


def not_ready(
    cp: ControlPlaneInfo, hub_api: k8s.ApiClient, expected_nodes: dict[str, int]
) -> list[str]:
    """What keeps the control plane from being ready, one phrase each ([] when ready): the hub's
    ``/leaderz``, each agent's ``/readyz``, each member's Ready condition and node count on the
    hub (``expected_nodes``: member -> nodes of its fleet spec)."""
    waiting = []
    if not http_ok(f"{cp.hub_http}/leaderz"):
        waiting.append("hub /leaderz")
    for agent in cp.agents.values():
        if not http_ok(f"{agent.health}/readyz"):
            waiting.append(f"{agent.component} /readyz")
    try:
        members = member_clusters(hub_api)
    except (ApiException, HTTPError, OSError, ValueError):
        return [*waiting, "MemberClusters readable on the hub"]
    for m, nodes in expected_nodes.items():
        mc = members.get(m)
        st = mc.status if mc else None
        if st is None or not st.ready():
            waiting.append(f"MemberCluster {m} Ready")
        elif (st.nodes or 0) != nodes:
            waiting.append(f"MemberCluster {m} reports {st.nodes or 0}/{nodes} nodes")
    return waiting


def wait_ready(
    cp: ControlPlaneInfo,
    hub_api: k8s.ApiClient,
    expected_nodes: dict[str, int],
    *,
    timeout_s: float,
    alive: Callable[[], str | None] = lambda: None,
) -> None:
    """Poll :func:`not_ready` until it is empty (external processes: no events to await).
    ``alive`` returns the name of a component that died meanwhile (then fail at once).
    Raises :class:`ControlPlaneError` naming what was still missing."""
    deadline = time.monotonic() + timeout_s
    while True:
        waiting = not_ready(cp, hub_api, expected_nodes)
        if not waiting:
            return
        if dead := alive():
            raise ControlPlaneError(f"{dead} exited while the control plane was coming up")
        if time.monotonic() > deadline:
            raise ControlPlaneError(
                f"control plane not ready after {timeout_s:.0f}s: waiting for " + ", ".join(waiting)
            )
        time.sleep(0.25)
