"""GPUs published through DRA in the agent's inventory (gpufed.agent.dra, InventoryState):
ResourceSlices of the newest pool generation, claim allocations, products named as GFD names
them, DRA and device-plugin nodes side by side and nothing counted twice. Checked against a
brute-force count over the raw objects."""

from __future__ import annotations

import itertools
import random
from typing import Any

from gpufed.agent.inventory import InventoryState
from gpufed.api.inventory import summarize
from gpufed.api.protocol.codec import node_from_pb, node_to_pb

from .builders import gpu_pod, hgx_node
from .dra_objects import (
    claim_pod,
    dra_node,
    gpu_claim,
    gpu_device,
    gpu_slice,
    mig_device,
)

GPU = "nvidia.com/gpu"


def reference(
    slices: list[dict[str, Any]], claims: list[dict[str, Any]]
) -> dict[str, tuple[int, int]]:
    """Per node (offered, held), counted the slow way from the raw objects."""
    newest: dict[str, int] = {}
    for s in slices:
        if s["spec"]["driver"] == "gpu.nvidia.com":
            pool = s["spec"]["pool"]
            newest[pool["name"]] = max(newest.get(pool["name"], 0), pool["generation"])
    offered: dict[tuple[str, str], str] = {}
    for s in slices:
        spec = s["spec"]
        if spec["driver"] != "gpu.nvidia.com":
            continue
        if spec["pool"]["generation"] != newest[spec["pool"]["name"]]:
            continue
        for d in spec["devices"]:
            if d["attributes"]["type"]["string"] == "gpu":
                offered[(spec["pool"]["name"], d["name"])] = spec["nodeName"]
    held = set()
    for c in claims:
        for r in c["status"]["allocation"]["devices"]["results"]:
            if r["driver"] == "gpu.nvidia.com" and (r["pool"], r["device"]) in offered:
                held.add((r["pool"], r["device"]))
    out: dict[str, tuple[int, int]] = {}
    for dev, node in offered.items():
        o, h = out.get(node, (0, 0))
        out[node] = (o + 1, h + (dev in held))
    return out


def state_of(nodes: list[dict[str, Any]], *objs: dict[str, Any]) -> InventoryState:
    state = InventoryState()
    for n in nodes:
        state.upsert_node(n)
    for o in objs:
        if o["kind"] == "ResourceSlice":
            state.dra.upsert_slice(o)
        elif o["kind"] == "ResourceClaim":
            state.dra.upsert_claim(o)
        else:
            state.upsert_pod(o)
    return state


def test_dra_node_offers_its_published_gpus_named_like_gfd() -> None:
    state = state_of([dra_node("n1")], gpu_slice("n1", 8, "H100"))
    node = state.node_inventory("n1")
    assert node.allocatable[GPU] == 8
    assert node.requested.get(GPU, 0) == 0
    assert node.gpu_product == "NVIDIA-H100-80GB-HBM3"  # "NVIDIA H100 80GB HBM3" as GFD writes it
    assert node.gpus_via_dra
    (group,) = node.dra_gpus
    assert group.count == 8
    assert group.allocated == 0
    assert group.attributes["productName"] == "NVIDIA H100 80GB HBM3"
    assert group.attributes["type"] == "gpu"
    assert group.versions["driverVersion"] == "580.82.7"
    assert group.capacity["memory"] == 81559 * 2**20
    assert "uuid" not in group.attributes  # per-device identities are not carried


def test_same_product_from_gfd_label_and_dra_is_one_product_in_the_summary() -> None:
    state = state_of([hgx_node("plugin"), dra_node("dra")], gpu_slice("dra", 8, "H100"))
    summary = summarize(state.snapshot())
    assert summary.gpus_total == {"NVIDIA-H100-80GB-HBM3": 16}


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    old = gpu_slice("n1", 8, generation=1)
    new = gpu_slice("n1", 6, generation=2)
    state = state_of([dra_node("n1")], old, new)
    assert state.node_inventory("n1").allocatable[GPU] == 6
    state.dra.delete_slice(new["metadata"]["name"])  # the driver rolled back: gen 1 again
    assert state.node_inventory("n1").allocatable[GPU] == 8


def test_incomplete_newest_generation_degrades_the_node_instead_of_half_counting() -> None:
    part = gpu_slice("n1", 4, generation=2, slice_count=2, name="n1-a")
    state = state_of([dra_node("n1")], gpu_slice("n1", 8, generation=1), part)
    node = state.node_inventory("n1")
    assert node.degraded is not None
    assert "1 of 2 ResourceSlices" in node.degraded
    state.dra.upsert_slice(
        gpu_slice("n1", 4, generation=2, slice_count=2, name="n1-b", first_minor=4)
    )
    node = state.node_inventory("n1")
    assert node.degraded is None
    assert node.allocatable[GPU] == 8


def test_claims_hold_devices_once_and_per_job_through_reserved_pods() -> None:
    shared = gpu_claim("shared", [("n1", "gpu-0"), ("n1", "gpu-1")], pods=["p0", "p1"])
    own = gpu_claim("own", [("n1", "gpu-2")], pods=["p2"])
    state = state_of(
        [dra_node("n1")],
        gpu_slice("n1", 8),
        shared,
        own,
        claim_pod("p0", "n1", job_uid="j1"),
        claim_pod("p1", "n1", job_uid="j1"),
        claim_pod("p2", "n1", job_uid="j2"),
    )
    node = state.node_inventory("n1")
    assert node.requested[GPU] == 3  # a claim shared by two pods holds its GPUs once
    assert node.job_requests["j1"][GPU] == 2
    assert node.job_requests["j2"][GPU] == 1
    assert node.dra_gpus[0].allocated == 3
    state.dra.delete_claim("team-a/shared")
    assert state.node_inventory("n1").requested[GPU] == 1


def test_extended_resource_request_on_a_dra_node_is_not_counted_twice() -> None:
    """With the class's extendedResourceName, a pod's nvidia.com/gpu limit is served by a claim
    the scheduler creates: the claim counts, the pod's limit does not again."""
    pod = gpu_pod("p0", "n1", gpus=2, job_uid="j1")
    claim = gpu_claim("p0-extended", [("n1", "gpu-0"), ("n1", "gpu-1")], pods=["p0"])
    state = state_of([dra_node("n1", gpu_plugin=8)], gpu_slice("n1", 8), pod, claim)
    node = state.node_inventory("n1")
    assert node.allocatable[GPU] == 8
    assert node.requested[GPU] == 2
    assert node.job_requests["j1"][GPU] == 2


def test_mig_devices_other_drivers_and_unknown_pools_are_not_whole_gpus() -> None:
    devices = [gpu_device(0), gpu_device(1), mig_device(2)]
    other = gpu_slice("n1", 2)
    other["spec"]["driver"] = "compute-domain.nvidia.com"
    other["metadata"]["name"] = "n1-cd"
    stray = gpu_claim("stray", [("nowhere", "gpu-0"), ("n1", "gpu-9")])
    state = state_of([dra_node("n1")], gpu_slice("n1", devices=devices), other, stray)
    node = state.node_inventory("n1")
    assert node.allocatable[GPU] == 2
    assert node.requested.get(GPU, 0) == 0


def test_slice_changes_mark_the_node_changed_and_relists_drop_vanished_objects() -> None:
    state = state_of([dra_node("n1"), dra_node("n2")])
    state.take_changes()
    state.dra.begin_slice_relist()
    state.dra.upsert_slice(gpu_slice("n1", 4))
    state.dra.upsert_slice(gpu_slice("n2", 4))
    state.dra.end_slice_relist()
    upserts, _ = state.take_changes()
    assert [n.name for n in upserts] == ["n1", "n2"]
    state.dra.begin_slice_relist()
    state.dra.upsert_slice(gpu_slice("n1", 4))
    state.dra.end_slice_relist()
    upserts, _ = state.take_changes()
    assert [n.name for n in upserts] == ["n2"]
    assert not state.node_inventory("n2").gpus_via_dra


def test_unreadable_device_degrades_only_its_node() -> None:
    bad = gpu_slice("n1", 2)
    bad["spec"]["devices"][1]["attributes"]["productName"] = {"string": "x", "int": 3}
    state = state_of([dra_node("n1"), dra_node("n2")], bad, gpu_slice("n2", 4))
    assert "spec.devices[1].attributes[productName]" in (state.node_inventory("n1").degraded or "")
    assert state.node_inventory("n2").degraded is None


def test_dra_node_survives_the_protocol_round_trip() -> None:
    state = state_of([dra_node("n1", clique="c1.0")], gpu_slice("n1", 4, "GB200"))
    node = state.node_inventory("n1")
    assert node_from_pb(node_to_pb(node)) == node


def test_random_fleets_match_the_brute_force_count() -> None:
    rng = random.Random(27)
    for _ in range(60):
        nodes = [f"n{i}" for i in range(rng.randint(1, 5))]
        slices: list[dict[str, Any]] = []
        for n in nodes:
            for gen in range(1, rng.randint(1, 3) + 1):
                slices.append(gpu_slice(n, rng.randint(1, 8), generation=gen))
        devices = [(n, f"gpu-{m}") for n, m in itertools.product(nodes, range(8))]
        rng.shuffle(devices)
        claims = []
        for c in range(rng.randint(0, 6)):
            take, devices = devices[: rng.randint(1, 3)], devices[3:]
            claims.append(gpu_claim(f"c{c}", take, pods=[f"p{c}"]))
        objs = slices + claims
        rng.shuffle(objs)
        state = state_of([dra_node(n) for n in nodes], *objs)
        want = reference(slices, claims)
        for n in nodes:
            inv = state.node_inventory(n)
            assert (inv.allocatable.get(GPU, 0), inv.requested.get(GPU, 0)) == want.get(n, (0, 0))
