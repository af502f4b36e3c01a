"""A member filled in chunks by ``FleetSnapshot.upsert_nodes`` (new nodes filed together, each
group re-filed once per chunk) ends in the same state as one filled node by node with
``upsert_node``, and places every job the same way.

Reference: the node-by-node build. Both snapshots get the same random nodes (HGX, NVL72
cliques, racks and blocks, MIG slices, not-ready and cordoned nodes, taints, pods of ledger
entries loaded before the nodes came), the same re-reported nodes in between, and the same
decisions reserved along the way (which build the lazy indexes: rack/block group order, the
NVLink slot index, before later chunks arrive). The state is read field by field here, not
through the snapshot's own consistency check (that must hold too)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from placement_builders import GB200, H100, job, member, mig_single_node, node

from gpufed.api.decision import Reservation
from gpufed.api.inventory import NodeInventory, Taint
from gpufed.api.request import PlacementRequest
from gpufed.placement import FleetSnapshot, Policy, place

POLICY = Policy()
CLUSTER = "m"
TAINT = Taint(key="inference", effect="NoSchedule")


@st.composite
def nodes(draw: Any) -> list[NodeInventory]:
    """Up to ~60 nodes of one member in a random order."""
    out: list[NodeInventory] = []
    for i in range(draw(st.integers(1, 60))):
        name = f"n{i:03d}"
        kind = draw(st.sampled_from(["hgx", "hgx", "nvl", "nvl", "mig", "tainted"]))
        rack = f"r{draw(st.integers(0, 5))}"
        block = draw(st.sampled_from([None, "b0", "b1"]))
        ready = draw(st.integers(0, 9)) > 0
        cordoned = draw(st.integers(0, 9)) == 0
        job_uid = draw(st.sampled_from(["", "", "held-0", "held-1"]))
        if kind == "mig":
            out.append(mig_single_node(name))
            continue
        gpus = 4 if kind == "nvl" else 8
        free = draw(st.integers(0, gpus))
        used = {"nvidia.com/gpu": gpus - free} if gpus - free else {}
        out.append(
            node(
                name,
                gpus=gpus,
                free=free,
                product=GB200 if kind == "nvl" else H100,
                clique=f"c{draw(st.integers(0, 3))}" if kind == "nvl" else None,
                rack=rack,
                block=block,
                ready=ready,
                unschedulable=cordoned,
                taints=(TAINT,) if kind == "tainted" else (),
                job_requests={job_uid: used} if job_uid and used else None,
            )
        )
    order = draw(st.permutations(range(len(out))))
    return [out[i] for i in order]


JOBS = [
    job("one", gpus=1),
    job("hgx", gpus=8),
    job("tray", gpus=4, products=(GB200,)),
    job("gang", gpus=4, pods=3, nvlink="Required", products=(GB200,)),
    job("rack", gpus=2, pods=2, rack="Required"),
]


def _state(s: FleetSnapshot) -> dict[str, Any]:
    """Everything the member's indexes hold, as plain data (nodes by name, not identity)."""
    c = s.cluster(CLUSTER)

    def key(g: Any) -> str | None:
        return None if g is None else g.key

    def trimmed(counts: list[int]) -> list[int]:
        out = list(counts)
        while out and out[-1] == 0:
            out.pop()
        return out

    pools: dict[Any, Any] = {}
    for pk, p in c.pools.items():
        pools[pk] = {
            "free": p.free,
            "cap": p.cap,
            "counts": trimmed(p.counts),
            "buckets": {f: [e[:2] for e in b] for f, b in enumerate(p.buckets) if b},
            "single": p.single_count,
            "shapes": dict(p.alloc_shapes),
            "nodes": sorted(p.nodes),
            "groups": {
                lv: {
                    gk: (g.free, g.cap, trimmed(g.counts), sorted(g.nodes), g.entry and g.entry[:2])
                    for gk, g in groups.items()
                }
                for lv, groups in p.groups.items()
            },
            "indexed": sorted(p.indexed),
            "gbuckets": {
                lv: {f: [e[:2] for e in lst] for f, lst in p.gbuckets[lv].items()}
                for lv in p.indexed
            },
            "slots": {
                gp: {n: [e[:3] for e in lst] for n, lst in index.items()}
                for gp, index in p.slot_index.items()
            },
        }
    return {
        "names": list(c.names),
        "shapes": dict(c.alloc_shapes),
        "extended": {r: list(v) for r, v in c.extended.items()},
        "nodes": {
            n.name: (
                n.gpu_free,
                n.reserved,
                n.offers,
                n.pool and n.pool.key,
                key(n.domain),
                key(n.rack),
                key(n.block),
                n.entry and n.entry[:2],
                n.inv,
            )
            for n in c.nodes.values()
        },
        "pools": pools,
        "ledger": [
            (r.job_uid, s.outstanding(CLUSTER, n)) for r in s.reservations() for n in r.nodes
        ],
    }


def _empty(held: list[str]) -> FleetSnapshot:
    s = FleetSnapshot([member(CLUSTER, [])])
    for i, name in enumerate(held):  # entries of a previous hub, loaded before the nodes
        s.add_reservation(
            Reservation(
                job_uid=f"held-{i}",
                job=f"ns/held-{i}",
                cluster=CLUSTER,
                nodes={name: {"nvidia.com/gpu": 1 + i}},
                created_at=0.0,
                ttl_s=600.0,
            )
        )
    return s


def _decide(a: FleetSnapshot, b: FleetSnapshot, step: int) -> None:
    for k, j in enumerate(JOBS):
        req: PlacementRequest = j.model_copy(update={"uid": f"u{step}-{k}", "job": f"ns/{k}"})
        da, db = place(req, a, POLICY, 0), place(req, b, POLICY, 0)
        assert da.model_dump(exclude={"decided_at"}) == db.model_dump(exclude={"decided_at"})
        if da.placed:
            a.reserve(da, now=0)
            b.reserve(db, now=0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes(), st.data())
def test_chunked_add_equals_node_by_node(inv: list[NodeInventory], data: st.DataObject) -> None:
    held = [n.name for n in inv[:2]]
    a, b = _empty(held), _empty(held)
    size = data.draw(st.integers(1, 17), label="chunk")
    again = data.draw(st.lists(st.sampled_from(inv), max_size=4), label="re-reported")
    for start in range(0, len(inv), size):
        chunk = inv[start : start + size]
        if again and start:
            chunk = [*chunk, again.pop()]  # a node already there (or twice in the chunk)
        for n in chunk:
            a.upsert_node(CLUSTER, n)
        b.upsert_nodes(CLUSTER, chunk)
        assert _state(a) == _state(b)
        if data.draw(st.booleans(), label="decide"):
            _decide(a, b, start)
            assert _state(a) == _state(b)
    assert b.verify_indexes() == []
    # and a third build: the final nodes and ledger in one go (set_member's bulk path), for
    # what all builds hold (not the indexes place() builds on first use)
    final = dict(b.cluster(CLUSTER).nodes)
    c = FleetSnapshot(
        [member(CLUSTER, [final[x].inv for x in sorted(final)])], reservations=b.reservations()
    )
    assert _core(_state(c)) == _core(_state(b))
    _decide(a, b, -1)
    assert _state(a) == _state(b)


def _core(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` without the indexes built on first demand (rack/block order, slot index)."""
    pools = {
        k: {f: v for f, v in p.items() if f not in ("indexed", "gbuckets", "slots")}
        for k, p in state["pools"].items()
    }
    for p in pools.values():
        p["groups"] = {
            lv: {gk: g[:4] for gk, g in groups.items()} for lv, groups in p["groups"].items()
        }
    return {**state, "pools": pools}


def test_a_chunk_naming_a_node_twice_is_filed_as_upserts_in_order() -> None:
    s = FleetSnapshot([member(CLUSTER, [])])
    first, second = node("x", free=8), node("x", free=2)
    s.upsert_nodes(CLUSTER, [first, node("y"), second])
    assert s.free(CLUSTER, "x") == 2
    assert s.cluster(CLUSTER).names == ["x", "y"]
    assert s.verify_indexes() == []


def test_cluster_add_nodes_refuses_a_node_it_has_and_changes_nothing() -> None:
    s = FleetSnapshot([member(CLUSTER, [node("x")])])
    c = s.cluster(CLUSTER)
    before = _state(s)
    for bad in ([node("y"), node("x")], [node("z"), node("z")]):
        with pytest.raises(ValueError, match="is there already"):
            c.add_nodes(bad, s._ledger)
        assert _state(s) == before
