"""The agent's inventory bookkeeping (gpufed.agent.inventory): requested, readiness, taints,
topology, degradation, re-lists and change tracking, over raw Node/Pod objects."""

from __future__ import annotations

from gpufed.agent.inventory import InventoryState
from gpufed.api.inventory import TopologyLabels, summarize

from .builders import gpu_pod, hgx_node, nvl72_tray


def state_with(*nodes: dict[str, object], **kw: object) -> InventoryState:
    state = InventoryState(**kw)  # type: ignore[arg-type]
    for n in nodes:
        state.upsert_node(n)
    state.take_changes()
    return state


def test_requested_sums_unfinished_bound_pods_with_limits_only() -> None:
    state = state_with(hgx_node("n1"))
    state.upsert_pod(gpu_pod("a", "n1", gpus=2, cpu="500m"))
    state.upsert_pod(gpu_pod("b", "n1", gpus=3, phase="Pending"))
    state.upsert_pod(gpu_pod("unbound", None, gpus=8, phase="Pending"))
    node = state.node_inventory("n1")
    assert node.requested == {"nvidia.com/gpu": 5, "cpu": 500, "pods": 2}
    assert node.free("nvidia.com/gpu") == 3


def test_finished_pods_release_and_terminating_pods_still_hold() -> None:
    state = state_with(hgx_node("n1"))
    state.upsert_pod(gpu_pod("done", "n1", gpus=4))
    state.upsert_pod(gpu_pod("leaving", "n1", gpus=2))
    state.upsert_pod(gpu_pod("done", "n1", gpus=4, phase="Succeeded"))
    state.upsert_pod(gpu_pod("leaving", "n1", gpus=2, terminating=True))
    assert state.node_inventory("n1").requested["nvidia.com/gpu"] == 2
    state.upsert_pod(gpu_pod("failed", "n1", gpus=1, phase="Failed"))
    state.delete_pod("team-a/leaving")
    assert state.node_inventory("n1").requested == {}


def test_job_requests_split_requested_by_job_uid_label() -> None:
    state = state_with(hgx_node("n1"))
    state.upsert_pod(gpu_pod("j1-0", "n1", gpus=4, job_uid="uid-1"))
    state.upsert_pod(gpu_pod("j1-1", "n1", gpus=2, job_uid="uid-1"))
    state.upsert_pod(gpu_pod("other", "n1", gpus=1))
    node = state.node_inventory("n1")
    assert node.job_requests == {"uid-1": {"nvidia.com/gpu": 6, "pods": 2}}
    assert node.requested["nvidia.com/gpu"] == 7
    state.delete_pod("team-a/j1-0")
    state.delete_pod("team-a/j1-1")
    assert state.node_inventory("n1").job_requests == {}


def test_cordon_taint_and_not_ready_are_reported_and_leave_summary() -> None:
    state = state_with(
        hgx_node("cordoned", unschedulable=True),
        hgx_node("tainted", taints=[{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]),
        hgx_node("down", ready=False),
        hgx_node("ok"),
    )
    nodes = state.snapshot()
    by = {n.name: n for n in nodes}
    assert by["cordoned"].unschedulable
    assert by["tainted"].taints[0].effect == "NoSchedule"
    assert not by["down"].ready
    # Summary for people: Ready + schedulable, taints ignored.
    assert summarize(nodes).gpus_total == {"NVIDIA-H100-80GB-HBM3": 16}


def test_gpu_lost_from_allocatable_keeps_free_at_zero() -> None:
    state = state_with(hgx_node("n1"))
    state.upsert_pod(gpu_pod("big", "n1", gpus=8))
    state.upsert_node(hgx_node("n1", gpus=7))
    node = state.node_inventory("n1")
    assert node.allocatable["nvidia.com/gpu"] == 7
    assert node.free("nvidia.com/gpu") == 0


def test_nvlink_domain_is_the_clique_or_the_node_and_topology_labels_are_configurable() -> None:
    topo = TopologyLabels(rack="example.com/rack", block="example.com/block")
    state = state_with(
        nvl72_tray("t1", "abc.1", labels={"example.com/rack": "r7", "example.com/block": "b2"}),
        hgx_node("h1", labels={"cloud.provider.com/topology-rack": "ignored"}),
        topology=topo,
    )
    t1, h1 = state.node_inventory("t1"), state.node_inventory("h1")
    assert (t1.nvlink_domain, t1.rack, t1.block) == ("clique:abc.1", "r7", "b2")
    assert (h1.nvlink_domain, h1.rack) == ("node:h1", None)


def test_mig_resources_are_separate_resources_and_strategy_is_read() -> None:
    node = hgx_node(
        "a100",
        labels={"nvidia.com/mig.strategy": "mixed"},
        allocatable={"nvidia.com/gpu": "6", "nvidia.com/mig-1g.10gb": "14", "cpu": "64"},
    )
    inv = state_with(node).node_inventory("a100")
    assert inv.mig_strategy == "mixed"
    assert inv.allocatable["nvidia.com/mig-1g.10gb"] == 14
    assert inv.whole_gpus_allocatable == 6


def test_bad_nodes_degrade_only_themselves_with_the_reason() -> None:
    logged: list[tuple[str, str]] = []
    state = state_with(
        hgx_node("half-gpu", gpus="1.5"),
        hgx_node("no-alloc", allocatable={}),
        hgx_node("odd-taint", taints=[{"key": "k", "effect": "Sometimes"}]),
        hgx_node("odd-mig", labels={"nvidia.com/mig.strategy": "weird"}),
        hgx_node("odd-product", product="Some GPU?"),
        hgx_node("good"),
        log_degraded=lambda n, r: logged.append((n, r)),
    )
    by = {n.name: n for n in state.snapshot()}
    assert "status.allocatable[nvidia.com/gpu]" in (by["half-gpu"].degraded or "")
    assert "fractional" in (by["half-gpu"].degraded or "")
    assert by["half-gpu"].allocatable["cpu"] == 220_000  # what parsed is kept
    assert "status.allocatable: missing" in (by["no-alloc"].degraded or "")
    assert "spec.taints[0].effect" in (by["odd-taint"].degraded or "")
    assert "nvidia.com/mig.strategy" in (by["odd-mig"].degraded or "")
    assert by["odd-mig"].mig_strategy == "none"
    # An unknown product string is reported verbatim (placement matches it exactly).
    assert by["odd-product"].gpu_product == "Some GPU?"
    assert by["odd-product"].degraded is None
    assert by["good"].degraded is None
    assert by["good"].offers_capacity
    assert {n for n, _ in logged} == {"half-gpu", "no-alloc", "odd-taint", "odd-mig"}
    # Degraded nodes offer nothing to the summary; the good one is still counted.
    assert summarize(by.values()).gpus_total == {
        "NVIDIA-H100-80GB-HBM3": 8,
        "Some GPU?": 8,
    }


def test_pod_with_bad_quantity_degrades_its_node_until_it_goes() -> None:
    state = state_with(hgx_node("n1"), hgx_node("n2"))
    state.upsert_pod(gpu_pod("odd", "n1", gpus="1.5"))
    state.upsert_pod(gpu_pod("fine", "n2", gpus=2))
    assert "pod team-a/odd" in (state.node_inventory("n1").degraded or "")
    assert state.node_inventory("n2").degraded is None
    assert state.node_inventory("n2").requested["nvidia.com/gpu"] == 2
    state.delete_pod("team-a/odd")
    assert state.node_inventory("n1").degraded is None


def test_changes_are_tracked_per_node_and_unchanged_updates_are_ignored() -> None:
    woke: list[int] = []
    state = InventoryState(on_change=lambda: woke.append(1))
    state.upsert_node(hgx_node("n1"))
    state.upsert_node(hgx_node("n2"))
    assert [n.name for n in state.snapshot()] == ["n1", "n2"]
    assert not state.has_changes()
    state.upsert_node(hgx_node("n1"))  # a heartbeat: nothing placement sees changed
    state.upsert_pod(gpu_pod("p", "n2", gpus=1, phase="Pending"))
    state.upsert_pod(gpu_pod("p", "n2", gpus=1, phase="Running"))  # same request: no change
    upserts, removed = state.take_changes()
    assert [n.name for n in upserts] == ["n2"]
    assert removed == []
    state.delete_node("n1")
    upserts, removed = state.take_changes()
    assert (upserts, removed) == ([], ["n1"])
    assert woke


def test_pod_on_unknown_node_counts_once_the_node_appears() -> None:
    state = InventoryState()
    state.upsert_pod(gpu_pod("early", "late-node", gpus=3))
    assert state.take_changes() == ([], [])
    state.upsert_node(hgx_node("late-node"))
    assert state.node_inventory("late-node").requested["nvidia.com/gpu"] == 3


def test_relist_drops_what_vanished_while_the_watch_was_broken() -> None:
    state = state_with(hgx_node("n1"), hgx_node("n2"))
    state.upsert_pod(gpu_pod("p1", "n1", gpus=2))
    state.upsert_pod(gpu_pod("p2", "n2", gpus=2))
    state.begin_node_relist()
    state.upsert_node(hgx_node("n1"))
    state.end_node_relist()
    state.begin_pod_relist()
    state.upsert_pod(gpu_pod("p2", "n2", gpus=2))
    state.end_pod_relist()
    assert state.node_names() == ["n1"]
    assert state.node_inventory("n1").requested == {}
    assert state.pod_count == 1


def test_node_conditions_the_hub_names_degrade_a_node_while_true() -> None:
    """A GPU health checker's condition (named by the hub's --degraded-node-condition, sent in
    Welcome) makes the node degraded as soon as it is True, naming it; False or unnamed: not."""
    from gpufed.agent.inventory import InventoryState

    def node(status: str) -> dict[str, object]:
        return {
            "metadata": {"name": "n1"},
            "status": {
                "allocatable": {"nvidia.com/gpu": "8", "cpu": "8"},
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "GpuUnhealthy", "status": status, "reason": "XidError79"},
                ],
            },
        }

    state = InventoryState()
    state.upsert_node(node("True"))
    assert state.node_inventory("n1").degraded is None  # not named: not ours to judge
    state.set_degraded_conditions(["GpuUnhealthy"])
    assert state.take_changes()[0][0].degraded == "condition GpuUnhealthy=True (XidError79)"
    state.upsert_node(node("False"))
    assert state.node_inventory("n1").degraded is None


def test_node_health_says_since_when_a_node_is_not_ready() -> None:
    """The Ready condition's lastTransitionTime times the grace period of the jobs on it."""
    down = hgx_node("down", ready=False)
    down["status"]["conditions"] = [
        {"type": "Ready", "status": "Unknown", "lastTransitionTime": "2027-01-15T08:00:00Z"}
    ]
    odd = hgx_node("odd", ready=False)
    odd["status"]["conditions"] = [{"type": "Ready", "status": "False", "lastTransitionTime": "x"}]
    state = state_with(down, odd, hgx_node("up"))
    health = state.node_health("down")
    assert health is not None
    assert health.not_ready_since == 1_800_000_000.0
    odd_health, up = state.node_health("odd"), state.node_health("up")
    assert odd_health is not None
    assert odd_health.not_ready_since is None  # unreadable: the agent counts from first sight
    assert up is not None
    assert (up.ready, up.not_ready_since) == (True, None)


def test_a_hostname_is_found_on_the_node_carrying_it_or_on_a_node_of_that_name_without_one() -> (
    None
):
    """A several-node pod set is pinned by ``kubernetes.io/hostname``; a failed copy whose pods
    are gone is judged by whether a node still carries each hostname (rule 4a)."""
    renamed = hgx_node("ip-10-0-0-1", labels={"kubernetes.io/hostname": "gpu-a"})
    bare = hgx_node("gpu-b")
    bare["metadata"]["labels"].pop("kubernetes.io/hostname", None)
    state = state_with(renamed, bare)
    assert state.node_of_hostname("gpu-a") == "ip-10-0-0-1"
    assert state.node_of_hostname("gpu-b") == "gpu-b"  # no label: its name
    assert state.node_of_hostname("ip-10-0-0-1") is None  # its hostname is another value
    assert state.node_of_hostname("gpu-c") is None
