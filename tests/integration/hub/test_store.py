"""The hub's etcd state against a real etcd: exactly-once placement, leader guard, election."""

from __future__ import annotations

import asyncio

import pytest

from gpufed.api.inventory import NodeInventory
from gpufed.hub.adapters.store import ConflictError, NotLeaderError, Store
from gpufed.hub.edge.leader import LeaderElector
from gpufed.hub.rules.records import (
    AckRecord,
    FairShareRecord,
    JobRecord,
    MemberMeta,
    RecentNodeRecord,
    RecentNodesRecord,
    RequeueCause,
    WorkRecord,
)

pytestmark = pytest.mark.integration


def job(uid: str = "u1", cluster: str = "m1") -> JobRecord:
    return JobRecord(uid=uid, job="team-a/j", cluster=cluster, placed_at=1.0, gpus=8)


def work(uid: str = "u1", op: str = "Apply") -> WorkRecord:
    return WorkRecord(
        job_uid=uid,
        job="team-a/j",
        namespace="team-a",
        op=op,  # type: ignore[arg-type]
        manifests=({"kind": "Job"},),
    )


async def lead(store: Store, ttl: int = 5) -> LeaderElector:
    elector = LeaderElector(store, ttl_s=ttl)
    await asyncio.wait_for(elector.acquire(), 10)
    return elector


async def test_placement_is_written_once_with_work_and_reservation(store: Store) -> None:
    await lead(store)
    rev, job_rev = await store.place(job(), work(), '{"r":1}', expect_job_revision=None)
    assert rev == job_rev > 0
    with pytest.raises(ConflictError):
        await store.place(job(cluster="m2"), work(), "{}", expect_job_revision=None)
    loaded = await store.load()
    assert loaded.jobs["u1"].cluster == "m1"
    assert loaded.work[("m1", "u1")] == (work(), rev)
    assert ("m2", "u1") not in loaded.work
    assert loaded.reservations == {"u1": '{"r":1}'}
    assert loaded.job_revisions["u1"] == job_rev


async def test_a_job_is_placed_again_only_from_the_revision_read(store: Store) -> None:
    await lead(store)
    _, job_rev = await store.place(job(), work(), "{}", expect_job_revision=None)
    requeued = job().model_copy(update={"cluster": None})
    new_rev = await store.put_job(requeued, expect_revision=job_rev)
    second = job(cluster="m2").model_copy(update={"attempt": 2})
    with pytest.raises(ConflictError):
        await store.place(second, work(), "{}", expect_job_revision=job_rev)
    rev, _ = await store.place(second, work(), "{}", expect_job_revision=new_rev)
    assert (await store.get_work("m2", "u1")) == (work(), rev)


async def test_work_revisions_strictly_increase(store: Store) -> None:
    await lead(store)
    rev1, _ = await store.place(job(), work(), "{}", expect_job_revision=None)
    rev2 = await store.put_work("m1", work(op="Delete"))
    assert rev2 > rev1
    await store.put_ack("m1", "u1", AckRecord(revision=rev2, result="Deleted"))
    await store.forget_work("m1", "u1")
    await store.forget_job("u1")
    loaded = await store.load()
    assert not loaded.work
    assert not loaded.acks
    assert not loaded.jobs
    assert not loaded.reservations


async def test_a_replica_that_is_not_leader_cannot_write(etcd_endpoint: str, prefix: str) -> None:
    a = await Store.connect([etcd_endpoint], prefix=prefix, hub_id="hub-a")
    b = await Store.connect([etcd_endpoint], prefix=prefix, hub_id="hub-b")
    try:
        leader = await lead(a)
        with pytest.raises(NotLeaderError):
            await b.place(job(), work(), "{}", expect_job_revision=None)
        with pytest.raises(NotLeaderError):
            await b.put_work("m1", work())
        await leader.resign()
        with pytest.raises(NotLeaderError):
            await a.put_work("m1", work())
        assert not (await a.load()).work
    finally:
        await a.close()
        await b.close()


async def test_a_standby_takes_over_when_the_leader_stops_renewing(
    etcd_endpoint: str, prefix: str
) -> None:
    a = await Store.connect([etcd_endpoint], prefix=prefix, hub_id="hub-a")
    b = await Store.connect([etcd_endpoint], prefix=prefix, hub_id="hub-b")
    try:
        await lead(a, ttl=2)
        standby = LeaderElector(b, ttl_s=2)
        campaign = asyncio.create_task(standby.acquire())
        await asyncio.sleep(0.5)
        assert not campaign.done(), "the standby must wait while the leader's lease lives"
        # hub-a never renews (it is "paused"): its lease expires after ~2 s.
        await asyncio.wait_for(campaign, 10)
        assert await b.leader() == "hub-b"
        with pytest.raises(NotLeaderError):
            await a.put_work("m1", work())
        await b.put_work("m1", work())
    finally:
        await a.close()
        await b.close()


async def test_inventory_and_member_meta_round_trip(store: Store) -> None:
    await lead(store)
    nodes = [NodeInventory(name=f"n{i}", nvlink_domain=f"node:n{i}") for i in range(150)]
    by_name = {n.name: n for n in nodes}
    await store.write_nodes("m1", by_name, list(by_name))
    del by_name["n0"], by_name["n1"]
    await store.write_nodes("m1", by_name, ["n0", "n1"])
    await store.put_member_meta("m1", MemberMeta(agent_version="0.1.0", lost_at=5.0))
    loaded = await store.load()
    assert sorted(loaded.nodes["m1"]) == sorted(f"n{i}" for i in range(2, 150))
    assert loaded.members["m1"].lost_at == 5.0


async def test_the_state_epoch_is_written_once_and_changes_when_the_prefix_is_wiped(
    store: Store,
) -> None:
    await lead(store)
    assert (await store.load()).epoch is None  # a new state
    first = await store.ensure_epoch("aaa")
    assert first.startswith("aaa.")
    assert first != "aaa.0"
    assert await store.ensure_epoch("bbb") == first  # written once
    assert (await store.load()).epoch == first
    await store._client.delete(store._k("epoch"))  # the hub's state is lost
    assert (await store.load()).epoch is None
    assert await store.ensure_epoch("ccc") != first


async def test_an_adopted_placement_holds_no_reservation(store: Store) -> None:
    await lead(store)
    ack = AckRecord(revision=0, result="Applied", applied=True)
    rev, job_rev = await store.adopt(job(), work(), ack, expect_job_revision=None)
    assert rev == job_rev > 0
    with pytest.raises(ConflictError):
        await store.adopt(job(cluster="m2"), work(), None, expect_job_revision=None)
    loaded = await store.load()
    assert loaded.jobs["u1"].cluster == "m1"
    assert loaded.acks[("m1", "u1")] == ack
    assert loaded.reservations == {}


async def test_fair_share_history_is_written_by_the_leader_and_loaded_back(store: Store) -> None:
    await lead(store)
    assert (await store.load()).fair_share is None
    record = FairShareRecord(values={"team-a": 28_800.5}, at=1_767_225_600.0)
    await store.put_fair_share(record)
    assert (await store.load()).fair_share == record


async def test_the_recent_nodes_are_written_by_the_leader_and_loaded_back(store: Store) -> None:
    # issue 26: a new leader judges "could ever hold" on the nodes that left within the hour
    await lead(store)
    assert (await store.load()).recent_nodes is None
    node = NodeInventory(name="n1", nvlink_domain="node:n1", allocatable={"nvidia.com/gpu": 8})
    record = RecentNodesRecord(nodes=[RecentNodeRecord(cluster="m1", node=node, left_at=5.0)])
    await store.put_recent_nodes(record)
    assert (await store.load()).recent_nodes == record


async def test_a_preemption_writes_the_hold_and_every_victims_mark_in_one_transaction(
    store: Store,
) -> None:
    await lead(store)
    revs = {}
    for uid in ("v1", "v2"):
        _, revs[uid] = await store.place(job(uid), work(uid), "{}", expect_job_revision=None)
    cause = RequeueCause(kind="Preempted", reason="Preempted", message="m", at=2.0, cluster="m1")
    marked = [(job(u).model_copy(update={"stopping": cause}), revs[u]) for u in ("v1", "v2")]
    # A victim that changed since read: nothing at all is written, not the hold either.
    stale = [marked[0], (marked[1][0], revs["v2"] - 1)]
    with pytest.raises(ConflictError):
        await store.preempt("hi", '{"hold":1}', stale)
    loaded = await store.load()
    assert "hi" not in loaded.reservations
    assert all(loaded.jobs[u].stopping is None for u in ("v1", "v2"))
    rev = await store.preempt("hi", '{"hold":1}', marked)
    loaded = await store.load()
    assert loaded.reservations["hi"] == '{"hold":1}'
    assert all(loaded.jobs[u].stopping == cause for u in ("v1", "v2"))
    assert loaded.job_revisions["v1"] == loaded.job_revisions["v2"] == rev


async def test_the_leader_loads_a_state_larger_than_one_grpc_message(store: Store) -> None:
    """A fleet's stored inventory is far more than gRPC's default 4 MiB message: the load
    reads it in pages (found at 20 x 1,000 nodes: every re-elected hub failed to load its
    state, "Received message larger than max (21167661 vs. 4194304)", and resigned)."""
    await lead(store)
    nodes = [
        NodeInventory(
            name=f"n{i:05d}",
            gpu_product="NVIDIA-H100-80GB-HBM3",
            allocatable={"nvidia.com/gpu": 8},
            labels={f"example.com/pad-{k}": f"{'x' * 55}-{i:05d}" for k in range(12)},
            nvlink_domain=f"node:n{i:05d}",
        )
        for i in range(6_000)
    ]
    stored = sum(len(n.model_dump_json()) for n in nodes)
    first = {n.name: n for n in nodes[:3_000]}
    await store.write_nodes("big", first, list(first))
    every = {n.name: n for n in nodes}
    await store.write_nodes("big", every, [n.name for n in nodes[3_000:]])
    await store.place(job(), work(), "{}", expect_job_revision=None)
    loaded = await store.load()
    assert set(loaded.nodes["big"]) == {n.name for n in nodes}
    assert loaded.nodes["big"]["n05999"] == nodes[-1]
    assert loaded.jobs["u1"].cluster == "m1"
    assert stored > 4 * 1024 * 1024  # more than gRPC's default message
