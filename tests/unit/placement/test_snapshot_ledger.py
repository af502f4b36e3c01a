"""FleetSnapshot updates and the reservation ledger: never the same GPUs free twice."""

from __future__ import annotations

import pytest
from placement_builders import GPU, gpus_on, hgx_cluster, job, node, nvl72_cluster

from gpufed.api.decision import Decision, Reservation
from gpufed.api.inventory import ClusterHealth, NodeInventory
from gpufed.placement import FleetSnapshot, Policy, place

POLICY = Policy()


def bound(inv: NodeInventory, uid: str, pods: int, per_pod: dict[str, int]) -> NodeInventory:
    """The node as the agent reports it once ``pods`` pods of job ``uid`` are bound there."""
    req = dict(inv.requested)
    jr = {k: dict(v) for k, v in inv.job_requests.items()}
    mine = jr.setdefault(uid, {})
    for r, a in per_pod.items():
        req[r] = req.get(r, 0) + a * pods
        mine[r] = mine.get(r, 0) + a * pods
    return inv.model_copy(update={"requested": req, "job_requests": jr})


def placed(s: FleetSnapshot, gpus: int, pods: int = 1, name: str = "j") -> Decision:
    d = place(job(name, gpus=gpus, pods=pods), s, POLICY, 0)
    assert d.placed, d.message
    return d


def test_reserve_deducts_at_once() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[8])])
    d = placed(s, 8)
    s.reserve(d, now=0)
    assert s.free("a", "a-n000") == 0
    assert place(job("k", gpus=1), s, POLICY, 0).placed is False
    assert s.verify_indexes() == []


def test_bound_pods_reported_later_are_not_deducted_twice() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[8, 8])])
    d = placed(s, 4, name="j")
    s.reserve(d, now=0)
    [n] = gpus_on(d)
    assert s.free("a", n) == 4
    s.upsert_node("a", bound(s.node("a", n), "uid-j", 1, d.pod_sets[0].requests))
    assert s.free("a", n) == 4  # reported requested +4, reservation no longer deducts
    assert s.outstanding("a", n) == {}
    assert [r.job_uid for r in s.settled_reservations()] == ["uid-j"]
    assert s.verify_indexes() == []


def test_partially_bound_gang_keeps_the_rest_reserved() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[8, 8, 8])])
    d = placed(s, 8, pods=2)
    s.reserve(d, now=0)
    first, second = sorted(gpus_on(d))
    s.upsert_node("a", bound(s.node("a", first), "uid-j", 1, d.pod_sets[0].requests))
    assert s.free("a", first) == 0
    assert s.free("a", second) == 0
    assert s.outstanding("a", first) == {}
    assert s.outstanding("a", second)[GPU] == 8
    assert s.settled_reservations() == []


def test_a_node_whose_pods_are_reported_stops_deducting_while_others_still_wait() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[3, 3])])
    d = place(job(gpus=2, pods=2, nvlink="None"), s, POLICY, 0)
    assert gpus_on(d) == {"a-n000": 2, "a-n001": 2}
    s.reserve(d, now=0)
    s.upsert_node("a", bound(s.node("a", "a-n000"), "uid-j", 1, d.pod_sets[0].requests))
    # a-n000 reports 5 of 8 requested: 3 - 2 = 1 free, nothing deducted a second time;
    # a-n001 still reports 3 free, of which 2 are promised to the job
    assert s.free("a", "a-n000") == 1
    assert s.free("a", "a-n001") == 1
    assert s.settled_reservations() == []


def test_pods_bound_on_other_nodes_settle_the_reservation_once_all_are_seen() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[8, 8, 8])])
    d = placed(s, 8)
    s.reserve(d, now=0)
    [reserved] = gpus_on(d)
    other = next(n for n in ("a-n000", "a-n001", "a-n002") if n != reserved)
    # the member's scheduler put the pod elsewhere: once the whole job is seen, nothing is
    # deducted twice
    s.upsert_node("a", bound(s.node("a", other), "uid-j", 1, d.pod_sets[0].requests))
    assert s.free("a", reserved) == 8
    assert s.free("a", other) == 0
    assert s.verify_indexes() == []


def test_reservation_expires_after_its_ttl_if_pods_never_show_up() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[8])])
    s.reserve(placed(s, 8), now=100.0, ttl_s=60)
    assert s.expire_reservations(159.0) == []
    [gone] = s.expire_reservations(160.0)
    assert gone.job_uid == "uid-j"
    assert s.free("a", "a-n000") == 8


def test_release_frees_and_is_idempotent() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[8])])
    s.reserve(placed(s, 8), now=0)
    assert s.release("uid-j") is not None
    assert s.release("uid-j") is None
    assert s.free("a", "a-n000") == 8


def test_ledger_entries_survive_a_restart_as_json() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[8, 8])])
    res = s.reserve(placed(s, 8), now=0, ttl_s=30)
    stored = res.model_dump_json()
    # hub restart: reservations come back from etcd before (or after) the inventories
    restored = FleetSnapshot(reservations=[Reservation.model_validate_json(stored)])
    restored.set_member(hgx_cluster("a", free=[8, 8]))
    assert restored.free("a", next(iter(res.nodes))) == 0
    assert restored.reservations() == [res]
    assert restored.verify_indexes() == []


def test_restored_entry_whose_pods_are_already_bound_deducts_nothing() -> None:
    res = Reservation(job_uid="u1", cluster="a", nodes={"a-n000": {GPU: 8}}, created_at=0, ttl_s=60)
    already = node("a-n000", free=0, job_requests={"u1": {GPU: 8}})
    s = FleetSnapshot([hgx_cluster("a", free=[])], reservations=[res])
    s.upsert_node("a", already)
    assert s.outstanding("a", "a-n000") == {}
    assert [r.job_uid for r in s.settled_reservations()] == ["u1"]


def test_only_placed_decisions_can_be_reserved() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[1])])
    d = place(job(gpus=8), s, POLICY, 0)
    with pytest.raises(ValueError, match="only a Placed decision"):
        s.reserve(d, now=0)


def test_set_member_keeps_reservations_and_replaces_nodes() -> None:
    s = FleetSnapshot([hgx_cluster("a", free=[8, 8])])
    d = placed(s, 8)
    s.reserve(d, now=0)
    s.set_member(hgx_cluster("a", free=[8, 8], labels={"region": "x"}))
    assert s.free("a", next(iter(gpus_on(d)))) == 0
    assert s.member("a").labels == {"region": "x"}
    assert s.verify_indexes() == []


def test_node_updates_keep_indexes_in_step() -> None:
    s = FleetSnapshot([nvl72_cluster("n", cliques=2), hgx_cluster("a", rack_size=2)])
    s.upsert_node(
        "n",
        node(
            "n-c0-t00", gpus=4, free=1, product="NVIDIA-GB200", clique="n-fabric.0", rack="n-rack0"
        ),
    )
    s.upsert_node("a", node("a-n000", ready=False, rack="a-r0"))
    s.upsert_node("a", node("a-new", free=3, rack="a-r9"))
    s.remove_node("n", "n-c1-t05")
    s.remove_node("a", "a-n001")
    s.set_health("n", ClusterHealth(ready=False, reason="LeaseExpired"))
    assert s.verify_indexes() == []
    summary = s.summary("a")
    assert summary.gpus_free == {"NVIDIA-H100-80GB-HBM3": 8 + 8 + 3}
    assert summary.largest_free_nvlink_block == 8
    assert s.summary("n").largest_free_nvlink_block == 72 - 3


def test_summary_matches_the_inventory_summary_rules() -> None:
    from gpufed.api.inventory import summarize

    st = nvl72_cluster("n", cliques=2, free=[[4] * 18, [1] * 18])
    s = FleetSnapshot([st])
    assert s.summary("n") == summarize(st.inventory.nodes)


def test_unknown_member_is_named_in_the_error() -> None:
    with pytest.raises(KeyError, match="'nope' is not in the snapshot"):
        FleetSnapshot().upsert_node("nope", node("x"))


def test_a_member_state_with_a_node_twice_is_refused_and_the_previous_state_kept() -> None:
    s = FleetSnapshot([hgx_cluster("a", nodes=2)])
    s.reserve(place(job("x", gpus=8), s, POLICY, 0), now=0)
    before = s.member("a")
    bad = before.model_copy(
        update={
            "inventory": before.inventory.model_copy(
                update={"nodes": (node("a-n000"), node("a-n000", free=0))}
            )
        }
    )
    with pytest.raises(ValueError, match="'a-n000' appears twice"):
        s.set_member(bad)
    assert s.member("a") == before
    assert s.verify_indexes() == []
    assert place(job("y", gpus=8), s, POLICY, 0).placed
