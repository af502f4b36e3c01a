"""Hypothesis properties of placement and the ledger over random fleets and jobs.

* no node ever gets more GPUs than it has free (also across a sequence of reserved decisions);
* gangs are all-or-nothing;
* same input, same output, whatever order the snapshot was built in;
* the ledger never double-counts: once every job's pods are reported bound, free capacity is
  exactly what the members report;
* incremental updates leave the indexes equal to a fresh build.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from placement_builders import GB200, GPU, H100, gpus_on, job, member, node, nvl72_cluster

from gpufed.api.inventory import MemberClusterState, NodeInventory
from gpufed.api.request import PlacementRequest
from gpufed.placement import FleetSnapshot, Policy, place

POLICY = Policy()
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def hgx_members(draw: Any, name: str) -> MemberClusterState:
    frees = draw(st.lists(st.integers(0, 8), min_size=1, max_size=6))
    ready = draw(st.lists(st.booleans(), min_size=len(frees), max_size=len(frees)))
    return member(
        name,
        [
            node(f"{name}-n{i}", free=f, ready=r or i == 0, rack=f"{name}-r{i // 2}")
            for i, (f, r) in enumerate(zip(frees, ready, strict=True))
        ],
    )


@st.composite
def nvl_members(draw: Any, name: str) -> MemberClusterState:
    cliques = draw(
        st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=5), min_size=1, max_size=2)
    )
    return nvl72_cluster(name, len(cliques), free=cliques)


@st.composite
def fleets(draw: Any) -> list[MemberClusterState]:
    n = draw(st.integers(1, 3))
    out = []
    for i in range(n):
        name = f"m{i}"
        out.append(draw(st.one_of(hgx_members(name), nvl_members(name))))
    return out


@st.composite
def jobs(draw: Any, name: str = "j") -> PlacementRequest:
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    pods = draw(st.integers(1, 4))
    nvlink = draw(st.sampled_from(["Required", "Preferred", "None"]))
    products = draw(st.sampled_from([(), (H100,), (GB200,)]))
    rack = draw(st.sampled_from([None, None, "Required", "Preferred"]))
    return job(name, gpus=gpus, pods=pods, nvlink=nvlink, products=products, rack=rack)


def free_map(s: FleetSnapshot) -> dict[tuple[str, str], int]:
    return {
        (c, n.name): s.free(c, n.name) for c in s.cluster_names for n in s.member(c).inventory.nodes
    }


@SETTINGS
@given(fleets(), st.lists(jobs(), min_size=1, max_size=6))
def test_no_node_ever_gets_more_gpus_than_it_has_free(
    fleet: list[MemberClusterState], requests: list[PlacementRequest]
) -> None:
    s = FleetSnapshot(fleet)
    initial = free_map(s)
    given_out: dict[tuple[str, str], int] = {}
    for i, req in enumerate(requests):
        req = req.model_copy(update={"uid": f"u{i}", "job": f"ns/j{i}"})
        before = free_map(s)
        d = place(req, s, POLICY, 0)
        if not d.placed:
            assert d.pod_sets == ()
            assert free_map(s) == before
            continue
        for n, g in gpus_on(d).items():
            assert g <= before[(d.cluster, n)]
            given_out[(d.cluster, n)] = given_out.get((d.cluster, n), 0) + g
        s.reserve(d, now=0)
        assert all(v >= 0 for v in free_map(s).values())
    for key, g in given_out.items():
        assert g <= initial[key]
    assert s.verify_indexes() == []


@SETTINGS
@given(fleets(), jobs())
def test_gangs_are_all_or_nothing(fleet: list[MemberClusterState], req: PlacementRequest) -> None:
    s = FleetSnapshot(fleet)
    d = place(req, s, POLICY, 0)
    if d.placed:
        assert {ps.name: sum(ps.nodes.values()) for ps in d.pod_sets} == {
            ps.name: ps.count for ps in req.pod_sets
        }
        assert len({d.cluster}) == 1
        if req.topology.nvlink == "Required":
            assert len(d.nvlink_domains) == 1
        if req.topology.rack == "Required":
            racks = {s.node(d.cluster or "", n).rack for n in gpus_on(d)}
            assert len(racks) == 1
    else:
        assert d.pod_sets == ()
        assert d.cluster is None
        assert d.rejections


@SETTINGS
@given(fleets(), jobs(), st.randoms(use_true_random=False))
def test_same_input_same_output(
    fleet: list[MemberClusterState], req: PlacementRequest, rnd: Any
) -> None:
    a = FleetSnapshot(fleet)
    shuffled = list(fleet)
    rnd.shuffle(shuffled)
    b = FleetSnapshot()
    for m in shuffled:
        nodes = list(m.inventory.nodes)
        rnd.shuffle(nodes)
        b.set_member(
            m.model_copy(
                update={"inventory": m.inventory.model_copy(update={"nodes": tuple(nodes)})}
            )
        )
    assert place(req, a, POLICY, 0).model_dump() == place(req, b, POLICY, 0).model_dump()
    assert place(req, a, POLICY, 0).model_dump() == place(req, a, POLICY, 0).model_dump()


def _bind(inv: NodeInventory, uid: str, res: dict[str, int]) -> NodeInventory:
    req = dict(inv.requested)
    jr = {k: dict(v) for k, v in inv.job_requests.items()}
    mine = jr.setdefault(uid, {})
    for r, a in res.items():
        req[r] = req.get(r, 0) + a
        mine[r] = mine.get(r, 0) + a
    return inv.model_copy(update={"requested": req, "job_requests": jr})


@SETTINGS
@given(fleets(), st.lists(jobs(), min_size=1, max_size=5), st.data())
def test_the_ledger_never_double_counts(
    fleet: list[MemberClusterState], requests: list[PlacementRequest], data: Any
) -> None:
    s = FleetSnapshot(fleet)
    decisions = []
    for i, req in enumerate(requests):
        d = place(req.model_copy(update={"uid": f"u{i}"}), s, POLICY, 0)
        if d.placed:
            s.reserve(d, now=0)
            decisions.append(d)
    # the members report the pods bound, in any order, one node at a time
    work = [(d, n, r) for d in decisions for n, r in d.node_requests().items()]
    order = data.draw(st.permutations(work))
    bound: set[tuple[str, str]] = set()
    for d, n, r in order:
        s.upsert_node(d.cluster, _bind(s.node(d.cluster, n), d.uid, r))
        bound.add((d.uid, n))
        assert s.verify_indexes() == []
        # model: a node's free GPUs are what its member reports, less the reservations of jobs
        # whose pods are not yet reported on it (and none once a job is fully reported)
        settled = {x.uid for x in decisions if all((x.uid, m) in bound for m in x.node_requests())}
        for c in s.cluster_names:
            for inv in s.member(c).inventory.nodes:
                held = sum(
                    x.node_requests()[inv.name].get(GPU, 0)
                    for x in decisions
                    if x.cluster == c
                    and inv.name in x.node_requests()
                    and x.uid not in settled
                    and (x.uid, inv.name) not in bound
                )
                reported = max(0, inv.allocatable.get(GPU, 0) - inv.requested.get(GPU, 0))
                want = max(0, reported - held) if inv.offers_capacity else 0
                assert s.free(c, inv.name) == want
    for c in s.cluster_names:
        for inv in s.member(c).inventory.nodes:
            expected = max(0, inv.allocatable.get(GPU, 0) - inv.requested.get(GPU, 0))
            assert s.free(c, inv.name) == (expected if inv.offers_capacity else 0)
            assert s.outstanding(c, inv.name) == {}
    assert len(s.settled_reservations()) == len(decisions)


@SETTINGS
@given(
    fleets(),
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 5), st.integers(0, 8), st.booleans()),
        max_size=12,
    ),
    jobs(),
)
def test_incremental_updates_match_a_fresh_build(
    fleet: list[MemberClusterState], edits: list[tuple[int, int, int, bool]], req: PlacementRequest
) -> None:
    s = FleetSnapshot(fleet)
    for m_i, n_i, free, remove in edits:
        m = fleet[m_i % len(fleet)]
        inv = s.member(m.name).inventory.nodes
        if not inv:
            continue
        target = inv[n_i % len(inv)]
        if remove:
            s.remove_node(m.name, target.name)
        else:
            gpus = target.allocatable[GPU]
            s.upsert_node(
                m.name,
                target.model_copy(
                    update={"requested": {**target.requested, GPU: gpus - min(free, gpus)}}
                ),
            )
        assert s.verify_indexes() == []
    fresh = FleetSnapshot([s.member(c) for c in s.cluster_names])
    assert place(req, s, POLICY, 0).model_dump() == place(req, fresh, POLICY, 0).model_dump()
