"""TopologyCost and the clique tier: what a placement destroys, and NVL72 cliques kept for the
jobs that need them (issue 29 item 2).

The property test compares ``place()`` with a brute-force reference that scores every node a
one-pod job could go to from the raw free-GPU lists (its own formulas for every scorer, not the
scorers' code) and keeps the best of the lowest tier.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from placement_builders import GB200, GPU, gpus_on, hgx_cluster, job, member, node, nvl72_cluster

from gpufed.api.inventory import MemberClusterState
from gpufed.placement import FleetSnapshot, Policy, place
from gpufed.placement.policy import ScoreWeights

POLICY = Policy()
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_a_one_gpu_job_takes_an_idle_hgx_node_before_a_free_clique_tray() -> None:
    # the tray in a nearly full clique scores the better NVLink fit (1/4 against 1/8): without
    # the tier the small job would take the last free tray of the clique
    s = FleetSnapshot(
        [hgx_cluster("a-hgx", free=[8, 0]), nvl72_cluster("b-nvl", free=[[4] + [0] * 17])]
    )
    d = place(job(gpus=1, requests={GPU: 1}), s, POLICY, 0)
    assert d.cluster == "a-hgx"
    assert "NVL72" not in d.message
    before = Policy().without_topology_cost()
    assert place(job(gpus=1, requests={GPU: 1}), s, before, 0).cluster == "b-nvl"


def test_cliques_take_a_small_job_only_when_nothing_else_fits_and_say_so() -> None:
    s = FleetSnapshot(
        [hgx_cluster("a-hgx", free=[0, 0]), nvl72_cluster("b-nvl", free=[[4] + [0] * 17])]
    )
    d = place(job(gpus=1, requests={GPU: 1}), s, POLICY, 0)
    assert d.cluster == "b-nvl"
    assert "NVL72 clique pool: no other pool fits it now" in d.message


def test_a_clique_job_still_goes_to_the_clique() -> None:
    s = FleetSnapshot([hgx_cluster("a-hgx", free=[8, 8, 8, 8]), nvl72_cluster("b-nvl")])
    d = place(job(gpus=4, pods=4, nvlink="Required", requests={GPU: 4}), s, POLICY, 0)
    assert d.cluster == "b-nvl"


def test_the_message_says_what_a_placement_destroys() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[8, 0])])
    d = place(job(gpus=1, requests={GPU: 1}), s, POLICY, 0)
    assert "breaks 1 whole node (7 GPUs stranded)" in d.message
    assert "largest free NVLink block 8 -> 7 GPUs" in d.message
    # 8 - 1 + (8 - 7) = 8 GPUs lost for 1 placed
    assert d.score_parts["TopologyCost"] == round(100 / 9, 3)


def test_with_its_weight_at_zero_and_no_tier_scores_are_as_before() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[3, 8]), hgx_cluster("b", free=[8, 8])])
    old = Policy(weights=ScoreWeights(topology_cost=0), keep_cliques=False)
    d = place(job(gpus=1, requests={GPU: 1}), s, old, 0)
    assert d.cluster == "a"
    assert gpus_on(d) == {"a-n000": 1}
    assert "TopologyCost" in d.score_parts  # shown, weighted 0


# --- property: place() against a brute-force reference ------------------------------------------


@st.composite
def hgx(draw: Any, name: str) -> tuple[MemberClusterState, list[list[int]]]:
    frees = draw(st.lists(st.integers(0, 8), min_size=1, max_size=5))
    nodes = [node(f"{name}-n{i}", free=f) for i, f in enumerate(frees)]
    return member(name, nodes), [[f] for f in frees]


@st.composite
def nvl(draw: Any, name: str) -> tuple[MemberClusterState, list[list[int]]]:
    cliques = draw(
        st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=5), min_size=1, max_size=2)
    )
    nodes = [
        node(f"{name}-c{c}-t{t}", gpus=4, free=f, product=GB200, clique=f"{name}.{c}")
        for c, trays in enumerate(cliques)
        for t, f in enumerate(trays)
    ]
    return member(name, nodes), cliques


@st.composite
def fleets(draw: Any) -> list[tuple[MemberClusterState, list[list[int]], bool]]:
    out = []
    for i in range(draw(st.integers(1, 3))):
        clique = draw(st.booleans())
        m, domains = draw(nvl(f"m{i}") if clique else hgx(f"m{i}"))
        out.append((m, domains, clique))
    return out


def _options(
    fleet: list[tuple[MemberClusterState, list[list[int]], bool]], g: int
) -> dict[tuple[str, int, int], tuple[int, float]]:
    """(member, domain, node) -> (tier, total score) for every node that holds one pod of ``g``
    GPUs, from the raw free lists: NVLinkBestFit g / domain free, binpack (cap - free + g) /
    cap, locality 100, TopologyCost g / (g + stranded + block lost); weights 2, 1, 1, 1;
    cliques are tier 1."""
    out: dict[tuple[str, int, int], tuple[int, float]] = {}
    for m, domains, clique in fleet:
        size = 4 if clique else 8
        cap = size * sum(len(d) for d in domains)
        free = sum(sum(d) for d in domains)
        block = max(sum(d) for d in domains)
        for di, dom in enumerate(domains):
            for ni, f in enumerate(dom):
                if f < g:
                    continue
                fit = 100 * g / sum(dom)
                alloc = 100 * (cap - free + g) / cap
                stranded = f - g if f == size else 0
                after = [list(d) for d in domains]
                after[di][ni] -= g
                lost = stranded + max(0, block - max(sum(d) for d in after))
                cost = 100 * g / (g + lost)
                out[(m.name, di, ni)] = (int(clique), (2 * fit + alloc + 100 + cost) / 5)
    return out


def _where(name: str, clique: bool) -> tuple[int, int]:
    """(domain, node) indexes of a builder node name (``m0-n3``, ``m0-c1-t2``)."""
    parts = name.split("-")[1:]
    if clique:
        return int(parts[0][1:]), int(parts[1][1:])
    return int(parts[0][1:]), 0


@given(fleets(), st.sampled_from([1, 2, 4]))
@SETTINGS
def test_place_keeps_cliques_and_scores_the_cost_as_brute_force_does(
    fleet: list[tuple[MemberClusterState, list[list[int]], bool]], g: int
) -> None:
    """Tier: a clique member only when no HGX node fits. Score: the chosen node's total equals
    the reference's. HGX tier: no node of any HGX member scores higher (the cheapest of the
    equally good fits wins). Within a clique pool the planner takes the tightest clique first,
    so there only the chosen node's own score is compared."""
    s = FleetSnapshot([m for m, _, _ in fleet])
    d = place(job(gpus=g, requests={GPU: g}), s, POLICY, 0)
    options = _options(fleet, g)
    if not options:
        assert not d.placed
        return
    assert d.placed
    assert d.score is not None
    clique = {m.name: c for m, _, c in fleet}[d.cluster or ""]
    [chosen] = gpus_on(d)
    tier, total = options[(d.cluster or "", *_where(chosen, clique))]
    assert tier == min(t for t, _ in options.values())
    assert abs(d.score - total) < 1e-2
    if tier == 0:
        assert total >= max(v for t, v in options.values() if t == 0) - 1e-2
