"""Inventory semantics of docs/design.md §3 (gpufed.api.inventory)."""

from __future__ import annotations

from gpufed.api.inventory import NodeInventory, Taint, Toleration, summarize, tolerates_all


def hgx_node(name: str, *, requested: int = 0, **kw: object) -> NodeInventory:
    return NodeInventory.model_validate(
        {
            "name": name,
            "gpu_product": "NVIDIA-H100-80GB-HBM3",
            "nvlink_domain": f"node:{name}",
            "allocatable": {"nvidia.com/gpu": 8},
            "requested": {"nvidia.com/gpu": requested},
            **kw,
        }
    )


def test_unhealthy_gpu_leaves_free_at_zero_never_negative() -> None:
    node = hgx_node("n1", requested=8).model_copy(update={"allocatable": {"nvidia.com/gpu": 6}})
    assert node.free("nvidia.com/gpu") == 0


def test_summary_counts_ready_schedulable_whole_gpus_and_ignores_taints() -> None:
    nodes = [
        hgx_node("a", requested=3),
        hgx_node("b", taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]),
        hgx_node("c", ready=False),
        hgx_node("d", unschedulable=True),
        hgx_node("e", mig_strategy="single"),
    ]
    s = summarize(nodes)
    assert s.gpus_total == {"NVIDIA-H100-80GB-HBM3": 16}
    assert s.gpus_free == {"NVIDIA-H100-80GB-HBM3": 13}
    assert s.largest_free_nvlink_block == 8


def test_prefer_no_schedule_never_blocks_and_exists_tolerates_any_value() -> None:
    taints = [
        Taint(key="dedicated", value="inference", effect="NoSchedule"),
        Taint(key="soft", effect="PreferNoSchedule"),
    ]
    assert not tolerates_all([], taints)
    assert tolerates_all([Toleration(key="dedicated", operator="Exists")], taints)
    assert not tolerates_all([Toleration(key="dedicated", value="training")], taints)
