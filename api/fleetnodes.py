"""Expansion of a fleet's member cluster into its nodes: :func:`node_specs`, pure and deterministic.

The sandbox creates a kwok node from each :class:`NodeSpec` and the placement simulator places
on the same list, so what the simulator places on is exactly what the sandbox creates. Labels and
capacities are those NVIDIA GPU Feature Discovery and the device plugin publish. Split out of
:mod:`gpufed.api.fleet`, which re-exports :class:`NodeSpec`, :func:`node_specs` and
:func:`clique_id`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from gpufed.api.gpus import compute_capability_of_family, mig_profile_memory_mib
from gpufed.api.inventory import DeviceGroup, Taint
from gpufed.api.labels import (
    DEFAULT_BLOCK_LABEL,
    DEFAULT_RACK_LABEL,
    GPU_CLIQUE_LABEL,
    GPU_COUNT_LABEL,
    GPU_FAMILY_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    HOSTNAME_LABEL,
    MIG_RESOURCE_PREFIX,
    MIG_STRATEGY_LABEL,
    NODE_POOL_LABEL,
)
from gpufed.api.resources import canonical_quantity

if TYPE_CHECKING:
    from gpufed.api.fleet import ClusterSpec, NodePoolSpec


class NodeSpec(BaseModel):
    """One simulated node, as the sandbox creates it and the simulator places on it.

    ``labels``: GFD/device-plugin labels (``nvidia.com/gpu.*``, ``nvidia.com/mig*``),
    ``kubernetes.io/hostname``/``os``/``arch``, rack/block labels (:data:`DEFAULT_RACK_LABEL`,
    :data:`DEFAULT_BLOCK_LABEL`), ``nvidia.com/gpu.clique`` for multi-node NVLink domains, the
    pool's extra labels and :data:`NODE_POOL_LABEL`. ``taints``: ``spec.taints``.
    ``capacity``/``allocatable``: Kubernetes quantity strings as on ``Node.status``.
    ``dra_gpus``: whole GPUs the node publishes through DRA (a ``dra: true`` pool; they are then
    not in ``capacity``/``allocatable``), 0 otherwise; :func:`dra_group` says what kind.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    cluster: str
    pool: str
    labels: dict[str, str]
    taints: tuple[Taint, ...] = ()
    capacity: dict[str, str]
    allocatable: dict[str, str]
    dra_gpus: int = 0


def _node_name(cluster: str, pool: str, index: int, pool_size: int) -> str:
    width = max(3, len(str(pool_size - 1)))
    return f"{cluster}-{pool}-{index:0{width}d}"


def clique_id(cluster: str, pool: str, domain: int) -> str:
    """``nvidia.com/gpu.clique`` value of NVLink domain ``domain`` (0-based) of a pool:
    ``<ClusterUUID>.<CliqueID>`` as GFD publishes it, with a UUID that is stable per pool."""
    fabric = uuid.uuid5(uuid.NAMESPACE_URL, f"gpufed.io/fleet/{cluster}/{pool}")
    return f"{fabric}.{domain}"


def _pool_nodes(cluster: ClusterSpec, pool: NodePoolSpec) -> Iterator[NodeSpec]:
    gpu = pool.gpu
    model = gpu.known
    family = gpu.resolved_family or "undefined"
    major, minor = model.compute_capability if model else compute_capability_of_family(family)
    arch = model.cpu_arch if model else "amd64"
    # Canonical forms, so capacity/allocatable equal what the API server prints back.
    cpu = canonical_quantity(pool.cpu or str(16 * gpu.count))
    memory = canonical_quantity(pool.memory or f"{256 * gpu.count}Gi")

    base: dict[str, str] = dict(pool.labels)
    base.update(
        {
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": arch,
            "type": "kwok",
            NODE_POOL_LABEL: pool.name,
            "nvidia.com/gpu.present": "true",
            GPU_FAMILY_LABEL: family,
            "nvidia.com/gpu.compute.major": str(major),
            "nvidia.com/gpu.compute.minor": str(minor),
            "nvidia.com/mig.capable": "true" if model and model.mig_profiles else "false",
            MIG_STRATEGY_LABEL: pool.mig.strategy if pool.mig else "none",
        }
    )
    resources: dict[str, str] = {"cpu": cpu, "memory": memory, "pods": str(pool.pods)}
    mig = pool.mig
    if mig is None:
        base.update(
            {
                GPU_PRODUCT_LABEL: gpu.product,
                GPU_COUNT_LABEL: str(gpu.count),
                GPU_MEMORY_LABEL: str(gpu.resolved_memory_mib),
            }
        )
        if not pool.dra:
            resources[GPU_RESOURCE] = str(gpu.count)
    elif mig.strategy == "single":
        # GFD single strategy: the MIG devices are published as nvidia.com/gpu and the product
        # label names the profile, e.g. NVIDIA-A100-SXM4-80GB-MIG-1g.10gb.
        (profile, per_gpu), *_ = mig.profiles.items()
        devices = per_gpu * gpu.count
        base.update(
            {
                GPU_PRODUCT_LABEL: f"{gpu.product}-MIG-{profile}",
                GPU_COUNT_LABEL: str(devices),
                GPU_MEMORY_LABEL: str(mig_profile_memory_mib(profile)),
            }
        )
        resources[GPU_RESOURCE] = str(devices)
    else:
        partitioned = pool.partitioned_gpus
        base.update(
            {
                GPU_PRODUCT_LABEL: gpu.product,
                GPU_COUNT_LABEL: str(gpu.count),
                GPU_MEMORY_LABEL: str(gpu.resolved_memory_mib),
            }
        )
        resources[GPU_RESOURCE] = str(gpu.count - partitioned)
        for profile, per_gpu in mig.profiles.items():
            base[f"{MIG_RESOURCE_PREFIX}{profile}.count"] = str(per_gpu * partitioned)
            resources[f"{MIG_RESOURCE_PREFIX}{profile}"] = str(per_gpu * partitioned)

    rack_size = pool.effective_rack_size
    for i in range(pool.nodes):
        name = _node_name(cluster.name, pool.name, i, pool.nodes)
        labels = dict(base)
        labels[HOSTNAME_LABEL] = name
        if pool.nvlink is not None:
            labels[GPU_CLIQUE_LABEL] = clique_id(
                cluster.name, pool.name, i // pool.nvlink.nodes_per_domain
            )
        if rack_size is not None:
            rack = i // rack_size
            block = rack // pool.racks_per_block if pool.racks_per_block else 0
            labels[DEFAULT_RACK_LABEL] = f"{pool.name}-rack{rack}"
            labels[DEFAULT_BLOCK_LABEL] = f"{pool.name}-block{block}"
        yield NodeSpec(
            name=name,
            cluster=cluster.name,
            pool=pool.name,
            labels=labels,
            taints=pool.taints,
            capacity=dict(resources),
            allocatable=dict(resources),
            dra_gpus=gpu.count if pool.dra else 0,
        )


def dra_product_name(product: str) -> str:
    """The NVML name the simulated DRA driver publishes as ``productName`` for a GFD product
    label: dashes back to spaces (``NVIDIA-H100-80GB-HBM3`` -> ``NVIDIA H100 80GB HBM3``), which
    :func:`gpufed.api.gpus.gfd_product_name` turns back into the label."""
    return product.replace("-", " ")


def dra_group(spec: NodeSpec) -> DeviceGroup | None:
    """The kind of the node's DRA GPUs, idle, as the agent reports what the sandbox's simulated
    driver publishes for it (the simulator places on this); None without DRA GPUs."""
    if not spec.dra_gpus:
        return None
    family = spec.labels.get(GPU_FAMILY_LABEL, "undefined")
    return DeviceGroup(
        count=spec.dra_gpus,
        attributes={
            "type": "gpu",
            "productName": dra_product_name(spec.labels[GPU_PRODUCT_LABEL]),
            "brand": "Nvidia",
            "architecture": family.capitalize(),
        },
        versions={
            "cudaComputeCapability": f"{spec.labels['nvidia.com/gpu.compute.major']}."
            f"{spec.labels['nvidia.com/gpu.compute.minor']}.0",
            "driverVersion": SIMULATED_DRIVER_VERSION,
            "cudaDriverVersion": SIMULATED_CUDA_VERSION,
        },
        capacity={"memory": int(spec.labels[GPU_MEMORY_LABEL]) * 2**20},
    )


#: Versions the simulated DRA driver publishes (a 580 driver, CUDA 13).
SIMULATED_DRIVER_VERSION = "580.82.7"
SIMULATED_CUDA_VERSION = "13.0.0"


def node_specs(cluster: ClusterSpec) -> list[NodeSpec]:
    """Expand a member cluster into its nodes: pools in file order, nodes numbered from 0.

    Node ``i`` of pool ``p`` in cluster ``c`` is named ``c-p-<i>`` (zero-padded to 3 digits or
    more). Pure and deterministic: the same spec always yields the same nodes, labels and
    clique ids. Resources follow the device plugin: without MIG ``nvidia.com/gpu`` = count; with
    mixed MIG ``nvidia.com/gpu`` = count - partitioned GPUs and ``nvidia.com/mig-<profile>`` =
    instances per GPU x partitioned GPUs; with single MIG ``nvidia.com/gpu`` = instances x count.
    """
    return [node for pool in cluster.node_pools for node in _pool_nodes(cluster, pool)]
