"""Placement with GPUs claimed through DRA: DRA nodes and extended-resource nodes never serve
each other's pods, claim selectors (CEL) choose the pools, and the selector subset gpufed
evaluates agrees with hand-written predicates (a second implementation) on random devices."""

from __future__ import annotations

import random

from placement_builders import GB200, H100, job, member, node

from gpufed.api.decision import Outcome
from gpufed.api.inventory import DeviceGroup, NodeInventory
from gpufed.api.request import PlacementRequest
from gpufed.placement import FleetSnapshot, Policy, place
from gpufed.placement.devicecel import check_selector, group_json, matches

POLICY = Policy()
GIB = 2**30
ATTR = "device.attributes['gpu.nvidia.com']"
MEM = "device.capacity['gpu.nvidia.com'].memory"
NAMES = {
    H100: ("NVIDIA H100 80GB HBM3", "Hopper", 81559),
    GB200: ("NVIDIA GB200", "Blackwell", 189471),
}


def dra_group(product: str, gpus: int, used: int = 0) -> DeviceGroup:
    name, arch, mib = NAMES[product]
    return DeviceGroup(
        count=gpus,
        allocated=used,
        attributes={"type": "gpu", "productName": name, "architecture": arch, "brand": "Nvidia"},
        versions={"driverVersion": "580.82.7"},
        capacity={"memory": mib * 2**20},
    )


def dra_node(name: str, product: str = H100, gpus: int = 8, **kw: object) -> NodeInventory:
    """A node whose GPUs the DRA driver publishes, as the agent reports it."""
    n = node(name, gpus=gpus, product=product, **kw)  # type: ignore[arg-type]
    return n.model_copy(update={"dra_gpus": (dra_group(product, gpus),)})


def claiming(request: PlacementRequest, *selectors: str) -> PlacementRequest:
    ps = request.pod_sets[0].model_copy(update={"claim_selectors": tuple(sorted(selectors))})
    return request.model_copy(update={"pod_sets": (ps,)})


def fleet() -> FleetSnapshot:
    return FleetSnapshot(
        [
            member("plugin", [node(f"p{i}") for i in range(2)]),
            member("dra", [dra_node(f"d{i}") for i in range(2)]),
            member(
                "nvl",
                [dra_node(f"t{i}", GB200, 4, clique="nvl-fabric.0") for i in range(4)],
            ),
        ]
    )


def test_claiming_pods_go_to_dra_nodes_and_extended_pods_to_the_device_plugins() -> None:
    s = fleet()
    plain = place(job("plain", gpus=8, products=[H100]), s, POLICY, 0)
    assert plain.cluster == "plugin"
    claim = place(claiming(job("claim", gpus=8, products=[H100])), s, POLICY, 0)
    assert claim.cluster == "dra"
    only_dra = FleetSnapshot([s.member("dra")])
    d = place(job("plain", gpus=8, products=[H100]), only_dra, POLICY, 0)
    assert d.outcome == Outcome.REJECTED
    (why,) = d.rejections
    assert why.plugin == "DeviceSelectors"
    assert "publish their GPUs through DRA" in why.reason


def test_claim_selectors_choose_the_member_whose_gpus_they_accept() -> None:
    s = fleet()
    big = f"{MEM}.compareTo(quantity('100Gi')) > 0"
    d = place(claiming(job("big", gpus=4), big), s, POLICY, 0)
    assert d.cluster == "nvl"
    d = place(claiming(job("big", gpus=4), big), FleetSnapshot([s.member("dra")]), POLICY, 0)
    (why,) = d.rejections
    assert why.plugin == "DeviceSelectors"
    assert "rejects the NVIDIA-H100-80GB-HBM3 GPUs" in why.reason
    none = f"{ATTR}.architecture == 'Rubin'"
    d = place(claiming(job("rubin", gpus=4), none), s, POLICY, 0)
    assert d.outcome == Outcome.REJECTED


def test_a_dra_node_and_a_plugin_node_of_one_product_are_separate_pools() -> None:
    s = FleetSnapshot([member("mixed", [node("p0", free=0), dra_node("d0")])])
    d = place(job("plain", gpus=8), s, POLICY, 0)
    assert d.outcome == Outcome.UNSCHEDULABLE  # the free DRA node cannot take a plain pod
    assert place(claiming(job("claim", gpus=8)), s, POLICY, 0).cluster == "mixed"


# --- the CEL subset against a second implementation --------------------------------------------

SELECTORS = {
    f"{ATTR}.productName == 'NVIDIA H100 80GB HBM3'": lambda a, m: (
        a["productName"] == "NVIDIA H100 80GB HBM3"
    ),
    f"{ATTR}.productName != 'NVIDIA GB200'": lambda a, m: a["productName"] != "NVIDIA GB200",
    f"{ATTR}.architecture in ['Hopper', 'Blackwell']": lambda a, m: (
        a["architecture"] in ("Hopper", "Blackwell")
    ),
    f"{ATTR}.productName.startsWith('NVIDIA H')": lambda a, m: a["productName"].startswith(
        "NVIDIA H"
    ),
    f"{ATTR}.productName.endsWith('HBM3')": lambda a, m: a["productName"].endswith("HBM3"),
    f"{ATTR}.productName.contains('200')": lambda a, m: "200" in a["productName"],
    f"{MEM}.compareTo(quantity('80Gi')) >= 0": lambda a, m: m >= 80 * GIB,
    f"{MEM}.compareTo(quantity('141Gi')) < 0 && {ATTR}.type == 'gpu'": lambda a, m: m < 141 * GIB,
    f"!({ATTR}.brand == 'Nvidia') || {MEM}.compareTo(quantity('96G')) == 1": lambda a, m: (
        a["brand"] != "Nvidia" or m > 96 * 10**9
    ),
    f"device.driver == 'gpu.nvidia.com' && {ATTR}.architecture != 'Hopper'": lambda a, m: (
        a["architecture"] != "Hopper"
    ),
}


def test_the_selector_subset_agrees_with_hand_written_predicates() -> None:
    rng = random.Random(27)
    products = ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA GB200", "NVIDIA A100-SXM4-40GB"]
    for _ in range(120):
        attrs = {
            "type": "gpu",
            "productName": rng.choice(products),
            "architecture": rng.choice(["Hopper", "Blackwell", "Ampere"]),
            "brand": rng.choice(["Nvidia", "Tesla"]),
        }
        mem = rng.choice([40, 80, 96, 141, 186]) * GIB + rng.choice([-1, 0, 1]) * 2**20
        group = group_json(DeviceGroup(count=1, attributes=attrs, capacity={"memory": mem}))
        for expr, want in SELECTORS.items():
            assert check_selector(expr) is None, expr
            assert matches((expr,), group) == want(attrs, mem), (expr, attrs, mem)


def test_a_device_lacking_an_attribute_does_not_match() -> None:
    group = group_json(DeviceGroup(count=1, attributes={"type": "gpu"}))
    assert not matches((f"{ATTR}.productName == 'x'",), group)
    assert not matches((f"{ATTR}.productName != 'x'",), group)


def test_synthetic_mix_places_claiming_pods_on_dra_nodes_only() -> None:
    """Over the benchmark's DRA mix (`gpufed bench placement --dra`), every placed pod set
    lands on nodes whose GPUs are claimed the way it asks for them (checked from the nodes'
    reported dra_gpus, not from the pools)."""
    from gpufed.placement.sim.synthetic import synthetic_fleet, synthetic_jobs

    members, shape = synthetic_fleet(4, 40, seed=3, dra=True)
    dra_nodes = {n.name for m in members for n in m.inventory.nodes if n.dra_gpus}
    assert dra_nodes
    s = FleetSnapshot(members)
    placed = {"dra": 0, "plain": 0}
    for i, req in enumerate(synthetic_jobs(150, 3, shape.products, dra=True)):
        d = place(req, s, POLICY, float(i))
        if d.outcome != Outcome.PLACED:
            continue
        claims = req.pod_sets[0].claim_selectors is not None
        nodes = set(d.node_requests())
        assert nodes <= dra_nodes if claims else not nodes & dra_nodes, (req.job, nodes)
        placed["dra" if claims else "plain"] += 1
        s.reserve(d, float(i), 3600.0)
    assert placed["dra"] > 10
    assert placed["plain"] > 10
