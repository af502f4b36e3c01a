"""Builders for hub unit tests, named after the shapes they make."""

from __future__ import annotations

from typing import Any

from gpufed.api.gpujob import GPUJob
from gpufed.api.inventory import NodeInventory


def container(gpus: int = 0, *, cpu: str | None = None, name: str = "main") -> dict[str, Any]:
    """A container with ``gpus`` whole GPUs as limits (and optional cpu requests)."""
    resources: dict[str, Any] = {}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": gpus}
    if cpu:
        resources["requests"] = {"cpu": cpu}
    return {"name": name, "image": "trainer:1.0", "resources": resources}


def pod_spec(gpus: int = 8, **extra: Any) -> dict[str, Any]:
    """A pod spec with one GPU container."""
    return {"restartPolicy": "Never", "containers": [container(gpus)], **extra}


def batch_job(
    gpus: int = 8,
    *,
    parallelism: int | None = None,
    completions: int | None = None,
    name: str | None = "train",
    **pod_extra: Any,
) -> dict[str, Any]:
    """A batch/v1 Job whose pods each take ``gpus`` GPUs."""
    spec: dict[str, Any] = {"template": {"spec": pod_spec(gpus, **pod_extra)}}
    if parallelism is not None:
        spec["parallelism"] = parallelism
    if completions is not None:
        spec["completions"] = completions
    job: dict[str, Any] = {"apiVersion": "batch/v1", "kind": "Job", "spec": spec}
    if name:
        job["metadata"] = {"name": name}
    return job


def jobset(*replicated: tuple[str, int, int, int], name: str = "js") -> dict[str, Any]:
    """A JobSet; each replicated job is ``(name, replicas, parallelism, gpus per pod)``."""
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {
            "replicatedJobs": [
                {
                    "name": rj_name,
                    "replicas": replicas,
                    "template": {
                        "spec": {
                            "parallelism": par,
                            "completions": par,
                            "template": {"spec": pod_spec(gpus)},
                        }
                    },
                }
                for rj_name, replicas, par, gpus in replicated
            ]
        },
    }


def pytorchjob(masters: int = 1, workers: int = 3, gpus: int = 8) -> dict[str, Any]:
    """A Kubeflow PyTorchJob with Master and Worker replica types."""
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "ptj"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"replicas": masters, "template": {"spec": pod_spec(gpus)}},
                "Worker": {"replicas": workers, "template": {"spec": pod_spec(gpus)}},
            }
        },
    }


def manifest_list(*items: dict[str, Any]) -> dict[str, Any]:
    """A ``kind: List`` template."""
    return {"apiVersion": "v1", "kind": "List", "items": list(items)}


def gpujob(
    template: dict[str, Any] | None = None,
    *,
    name: str = "llama-ft",
    namespace: str = "team-a",
    uid: str = "0f0e0d0c-0000-4000-8000-000000000001",
    placement: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    **meta: Any,
) -> GPUJob:
    """A GPUJob as the API server would return it."""
    obj: dict[str, Any] = {
        "apiVersion": "gpufed.io/v1alpha1",
        "kind": "GPUJob",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": "1",
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            **meta,
        },
        "spec": {"template": template or batch_job(), "placement": placement or {}},
    }
    if status is not None:
        obj["status"] = status
    return GPUJob.model_validate(obj)


def gpujob_obj(
    name: str = "j", uid: str = "u1", *, rv: str = "1", template: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A GPUJob as the hub API serves it, already carrying the hub's finalizer (so a reconcile
    asks nothing of the API)."""
    return {
        "apiVersion": "gpufed.io/v1alpha1",
        "kind": "GPUJob",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": uid,
            "resourceVersion": rv,
            "generation": 1,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "finalizers": ["gpufed.io/member-cleanup"],
        },
        "spec": {"template": template if template is not None else batch_job(8)},
    }


def membercluster_obj(name: str = "m1", *, token_secret: str = "t") -> dict[str, Any]:
    """A MemberCluster whose join token is in Secret ``gpufed-system/<token_secret>``."""
    return {
        "apiVersion": "gpufed.io/v1alpha1",
        "kind": "MemberCluster",
        "metadata": {"name": name, "uid": f"mc-{name}", "resourceVersion": "1"},
        "spec": {"joinTokenRef": {"name": token_secret}},
    }


def hgx_node(name: str, *, gpus: int = 8, requested: int = 0, job_uid: str = "") -> NodeInventory:
    """An idle (or partly requested) 8-GPU H100 HGX node: its own NVLink domain."""
    req = {"nvidia.com/gpu": requested} if requested else {}
    return NodeInventory(
        name=name,
        labels={"kubernetes.io/hostname": name},
        gpu_product="NVIDIA-H100-80GB-HBM3",
        nvlink_domain=f"node:{name}",
        allocatable={"nvidia.com/gpu": gpus, "cpu": 96_000, "memory": 2**40, "pods": 110},
        requested=req,
        job_requests={job_uid: req} if job_uid and req else {},
    )


def rayjob(
    *groups: tuple[str, int, int], head_gpus: int = 0, name: str = "rj", **group_extra: Any
) -> dict[str, Any]:
    """A KubeRay RayJob creating its RayCluster: a head with ``head_gpus`` GPUs and worker
    groups ``(groupName, replicas, gpus per pod)``; ``group_extra`` goes into every group."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name},
        "spec": {
            "entrypoint": "python train.py",
            "rayClusterSpec": {
                "headGroupSpec": {"template": {"spec": pod_spec(head_gpus)}},
                "workerGroupSpecs": [
                    {
                        "groupName": g,
                        "replicas": n,
                        "template": {"spec": pod_spec(gpus)},
                        **group_extra,
                    }
                    for g, n, gpus in groups
                ],
            },
        },
    }


def mpijob(workers: int = 2, gpus: int = 8, *, name: str = "mpi") -> dict[str, Any]:
    """A Kubeflow MPIJob (v2beta1): one CPU launcher and ``workers`` GPU workers."""
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": name},
        "spec": {
            "slotsPerWorker": gpus,
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"spec": pod_spec(0)}},
                "Worker": {"replicas": workers, "template": {"spec": pod_spec(gpus)}},
            },
        },
    }
