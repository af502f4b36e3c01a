"""``whole_free_nodes`` (gpufed.placement.holds), which keeps each pool's whole free nodes in the
placement memo for the pool's version, answers every job as a brute-force scan of every node
of the fleet at the same moment does, across random fleets and random node changes (requests
moving, nodes cordoned, not ready, replaced by another shape, removed, added, reservations
made and released) — and a spare taken before a change still answers as of its call.

Reference: every node of every member read directly (not the pool buckets the function reads):
an offering node of a whole-GPU pool with every allocatable GPU free (after reservations)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from placement_builders import GB200, H100, job, member, mig_single_node, node

from gpufed.api.inventory import NodeInventory
from gpufed.api.request import PlacementRequest
from gpufed.placement import FleetSnapshot, Policy, place
from gpufed.placement.holds import whole_free_nodes

POLICY = Policy()
MEMBERS = ("a", "b", "c")
#: (GPUs, pods): every kind of answer (more GPUs than the job asks, trays for one pod)
SHAPES = [(1, 1), (2, 1), (4, 1), (4, 2), (8, 1), (8, 2), (16, 1)]
JOBS = [job(f"j{g}x{p}", gpus=g, pods=p) for g, p in SHAPES] + [job("cpu", gpus=0)]


def _node(member_: str, i: int, kind: str, used: int, ready: bool, cordoned: bool) -> NodeInventory:
    name = f"{member_}-n{i:02d}"
    if kind == "mig":
        return mig_single_node(name)
    gpus = 4 if kind == "nvl" else 8
    return node(
        name,
        gpus=gpus,
        free=gpus - min(used, gpus),
        product=GB200 if kind == "nvl" else H100,
        clique=f"{member_}-c{i % 2}" if kind == "nvl" else None,
        rack=f"r{i % 3}",
        ready=ready,
        unschedulable=cordoned,
    )


node_args = st.tuples(
    st.sampled_from(["hgx", "hgx", "nvl", "mig"]),
    st.sampled_from([0, 0, 0, 1, 4, 8]),
    st.integers(0, 9).map(lambda x: x > 0),
    st.integers(0, 9).map(lambda x: x == 0),
)


@st.composite
def fleets(draw: Any) -> FleetSnapshot:
    members = []
    for m in MEMBERS[: draw(st.integers(1, 3))]:
        args = draw(st.lists(node_args, max_size=12))
        members.append(member(m, [_node(m, i, *a) for i, a in enumerate(args)]))
    return FleetSnapshot(members)


change = st.tuples(
    st.sampled_from(["upsert", "upsert", "remove", "reserve", "release"]),
    st.sampled_from(MEMBERS),
    st.integers(0, 14),
    node_args,
    st.integers(0, len(JOBS) - 1),
)


def reference(s: FleetSnapshot, req: PlacementRequest) -> dict[str, frozenset[str]]:
    demand = sum(ps.count * ps.requests.get("nvidia.com/gpu", 0) for ps in req.pod_sets)
    if demand <= 0:
        return {}
    one_pod = sum(ps.count for ps in req.pod_sets) == 1
    out: dict[str, frozenset[str]] = {}
    for c in s.clusters():
        names = set()
        for n in c.nodes.values():
            alloc = n.inv.allocatable.get("nvidia.com/gpu", 0)
            whole = (
                n.offers
                and n.pool is not None
                and not n.pool.slices
                and alloc > 0
                and s.free(c.name, n.name) == alloc
            )
            if whole and (
                alloc > demand or (one_pod and n.inv.nvlink_domain.startswith("clique:"))
            ):
                names.add(n.name)
        if names:
            out[c.name] = frozenset(names)
    return out


def answers(spare: Any) -> list[dict[str, frozenset[str]]]:
    out = []
    for req in JOBS:
        holds = spare(req)
        assert all(h.cluster == c and h.starts_at is None for c, h in holds.items())
        out.append({c: h.nodes for c, h in holds.items()})
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), st.lists(st.tuples(change, st.booleans()), max_size=25))
def test_whole_free_nodes_equals_a_scan_of_every_node_after_every_change(
    s: FleetSnapshot, changes: list[tuple[tuple[str, str, int, Any, int], bool]]
) -> None:
    placed: list[str] = []
    for step, ((what, m, i, args, j), ask_first) in enumerate(changes):
        before = [reference(s, r) for r in JOBS]
        taken = whole_free_nodes(s)  # a pass starts
        if ask_first:  # else its first answers come after the change
            assert answers(taken) == before
        if m not in s.cluster_names:
            continue
        if what == "upsert":
            s.upsert_node(m, _node(m, i, *args))
        elif what == "remove":
            s.remove_node(m, f"{m}-n{i:02d}")
        elif what == "reserve":
            req = JOBS[j].model_copy(update={"uid": f"u{step}", "job": f"ns/u{step}"})
            d = place(req, s, POLICY, 0)
            if d.placed:
                s.reserve(d, now=0)
                placed.append(req.uid)
        elif placed:
            s.release(placed.pop(j % len(placed)))
        # the spare of the pass that started before the change answers as of its call
        assert answers(taken) == before
        assert answers(whole_free_nodes(s)) == [reference(s, r) for r in JOBS]


def test_the_answers_kept_across_calls_follow_the_members_of_the_snapshot() -> None:
    """A member that left is forgotten at the next call, also when another joined meanwhile
    (the kept answers must not hold its node-name sets for the hub's lifetime)."""
    s = FleetSnapshot([member("a", [_node("a", 0, "hgx", 0, True, False)])])
    s.set_member(member("b", [_node("b", 0, "hgx", 0, True, False)]))
    whole_free_nodes(s)
    assert set(s.memo.kept[("holds.whole_free",)]) == {"a", "b"}
    s.remove_member("b")
    s.set_member(member("c", [_node("c", 0, "hgx", 0, True, False)]))
    assert answers(whole_free_nodes(s)) == [reference(s, r) for r in JOBS]
    assert set(s.memo.kept[("holds.whole_free",)]) == {"a", "c"}
