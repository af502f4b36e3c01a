"""Fleet expansion into nodes (gpufed.api.fleet.node_specs): GFD labels, device-plugin
resources, MIG arithmetic, NVLink cliques, racks and blocks."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gpufed.api.fleet import ClusterSpec, FleetSpec, NodeSpec, node_specs
from gpufed.api.inventory import Taint
from gpufed.api.labels import (
    DEFAULT_BLOCK_LABEL,
    DEFAULT_RACK_LABEL,
    GPU_CLIQUE_LABEL,
    GPU_RESOURCE,
    HOSTNAME_LABEL,
)

REPO = Path(__file__).resolve().parents[3]


def cluster(cluster_name: str = "c", **pool: Any) -> ClusterSpec:
    """A one-pool cluster; ``pool`` holds node-pool fields in YAML spelling."""
    p: dict[str, Any] = {
        "name": "p",
        "nodes": 2,
        "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8},
    }
    p.update(pool)
    return FleetSpec.from_dict({"clusters": [{"name": cluster_name, "nodePools": [p]}]}).clusters[0]


def hgx_cluster(cluster_name: str = "us-east", nodes: int = 4, **kw: Any) -> ClusterSpec:
    return cluster(cluster_name, nodes=nodes, **kw)


def nvl72_cluster(cluster_name: str = "eu", racks: int = 2) -> ClusterSpec:
    return cluster(
        cluster_name,
        name="gb200",
        nodes=18 * racks,
        gpu={"product": "NVIDIA-GB200", "count": 4},
        nvlink={"nodesPerDomain": 18},
    )


def a100_mixed_mig_cluster(gpus: int = 2) -> ClusterSpec:
    return cluster(
        "ap",
        name="a100",
        nodes=3,
        gpu={"product": "NVIDIA-A100-SXM4-80GB", "count": 8},
        mig={"strategy": "mixed", "gpus": gpus, "profiles": {"1g.10gb": 7}},
        taints=[{"key": "dedicated", "value": "inference", "effect": "NoSchedule"}],
    )


def test_hgx_node_carries_gfd_labels_and_gpu_capacity() -> None:
    node = node_specs(hgx_cluster())[0]
    assert node.name == "us-east-p-000"
    assert node.cluster == "us-east"
    assert node.pool == "p"
    assert node.labels[HOSTNAME_LABEL] == node.name
    assert node.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert node.labels["nvidia.com/gpu.count"] == "8"
    assert node.labels["nvidia.com/gpu.memory"] == "81559"
    assert node.labels["nvidia.com/gpu.family"] == "hopper"
    assert node.labels["nvidia.com/mig.strategy"] == "none"
    assert node.labels["kubernetes.io/arch"] == "amd64"
    assert GPU_CLIQUE_LABEL not in node.labels  # single-node NVLink domain
    assert DEFAULT_RACK_LABEL not in node.labels  # no rackSize given
    assert node.capacity == node.allocatable
    assert node.allocatable[GPU_RESOURCE] == "8"
    assert {"cpu", "memory", "pods"} <= node.allocatable.keys()
    assert node.taints == ()


def test_names_are_deterministic_zero_padded_and_ordered() -> None:
    a = node_specs(hgx_cluster(nodes=12))
    b = node_specs(hgx_cluster(nodes=12))
    assert a == b
    assert [n.name for n in a][:2] == ["us-east-p-000", "us-east-p-001"]
    assert a[-1].name == "us-east-p-011"
    assert len(node_specs(hgx_cluster(nodes=1200))[-1].name.rsplit("-", 1)[1]) == 4


def test_mixed_mig_arithmetic_follows_the_device_plugin() -> None:
    nodes = node_specs(a100_mixed_mig_cluster(gpus=2))
    for n in nodes:
        assert n.allocatable[GPU_RESOURCE] == "6"  # 8 GPUs - 2 partitioned
        assert n.allocatable["nvidia.com/mig-1g.10gb"] == "14"  # 7 per GPU x 2 GPUs
        assert n.labels["nvidia.com/mig-1g.10gb.count"] == "14"
        assert n.labels["nvidia.com/mig.strategy"] == "mixed"
        assert n.labels["nvidia.com/gpu.count"] == "8"  # physical GPUs
        assert n.taints == (Taint(key="dedicated", value="inference", effect="NoSchedule"),)


def test_mixed_mig_with_every_gpu_partitioned_offers_no_whole_gpu() -> None:
    node = node_specs(a100_mixed_mig_cluster(gpus=8))[0]
    assert node.allocatable[GPU_RESOURCE] == "0"
    assert node.allocatable["nvidia.com/mig-1g.10gb"] == "56"


def test_single_mig_strategy_publishes_slices_as_gpus() -> None:
    node = node_specs(
        cluster(
            gpu={"product": "NVIDIA-A100-SXM4-80GB", "count": 8},
            mig={"strategy": "single", "profiles": {"3g.40gb": 2}},
        )
    )[0]
    assert node.allocatable[GPU_RESOURCE] == "16"
    assert node.labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"
    assert node.labels["nvidia.com/gpu.count"] == "16"
    assert node.labels["nvidia.com/gpu.memory"] == str(40 * 1024)


def test_cliques_group_nodes_per_nvlink_domain() -> None:
    nodes = node_specs(nvl72_cluster(racks=2))
    cliques = [n.labels[GPU_CLIQUE_LABEL] for n in nodes]
    assert len(set(cliques[:18])) == 1
    assert len(set(cliques[18:])) == 1
    assert cliques[0] != cliques[18]
    uuid_dot_n = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.\d+$")
    assert all(uuid_dot_n.match(c) for c in cliques)
    # Stable across runs and clusters keep distinct fabrics.
    assert cliques == [n.labels[GPU_CLIQUE_LABEL] for n in node_specs(nvl72_cluster(racks=2))]
    assert cliques[0] != node_specs(nvl72_cluster("other"))[0].labels[GPU_CLIQUE_LABEL]


def test_grace_blackwell_trays_are_arm64_blackwell() -> None:
    node = node_specs(nvl72_cluster(racks=1))[0]
    assert node.labels["kubernetes.io/arch"] == "arm64"
    assert node.labels["nvidia.com/gpu.family"] == "blackwell"
    assert node.labels["nvidia.com/gpu.memory"] == "189471"


def test_nvlink_domain_pools_default_to_one_rack_per_domain() -> None:
    nodes = node_specs(nvl72_cluster(racks=2))
    racks = [n.labels[DEFAULT_RACK_LABEL] for n in nodes]
    assert racks[0] == racks[17] == "gb200-rack0"
    assert racks[18] == "gb200-rack1"
    assert {n.labels[DEFAULT_BLOCK_LABEL] for n in nodes} == {"gb200-block0"}


def test_rack_size_and_racks_per_block() -> None:
    nodes = node_specs(hgx_cluster(nodes=10, rackSize=4, racksPerBlock=2))
    assert [n.labels[DEFAULT_RACK_LABEL] for n in nodes] == [
        *["p-rack0"] * 4,
        *["p-rack1"] * 4,
        *["p-rack2"] * 2,
    ]
    assert [n.labels[DEFAULT_BLOCK_LABEL] for n in nodes] == [*["p-block0"] * 8, *["p-block1"] * 2]


def test_pool_overrides_for_host_resources_and_extra_labels() -> None:
    node = node_specs(hgx_cluster(cpu="224", memory="2Ti", pods=64, labels={"team": "ml"}))[0]
    assert node.allocatable["cpu"] == "224"
    assert node.allocatable["memory"] == "2Ti"
    assert node.allocatable["pods"] == "64"
    assert node.labels["team"] == "ml"


def test_example_fleet_totals() -> None:
    spec = FleetSpec.load(REPO / "manifests" / "fleets" / "example.yaml")

    def gpus(nodes: list[NodeSpec], res: str = GPU_RESOURCE) -> int:
        return sum(int(n.allocatable.get(res, "0")) for n in nodes)

    by = {c.name: node_specs(c) for c in spec.clusters}
    # 8 device-plugin HGX nodes, and 2 whose 16 GPUs are published through DRA (not allocatable)
    assert (len(by["us-east-hgx"]), gpus(by["us-east-hgx"])) == (10, 64)
    assert sum(n.dra_gpus for n in by["us-east-hgx"]) == 16
    assert spec.cluster("eu-nvl72").compute_domains
    assert (len(by["eu-nvl72"]), gpus(by["eu-nvl72"])) == (36, 144)
    assert len({n.labels[GPU_CLIQUE_LABEL] for n in by["eu-nvl72"]}) == 2
    assert (len(by["ap-a100-mig"]), gpus(by["ap-a100-mig"])) == (4, 24)
    assert gpus(by["ap-a100-mig"], "nvidia.com/mig-1g.10gb") == 56


def test_quantities_are_canonical_as_the_api_server_prints_them() -> None:
    from gpufed.api.fleet import canonical_quantity

    assert canonical_quantity("1024Gi") == "1Ti"
    assert canonical_quantity("1.5Gi") == "1536Mi"
    assert canonical_quantity("2000m") == "2"
    assert canonical_quantity("0.5") == "500m"
    assert canonical_quantity("1000M") == "1G"
    assert canonical_quantity("128") == "128"
    node = node_specs(hgx_cluster(memory="2048Gi"))[0]
    assert node.allocatable["memory"] == "2Ti"
