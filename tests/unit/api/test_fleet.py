"""Fleet spec validation (gpufed.api.fleet): every error names the field and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufed.api.fleet import FleetError, FleetSpec

REPO = Path(__file__).resolve().parents[3]


def pool(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "h100",
        "nodes": 2,
        "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8},
    }
    base.update(kw)
    return base


def fleet(*pools: dict[str, Any], name: str = "a") -> dict[str, Any]:
    return {"clusters": [{"name": name, "nodePools": list(pools) or [pool()]}]}


def issues(data: Any) -> list[str]:
    with pytest.raises(FleetError) as err:
        FleetSpec.from_dict(data)
    return [str(i) for i in err.value.issues]


def test_example_and_test_fleets_load() -> None:
    example = FleetSpec.load(REPO / "manifests" / "fleets" / "example.yaml")
    assert example.names == ["us-east-hgx", "eu-nvl72", "ap-a100-mig"]
    small = FleetSpec.load(REPO / "tests" / "fleets" / "small.yaml")
    assert small.names == ["alpha", "beta"]
    large = FleetSpec.load(REPO / "manifests" / "fleets" / "large-2000.yaml")
    assert sum(c.node_count for c in large.clusters) == 2000


def test_yaml_round_trip_keeps_camel_case_and_meaning() -> None:
    spec = FleetSpec.load(REPO / "manifests" / "fleets" / "example.yaml")
    text = spec.to_yaml()
    assert "nodePools" in text
    assert "memoryMiB" in text
    assert "nodesPerDomain" in text
    assert FleetSpec.loads(text) == spec


def test_known_product_fills_memory_and_family() -> None:
    spec = FleetSpec.from_dict(fleet(pool(gpu={"product": "NVIDIA-H200", "count": 8})))
    gpu = spec.clusters[0].node_pools[0].gpu
    assert gpu.resolved_memory_mib == 143771
    assert gpu.resolved_family == "hopper"


def test_product_with_spaces_is_rejected_with_the_gfd_spelling() -> None:
    (msg,) = issues(fleet(pool(gpu={"product": "NVIDIA H100 80GB HBM3", "count": 8})))
    assert msg.startswith("clusters[0].nodePools[0].gpu.product:")
    assert "'NVIDIA-H100-80GB-HBM3'" in msg


def test_unknown_product_needs_memory() -> None:
    (msg,) = issues(fleet(pool(gpu={"product": "NVIDIA-X900", "count": 8, "family": "hopper"})))
    assert msg.startswith("clusters[0].nodePools[0].gpu.memoryMiB:")
    assert "NVML total memory in MiB" in msg


def test_unknown_product_family_must_be_derivable_or_given() -> None:
    (msg,) = issues(fleet(pool(gpu={"product": "Mystery-9", "count": 1, "memoryMiB": 1000})))
    assert msg.startswith("clusters[0].nodePools[0].gpu.family:")
    assert "set gpu.family" in msg


def test_gpu_count_below_one() -> None:
    (msg,) = issues(fleet(pool(gpu={"product": "NVIDIA-H100-80GB-HBM3", "count": 0})))
    assert msg.startswith("clusters[0].nodePools[0].gpu.count:")
    assert "count must be >= 1" in msg


def test_nodes_per_domain_must_divide_nodes_and_the_fix_is_named() -> None:
    (msg,) = issues(
        fleet(
            pool(
                name="gb200",
                nodes=30,
                gpu={"product": "NVIDIA-GB200", "count": 4},
                nvlink={"nodesPerDomain": 18},
            )
        )
    )
    assert msg.startswith("clusters[0].nodePools[0].nvlink.nodesPerDomain:")
    assert "nodes: 18 or 36" in msg


def test_nvlink_shorthand_other_than_node_is_rejected() -> None:
    (msg,) = issues(fleet(pool(nvlink="nvl72")))
    assert msg.startswith("clusters[0].nodePools[0].nvlink:")
    assert "nodesPerDomain" in msg


def test_mig_profile_count_above_one_gpu() -> None:
    (msg,) = issues(
        fleet(
            pool(
                gpu={"product": "NVIDIA-A100-SXM4-80GB", "count": 8},
                mig={"strategy": "mixed", "gpus": 2, "profiles": {"1g.10gb": 8}},
            )
        )
    )
    assert msg.startswith("clusters[0].nodePools[0].mig.profiles.1g.10gb:")
    assert "at most 7" in msg


def test_mig_profile_mix_that_exceeds_the_gpu_slices() -> None:
    (msg,) = issues(
        fleet(
            pool(
                gpu={"product": "NVIDIA-A100-SXM4-80GB", "count": 8},
                mig={"strategy": "mixed", "profiles": {"3g.40gb": 2, "2g.20gb": 1}},
            )
        )
    )
    assert msg.startswith("clusters[0].nodePools[0].mig.profiles:")
    assert "8 of 7 compute slices" in msg


def test_balanced_mig_mix_fits() -> None:
    spec = FleetSpec.from_dict(
        fleet(
            pool(
                gpu={"product": "NVIDIA-H100-80GB-HBM3", "count": 8},
                mig={"strategy": "mixed", "profiles": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}},
            )
        )
    )
    assert spec.clusters[0].node_pools[0].partitioned_gpus == 8


def test_mig_profile_of_another_gpu_lists_the_right_ones() -> None:
    (msg,) = issues(
        fleet(
            pool(
                gpu={"product": "NVIDIA-H200", "count": 8},
                mig={"strategy": "mixed", "gpus": 1, "profiles": {"1g.10gb": 7}},
            )
        )
    )
    assert msg.startswith("clusters[0].nodePools[0].mig.profiles:")
    assert "1g.18gb" in msg


def test_mig_on_a_product_without_mig() -> None:
    (msg,) = issues(
        fleet(
            pool(
                gpu={"product": "NVIDIA-L40S", "count": 4},
                mig={"strategy": "mixed", "profiles": {"1g.10gb": 7}},
            )
        )
    )
    assert msg.startswith("clusters[0].nodePools[0].mig:")
    assert "not MIG-capable" in msg


def test_mixed_mig_gpus_cannot_exceed_the_node() -> None:
    (msg,) = issues(
        fleet(
            pool(
                gpu={"product": "NVIDIA-A100-SXM4-80GB", "count": 8},
                mig={"strategy": "mixed", "gpus": 9, "profiles": {"1g.10gb": 7}},
            )
        )
    )
    assert msg.startswith("clusters[0].nodePools[0].mig.gpus:")


def test_single_mig_strategy_takes_exactly_one_profile() -> None:
    (msg,) = issues(
        fleet(
            pool(
                gpu={"product": "NVIDIA-A100-SXM4-80GB", "count": 8},
                mig={"strategy": "single", "profiles": {"1g.10gb": 3, "2g.20gb": 1}},
            )
        )
    )
    assert "exactly one" in msg


def test_duplicate_cluster_names() -> None:
    data = {
        "clusters": [
            {"name": "a", "nodePools": [pool()]},
            {"name": "a", "nodePools": [pool()]},
        ]
    }
    (msg,) = issues(data)
    assert msg.startswith("clusters[1].name:")
    assert "duplicate cluster name 'a'" in msg


def test_duplicate_pool_names_in_one_cluster() -> None:
    (msg,) = issues(fleet(pool(), pool()))
    assert msg.startswith("clusters[0].nodePools[1].name:")


def test_hub_is_a_reserved_cluster_name() -> None:
    (msg,) = issues(fleet(name="hub"))
    assert msg.startswith("clusters[0].name:")
    assert "reserved" in msg


def test_cluster_name_must_be_a_dns_label() -> None:
    (msg,) = issues(fleet(name="US_East"))
    assert msg.startswith("clusters[0].name:")
    assert "lowercase" in msg


def test_unknown_field_is_named() -> None:
    (msg,) = issues(fleet(pool(nodesPerRack=4)))
    assert msg.startswith("clusters[0].nodePools[0].nodesPerRack: unknown field")


def test_pool_labels_cannot_override_gfd_labels() -> None:
    (msg,) = issues(fleet(pool(labels={"nvidia.com/gpu.product": "x"})))
    assert msg.startswith("clusters[0].nodePools[0].labels.nvidia.com/gpu.product:")


def test_several_problems_are_reported_together() -> None:
    msgs = issues(
        {
            "clusters": [
                {
                    "name": "a",
                    "nodePools": [
                        pool(gpu={"product": "NVIDIA-H100-80GB-HBM3", "count": 0}),
                        pool(name="b", nodes=0),
                    ],
                }
            ]
        }
    )
    assert len(msgs) == 2


def test_empty_fleet_and_missing_clusters() -> None:
    assert issues({"clusters": []}) == ["clusters: a fleet needs at least one member cluster"]
    assert issues({}) == ["clusters: required field is missing"]
    assert "expected a mapping" in issues([1, 2])[0]


def test_load_names_the_file_when_missing(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(FleetError) as err:
        FleetSpec.load(missing)
    assert str(missing) in str(err.value)
    assert "cannot read the file" in str(err.value)


def test_load_names_the_file_for_bad_yaml_and_bad_content(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("clusters: [\n")
    with pytest.raises(FleetError, match=r"invalid fleet file .*bad\.yaml:\n  - not valid YAML"):
        FleetSpec.load(bad_yaml)
    bad = tmp_path / "count.yaml"
    bad.write_text(
        "clusters:\n- name: a\n  nodePools:\n  - {name: p, nodes: 1, "
        "gpu: {product: NVIDIA-H200, count: 0}}\n"
    )
    with pytest.raises(
        FleetError, match=r"count\.yaml:\n  - clusters\[0\]\.nodePools\[0\]\.gpu\.count"
    ):
        FleetSpec.load(bad)
