"""Builders of DRA objects as NVIDIA's GPU driver and the Kubernetes control plane write them
(``resource.k8s.io/v1``): a node's ResourceSlice of ``gpu.nvidia.com`` with the device names,
attributes and capacity of ``cmd/gpu-kubelet-plugin`` (shared/notes/dra-computedomains.md),
and allocated ResourceClaims as kube-scheduler leaves them."""

from __future__ import annotations

from typing import Any

#: What the driver publishes per product: (productName, architecture, compute capability, MiB)
PRODUCTS = {
    "H100": ("NVIDIA H100 80GB HBM3", "Hopper", "9.0", 81559),
    "GB200": ("NVIDIA GB200", "Blackwell", "10.0", 189471),
}


def dra_node(name: str, *, clique: str | None = None, gpu_plugin: int = 0) -> dict[str, Any]:
    """A Node whose GPUs only the DRA driver publishes: no ``nvidia.com/gpu`` allocatable (unless
    ``gpu_plugin``), no GFD product label; ``clique`` sets ``nvidia.com/gpu.clique``."""
    labels = {"kubernetes.io/hostname": name}
    if clique:
        labels["nvidia.com/gpu.clique"] = clique
    alloc: dict[str, Any] = {"cpu": "144", "memory": "850Gi", "pods": "110"}
    if gpu_plugin:
        alloc["nvidia.com/gpu"] = str(gpu_plugin)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def gpu_device(minor: int, product: str = "H100", *, node: str = "n") -> dict[str, Any]:
    """Device ``gpu-<minor>`` as the driver publishes a full GPU."""
    name, arch, cc, mib = PRODUCTS[product]
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{node}-{minor:04d}"},
            "minor": {"int": minor},
            "index": {"int": minor},
            "productName": {"string": name},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": arch},
            "cudaComputeCapability": {"version": f"{cc}.0"},
            "driverVersion": {"version": "580.82.7"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{minor + 0x18:02x}:00.0"},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{minor // 4:02x}"},
        },
        "capacity": {"memory": {"value": f"{mib}Mi"}},
    }


def mig_device(parent: int, product: str = "H100") -> dict[str, Any]:
    """A MIG device (``type: mig``), not a whole GPU."""
    name, arch, _, _ = PRODUCTS[product]
    return {
        "name": f"gpu-{parent}-mig-1g10gb-19-0",
        "attributes": {
            "type": {"string": "mig"},
            "profile": {"string": "1g.10gb"},
            "productName": {"string": name},
            "architecture": {"string": arch},
        },
        "capacity": {"memory": {"value": "9984Mi"}, "multiprocessors": {"value": "16"}},
    }


def gpu_slice(
    node: str,
    gpus: int = 8,
    product: str = "H100",
    *,
    generation: int = 1,
    slice_count: int = 1,
    name: str | None = None,
    devices: list[dict[str, Any]] | None = None,
    first_minor: int = 0,
) -> dict[str, Any]:
    """The ResourceSlice of ``node``'s pool (named after the node) holding ``gpus`` GPUs."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-gpu.nvidia.com-{generation}"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": slice_count},
            "devices": devices
            if devices is not None
            else [gpu_device(first_minor + i, product, node=node) for i in range(gpus)],
        },
    }


def gpu_claim(
    name: str,
    devices: list[tuple[str, str]],
    *,
    pods: list[str] = (),  # type: ignore[assignment]
    namespace: str = "team-a",
    driver: str = "gpu.nvidia.com",
) -> dict[str, Any]:
    """An allocated ResourceClaim holding ``devices`` ((pool, device) pairs), reserved for
    ``pods`` (names in ``namespace``)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": driver}}]}
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpus", "driver": driver, "pool": pool, "device": dev}
                        for pool, dev in devices
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods],
        },
    }


def claim_pod(name: str, node: str, *, job_uid: str | None = None) -> dict[str, Any]:
    """A bound pod that gets its GPUs through a claim (no ``nvidia.com/gpu`` limit)."""
    labels = {"gpufed.io/job-uid": job_uid} if job_uid else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "labels": labels},
        "spec": {
            "nodeName": node,
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "gpus"}],
            "containers": [
                {"name": "main", "image": "t:1", "resources": {"claims": [{"name": "gpus"}]}}
            ],
        },
        "status": {"phase": "Running"},
    }
