"""ComputeDomain placement rules: one clique, at most 18 nodes, one domain per clique.

The random tests check ``place()`` against a brute-force reference written here from the raw
node inventories (no placement code): which cliques could hold the job at all.
"""

from __future__ import annotations

import random

from placement_builders import GB200, GPU, fleet, gpus_on, job, member, node, nvl72_cluster

from gpufed.api.decision import Outcome
from gpufed.api.inventory import NodeInventory
from gpufed.api.request import PlacementRequest, TopologyRequest
from gpufed.placement import FleetSnapshot, Policy, place

POLICY = Policy()
CD = "ComputeDomain.resource.nvidia.com"
CD_LABEL = "resource.nvidia.com/computeDomain"
SERVES = frozenset({"Job.batch", CD})


def cd_job(
    name: str = "j", *, pods: int = 8, gpus: int = 4, domain: str = "Auto"
) -> PlacementRequest:
    req = job(name, gpus=gpus, pods=pods, nvlink="Required")
    return req.model_copy(
        update={"topology": TopologyRequest(nvlink="Required", compute_domain=domain)}  # type: ignore[arg-type]
    )


def nodes_of(decision: object) -> set[str]:
    return {n for n, g in gpus_on(decision).items() if g}


def clique_of(name: str) -> str:
    return name.rsplit("-t", 1)[0]  # "m-c1-t03" -> "m-c1"


def test_32_gpu_job_gets_one_domain_in_one_clique() -> None:
    s = fleet(nvl72_cluster("m", cliques=2, kinds=SERVES))
    d = place(cd_job(pods=8), s, POLICY, 0)
    assert d.outcome == Outcome.PLACED
    assert d.compute_domain
    used = nodes_of(d)
    assert len(used) == 8
    assert len({clique_of(n) for n in used}) == 1


def test_no_domain_where_the_member_does_not_serve_the_crd_or_the_job_says_never() -> None:
    s = fleet(nvl72_cluster("m", cliques=1))
    assert not place(cd_job(), s, POLICY, 0).compute_domain
    s = fleet(nvl72_cluster("m", cliques=1, kinds=SERVES))
    assert not place(cd_job(domain="Never"), s, POLICY, 0).compute_domain
    # one pod sits on one node: no domain needed
    assert not place(cd_job(pods=1), s, POLICY, 0).compute_domain
    # Preferred asks for no single NVLink domain
    assert not place(job(gpus=4, pods=8, nvlink="Preferred"), s, POLICY, 0).compute_domain


def test_a_clique_with_a_domain_takes_no_second_one() -> None:
    state = nvl72_cluster("m", cliques=2, kinds=SERVES)
    nodes = list(state.inventory.nodes)
    # the driver labelled a node of clique 0 (a running domain job)
    nodes[0] = nodes[0].model_copy(update={"labels": {**nodes[0].labels, CD_LABEL: "uid-x"}})
    s = fleet(member("m", nodes, kinds=SERVES))
    d = place(cd_job("a"), s, POLICY, 0)
    assert d.placed
    assert {clique_of(n) for n in nodes_of(d)} == {"m-c1"}
    # a reservation (placed, not yet labelled) takes clique 1 too: nothing is left
    s.reserve(d, now=0)
    d2 = place(cd_job("b", pods=2), s, POLICY, 1, explain=True)
    assert d2.outcome == Outcome.UNSCHEDULABLE
    assert "2 cliques already hold a ComputeDomain" in d2.rejections[0].reason
    # a job without a domain may still use the free trays of those cliques
    assert place(cd_job("c", pods=2, domain="Never"), s, POLICY, 1).placed
    # once the reservation is released the clique is free again
    s.release(d.uid)
    assert place(cd_job("b", pods=2), s, POLICY, 2).placed


def test_more_than_18_nodes_is_refused() -> None:
    s = fleet(nvl72_cluster("m", cliques=1, trays=24, kinds=SERVES))
    d = place(cd_job(pods=19), s, POLICY, 0, explain=True)
    assert d.outcome == Outcome.REJECTED
    assert "at most 18 nodes" in d.rejections[0].reason
    assert place(cd_job(pods=18), s, POLICY, 0).compute_domain
    assert place(cd_job(pods=19, domain="Never"), s, POLICY, 0).placed


# --- brute-force reference -------------------------------------------------------------------


def reference_cliques(
    nodes: list[NodeInventory], reserved_cliques: set[str], pods: int, gpus: int
) -> set[str]:
    """Cliques that could hold ``pods`` pods of ``gpus`` GPUs under one domain: not labelled,
    not reserved by a domain job, enough whole pod slots on at most 18 nodes."""
    by_clique: dict[str, list[NodeInventory]] = {}
    for n in nodes:
        by_clique.setdefault(n.nvlink_domain, []).append(n)
    out = set()
    for clique, members in by_clique.items():
        if clique in reserved_cliques or any(CD_LABEL in n.labels for n in members):
            continue
        slots = sorted(
            ((n.allocatable[GPU] - n.requested[GPU]) // gpus for n in members), reverse=True
        )
        slots = [k for k in slots if k > 0]
        # fewest nodes: the fullest first
        need, used = pods, 0
        for k in slots:
            if need <= 0:
                break
            need -= k
            used += 1
        if need <= 0 and (pods == 1 or used <= 18):
            out.add(clique)
    return out


def random_member(rng: random.Random, trays_max: int) -> tuple[FleetSnapshot, list[NodeInventory]]:
    nodes = []
    for c in range(rng.randint(1, 4)):
        for t in range(rng.randint(2, trays_max)):
            labels = {CD_LABEL: "x"} if rng.random() < 0.05 else {}
            nodes.append(
                node(
                    f"m-c{c}-t{t:02d}",
                    gpus=4,
                    free=rng.choice([0, 1, 2, 4, 4, 4]),
                    product=GB200,
                    clique=f"fabric.{c}",
                    labels=labels,
                )
            )
    return fleet(member("m", nodes, kinds=SERVES)), nodes


def check_decision(decision: object, s: FleetSnapshot, nodes: list[NodeInventory]) -> None:
    used = nodes_of(decision)
    domains = {n.name: n.nvlink_domain for n in nodes}
    assert len({domains[n] for n in used}) == 1
    assert len(used) <= 18
    assert decision.compute_domain == (len(used) > 1)  # type: ignore[attr-defined]


def test_random_fleets_match_the_reference() -> None:
    rng = random.Random(27)
    for _ in range(300):
        s, nodes = random_member(rng, trays_max=18)
        reserved: set[str] = set()
        # a domain job placed first (reserved, not labelled yet)
        first = cd_job("first", pods=rng.randint(2, 4), gpus=rng.choice([1, 2, 4]))
        d0 = place(first, s, POLICY, 0)
        if d0.placed:
            s.reserve(d0, now=0)
            if d0.compute_domain:
                reserved |= {n.nvlink_domain for n in nodes if n.name in nodes_of(d0)}
        pods, gpus = rng.randint(2, 10), rng.choice([1, 2, 4])
        # what is free now (after the first job's reservation)
        now_nodes = [
            n.model_copy(
                update={"requested": {**n.requested, GPU: n.allocatable[GPU] - s.free("m", n.name)}}
            )
            for n in nodes
        ]
        want = reference_cliques(now_nodes, reserved, pods, gpus)
        d = place(cd_job("second", pods=pods, gpus=gpus), s, POLICY, 1)
        assert d.placed == bool(want), (want, d.message)
        if d.placed:
            check_decision(d, s, nodes)
            used = nodes_of(d)
            assert {n.nvlink_domain for n in nodes if n.name in used} <= want


def test_random_big_cliques_never_break_the_rules() -> None:
    rng = random.Random(72)
    for _ in range(150):
        s, nodes = random_member(rng, trays_max=30)
        d = place(cd_job(pods=rng.randint(2, 30), gpus=rng.choice([2, 4])), s, POLICY, 0)
        if d.placed:
            check_decision(d, s, nodes)


def test_explain_names_the_domain() -> None:
    from gpufed.placement import render_explanation

    s = fleet(nvl72_cluster("m", cliques=1, kinds=SERVES))
    text = render_explanation(place(cd_job("train"), s, POLICY, 0))
    assert "ComputeDomain: train in m" in text
    assert "ComputeDomain" not in render_explanation(place(cd_job("x", pods=1), s, POLICY, 0))
