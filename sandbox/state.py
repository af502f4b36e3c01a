"""The sandbox's records: what a started sandbox writes to its state dir and what ``status``
reports. Written by :class:`gpufed.sandbox.runtime.Sandbox`; read by the CLI, tests and the
e2e harness (through the re-exports of :mod:`gpufed.sandbox.runtime`).

:class:`SandboxInfo` is ``<state>/sandbox.json``; :func:`write_kubeconfig` writes the
sandbox kubeconfig and each cluster's admin kubeconfig; :class:`SandboxStatus` is ``gpufed
local status``. :class:`SandboxError` is the one error the sandbox's API raises.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from kubernetes import client as k8s
from pydantic import BaseModel, Field

from gpufed.api.errors import GpufedError
from gpufed.api.fleet import HUB_CLUSTER_NAME
from gpufed.sandbox.controlplane import ControlPlaneInfo
from gpufed.sandbox.inventory import ClusterGPUs
from gpufed.sandbox.kube import api_client
from gpufed.sandbox.pki import Pki
from gpufed.sandbox.supervisor import ComponentStatus

#: etcd key prefix reserved for the hub process's own state in the sandbox's etcd.
HUB_ETCD_PREFIX = "/gpufed/hub/"


class SandboxError(GpufedError, RuntimeError):
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
    #: The hub and agents (None: clusters only, ``up(..., control_plane=None)``).
    control_plane: ControlPlaneInfo | None = None

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


def write_kubeconfig(
    path: Path,
    clusters: list[ClusterEndpoint],
    pki: Pki,
    *,
    current: str,
    user: str = "admin",
    token: str | None = None,
) -> None:
    """Write a kubeconfig (mode 0600) with one cluster and context per endpoint, all as one
    user (the admin of ``pki`` and its token, unless ``user``/``token`` say otherwise; CA
    embedded), with ``current`` as current context."""
    ca = base64.b64encode(pki.ca_crt.read_bytes()).decode()
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": c.name, "cluster": {"server": c.server, "certificate-authority-data": ca}}
            for c in clusters
        ],
        "users": [{"name": user, "user": {"token": token or pki.token}}],
        "contexts": [
            {"name": c.context, "context": {"cluster": c.name, "user": user}} for c in clusters
        ],
        "current-context": current,
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
