"""Builders named after shapes: raw Kubernetes objects as the member API returns them."""

from __future__ import annotations

from typing import Any

from gpufed.api.labels import DEFAULT_ORIGIN, JOB_UID_LABEL, ORIGIN_LABEL
from gpufed.api.work import WorkItem


def hgx_node(
    name: str,
    *,
    gpus: int | str = 8,
    product: str = "NVIDIA-H100-80GB-HBM3",
    ready: bool = True,
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
    labels: dict[str, str] | None = None,
    allocatable: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An 8-GPU HGX node as GFD and the device plugin publish it."""
    alloc = (
        allocatable
        if allocatable is not None
        else {"cpu": "220", "memory": "1900Gi", "pods": "110", "nvidia.com/gpu": gpus}
    )
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.count": str(gpus),
                **(labels or {}),
            },
        },
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {
            "allocatable": alloc,
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
        },
    }


def nvl72_tray(name: str, clique: str, **kw: Any) -> dict[str, Any]:
    """A GB200 NVL72 compute tray (4 GPUs) in NVLink clique ``clique``."""
    node = hgx_node(name, gpus=4, product="NVIDIA-GB200", **kw)
    node["metadata"]["labels"]["nvidia.com/gpu.clique"] = clique
    return node


def gpu_pod(
    name: str,
    node: str | None,
    *,
    gpus: int | str = 1,
    namespace: str = "team-a",
    phase: str = "Running",
    job_uid: str | None = None,
    terminating: bool = False,
    cpu: str | None = None,
) -> dict[str, Any]:
    """A pod asking for ``gpus`` through limits only (requests default to limits)."""
    limits: dict[str, Any] = {"nvidia.com/gpu": gpus}
    if cpu is not None:
        limits["cpu"] = cpu
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {}}
    if job_uid:
        meta["labels"][JOB_UID_LABEL] = job_uid
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "trainer:1", "resources": {"limits": limits}}]
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": phase},
    }


def owned_by(uid: str, origin: str = DEFAULT_ORIGIN) -> dict[str, str]:
    """The ownership labels of job ``uid`` of hub ``origin`` (as the hub prepares them)."""
    return {ORIGIN_LABEL: origin, JOB_UID_LABEL: uid}


def gpu_job(
    uid: str, name: str = "train", *, namespace: str | None = None, gpus: int = 8
) -> dict[str, Any]:
    """A batch/v1 Job manifest as the hub prepares it (ownership labels on it, job UID label on
    its pods)."""
    meta: dict[str, Any] = {"name": name, "labels": owned_by(uid)}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "template": {
                "metadata": {"labels": {JOB_UID_LABEL: uid}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "trainer:1",
                            "resources": {"limits": {"nvidia.com/gpu": gpus}},
                        }
                    ],
                },
            }
        },
    }


def config_map(uid: str, name: str = "train-config", **kw: Any) -> dict[str, Any]:
    """A ConfigMap manifest of job ``uid`` as the hub prepares it."""
    meta: dict[str, Any] = {"name": name, "labels": owned_by(uid), **kw}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v"}}


def admins_object(kind: str, name: str, namespace: str = "team-a", **labels: str) -> dict[str, Any]:
    """An object the member's admins made (no gpufed labels unless given): ``ConfigMap``,
    ``Secret``, ``Service`` or ``Job``."""
    api_version = "batch/v1" if kind == "Job" else "v1"
    meta = {"name": name, "namespace": namespace, "labels": dict(labels)}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "data": {"theirs": "1"}}


def apply_item(uid: str, revision: int = 1, *manifests: dict[str, Any], **kw: Any) -> WorkItem:
    """An Apply of job ``uid`` in team-a (default: one Job ``job-<uid>``)."""
    return WorkItem(
        job_uid=uid,
        job=f"team-a/{uid}",
        revision=revision,
        op="Apply",
        namespace="team-a",
        manifests=manifests or (gpu_job(uid, f"job-{uid}"),),
        **kw,
    )


def delete_item(uid: str, revision: int, *manifests: dict[str, Any]) -> WorkItem:
    """A Delete of job ``uid`` in team-a, naming ``manifests`` (the hub names none)."""
    return WorkItem(
        job_uid=uid,
        job=f"team-a/{uid}",
        revision=revision,
        op="Delete",
        namespace="team-a",
        manifests=manifests,
    )
