"""kind provider: the sandbox topology as kind clusters (one per hub/member) with kwok nodes.

Where a Docker engine runs, :class:`KindProvider` creates one kind cluster per sandbox cluster
(``gpufed-hub``, ``gpufed-<member>``), runs each member's scheduler with the process sandbox's
configuration (:mod:`gpufed.sandbox.scheduler`: MostAllocated on ``nvidia.com/gpu``), installs
kwok in-cluster (its release manifest, Stage CRD mode) with gpufed's stages, and creates the
fleet's nodes as kwok nodes (selected by the ``kwok.x-k8s.io/node=fake`` annotation, so kind's
own control-plane node stays real).

The generated files are plain data (:func:`kind_bundle`) and unit-tested; bringing clusters up
needs ``docker``, ``kind`` and ``kubectl`` on PATH. Without a Docker engine
:meth:`KindProvider.available` says why, and its tests skip with that reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpufed.api.fleet import HUB_CLUSTER_NAME, ClusterSpec, FleetSpec, node_specs
from gpufed.sandbox.binaries import K8S_VERSION, KWOK_VERSION
from gpufed.sandbox.components import KWOK_STAGES
from gpufed.sandbox.dradriver import device_classes, node_slice
from gpufed.sandbox.nodes import node_manifest
from gpufed.sandbox.scheduler import scheduler_configuration
from gpufed.sandbox.state import SandboxError

#: kind node image matching the process sandbox's Kubernetes pin.
KIND_NODE_IMAGE = f"kindest/node:{K8S_VERSION}"
#: kwok's in-cluster deployment (controller + CRDs) for the pinned kwok version.
KWOK_RELEASE_URL = (
    f"https://github.com/kubernetes-sigs/kwok/releases/download/{KWOK_VERSION}/kwok.yaml"
)
_SCHEDULER_DIR = "/etc/kubernetes/gpufed"


def kind_cluster_name(cluster: str) -> str:
    """kind cluster name of a sandbox cluster (``hub`` -> ``gpufed-hub``); its kubeconfig
    context is ``kind-<that>``."""
    return f"gpufed-{cluster}"


def scheduler_config() -> dict[str, Any]:
    """The sandbox's kube-scheduler configuration (:mod:`gpufed.sandbox.scheduler`) with the
    kubeconfig path of a kind control plane."""
    return scheduler_configuration("/etc/kubernetes/scheduler.conf")


def kind_config(
    cluster: str, *, scheduler_dir: Path | None, node_image: str = KIND_NODE_IMAGE
) -> dict[str, Any]:
    """kind ``Cluster`` config: one control-plane node, API server on 127.0.0.1 (random port);
    for members (``scheduler_dir`` given) the host directory holding ``scheduler.yaml`` is
    mounted and kube-scheduler started with it (kubeadm v1beta4 patch)."""
    node: dict[str, Any] = {"role": "control-plane", "image": node_image}
    cfg: dict[str, Any] = {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "name": kind_cluster_name(cluster),
        "networking": {"apiServerAddress": "127.0.0.1", "apiServerPort": 0},
        "nodes": [node],
    }
    if scheduler_dir is not None:
        node["extraMounts"] = [
            {"hostPath": str(scheduler_dir), "containerPath": _SCHEDULER_DIR, "readOnly": True}
        ]
        patch = {
            "apiVersion": "kubeadm.k8s.io/v1beta4",
            "kind": "ClusterConfiguration",
            "scheduler": {
                "extraArgs": [{"name": "config", "value": f"{_SCHEDULER_DIR}/scheduler.yaml"}],
                "extraVolumes": [
                    {
                        "name": "gpufed",
                        "hostPath": _SCHEDULER_DIR,
                        "mountPath": _SCHEDULER_DIR,
                        "readOnly": True,
                        "pathType": "Directory",
                    }
                ],
            },
        }
        node["kubeadmConfigPatches"] = [yaml.safe_dump(patch, sort_keys=False)]
    return cfg


def stage_manifests() -> list[dict[str, Any]]:
    """gpufed's kwok Stage objects (the same stages the process sandbox loads from a file),
    for kwok's Stage CRD mode."""
    return [d for d in yaml.safe_load_all(KWOK_STAGES.read_text()) if d]


def kwok_nodes(cluster: ClusterSpec) -> list[dict[str, Any]]:
    """The cluster's kwok Node manifests (labels, taints, capacity, ``kwok.x-k8s.io/node``),
    followed, when it has ``dra: true`` pools, by what the simulated DRA driver publishes
    (:mod:`gpufed.sandbox.dradriver`: the DeviceClasses and one ResourceSlice per DRA node)."""
    specs = node_specs(cluster)
    slices = [s for s in (node_slice(spec) for spec in specs) if s is not None]
    return [node_manifest(s) for s in specs] + (device_classes() + slices if slices else [])


@dataclass(frozen=True)
class KindClusterFiles:
    """Files written for one kind cluster (``scheduler``, ``nodes`` and ``stages`` only for
    members)."""

    name: str
    kind_config: Path
    scheduler: Path | None = None
    nodes: Path | None = None
    stages: Path | None = None


def kind_bundle(fleet: FleetSpec, out_dir: Path) -> list[KindClusterFiles]:
    """Write kind configs, scheduler configs, Stage and Node manifests for the hub and every
    member under ``out_dir/<cluster>/``; return their paths (hub first)."""
    out: list[KindClusterFiles] = []
    hub_dir = out_dir / HUB_CLUSTER_NAME
    hub_dir.mkdir(parents=True, exist_ok=True)
    hub_cfg = hub_dir / "kind.yaml"
    hub_cfg.write_text(
        yaml.safe_dump(kind_config(HUB_CLUSTER_NAME, scheduler_dir=None), sort_keys=False)
    )
    out.append(KindClusterFiles(HUB_CLUSTER_NAME, hub_cfg))
    stages = yaml.safe_dump_all(stage_manifests(), sort_keys=False)
    for c in fleet.clusters:
        d = out_dir / c.name
        d.mkdir(parents=True, exist_ok=True)
        cfg, sched, nodes, stage_file = (
            d / "kind.yaml",
            d / "scheduler.yaml",
            d / "nodes.yaml",
            d / "stages.yaml",
        )
        cfg.write_text(
            yaml.safe_dump(kind_config(c.name, scheduler_dir=d.absolute()), sort_keys=False)
        )
        sched.write_text(yaml.safe_dump(scheduler_config(), sort_keys=False))
        nodes.write_text(yaml.safe_dump_all(kwok_nodes(c), sort_keys=False))
        stage_file.write_text(stages)
        out.append(KindClusterFiles(c.name, cfg, sched, nodes, stage_file))
    return out


class KindProvider:
    """Create/delete the fleet as kind clusters (needs docker, kind, kubectl)."""

    def __init__(self, workdir: Path, *, kind: str = "kind", kubectl: str = "kubectl") -> None:
        self.workdir = Path(workdir)
        self.kind = kind
        self.kubectl = kubectl

    @staticmethod
    def available() -> tuple[bool, str]:
        """(True, "") when ``docker info`` succeeds and kind/kubectl are on PATH, else (False,
        reason)."""
        docker = shutil.which("docker")
        if docker is None:
            return False, "no Docker engine: the `docker` command is not installed"
        proc = subprocess.run(
            [docker, "info", "--format", "{{json .ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if proc.returncode != 0:
            why = (proc.stderr or proc.stdout).strip().splitlines()
            return False, f"`docker info` failed: {why[-1] if why else proc.returncode}"
        for tool in ("kind", "kubectl"):
            if shutil.which(tool) is None:
                return False, f"`{tool}` is not on PATH"
        return True, ""

    def _run(self, argv: list[str], **kw: Any) -> str:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)
        if proc.returncode != 0:
            raise SandboxError(f"`{' '.join(argv)}` failed: {proc.stderr.strip()}")
        return str(proc.stdout)

    def up(self, fleet: FleetSpec) -> Path:
        """Create every cluster, install kwok with gpufed's stages, create the nodes; return a
        kubeconfig with contexts ``kind-gpufed-<cluster>``. Raises :class:`SandboxError`."""
        ok, reason = self.available()
        if not ok:
            raise SandboxError(f"kind provider unavailable: {reason}")
        kubeconfig = self.workdir / "kubeconfig"
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        for files in kind_bundle(fleet, self.workdir):
            name = kind_cluster_name(files.name)
            self._run(
                [
                    self.kind,
                    "create",
                    "cluster",
                    "--config",
                    str(files.kind_config),
                    "--wait",
                    "120s",
                ],
                env=env,
            )
            if files.nodes is None or files.stages is None:
                continue
            ctx = f"--context=kind-{name}"
            self._run([self.kubectl, ctx, "apply", "-f", KWOK_RELEASE_URL], env=env)
            self._run(
                [
                    self.kubectl,
                    ctx,
                    "wait",
                    "--for=condition=Established",
                    "crd/stages.kwok.x-k8s.io",
                    "--timeout=120s",
                ],
                env=env,
            )
            self._run([self.kubectl, ctx, "apply", "-f", str(files.stages)], env=env)
            self._run([self.kubectl, ctx, "apply", "-f", str(files.nodes)], env=env)
        return kubeconfig

    def down(self, fleet: FleetSpec) -> None:
        """Delete every kind cluster of the fleet (missing ones are ignored)."""
        existing = set(self._run([self.kind, "get", "clusters"]).split())
        for name in [HUB_CLUSTER_NAME, *fleet.names]:
            if kind_cluster_name(name) in existing:
                self._run([self.kind, "delete", "cluster", "--name", kind_cluster_name(name)])
