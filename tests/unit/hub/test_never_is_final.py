"""When "no member could ever hold the job" is final (the job fails) and when it only waits
(gpufed.hub.components.scheduling, ``Scheduler._not_final``): found by the chaos soak, where a
re-run failed for good while the only node of its shape was deleted, and new jobs failed while
the member that holds their shape was down."""

from __future__ import annotations

from gpufed.api.stream import InventoryDelta, InventorySnapshot
from gpufed.api.work import FailureCause, WorkAck, WorkloadStatus
from gpufed.hub.components.config import HubConfig
from tests.unit.hub.builders import hgx_node
from tests.unit.hub.term import Term, running, sent, settle

NODE_LOST = FailureCause(kind="Infrastructure", reason="NodeLost", message="gone", nodes=("m1-n0",))


async def _cycle(t: Term, uid: str) -> None:
    t.ctrl.state.want(uid)
    await t.ctrl.scheduler.cycle()
    await settle()


async def test_a_new_job_no_member_can_ever_hold_fails() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    await t.submit("huge", "u1", gpus=64)
    await _cycle(t, "u1")
    assert t.ctrl.state.jobs["u1"].status.phase == "Failed"


async def test_a_rerun_whose_only_fitting_node_is_gone_waits_instead_of_failing() -> None:
    t, s, rev = await running()
    failed = WorkloadStatus(job_uid="u1", revision=rev, phase="Failed", failure=NODE_LOST)
    await t.ctrl.handle(s, failed)
    await settle()
    [(_, _, del_rev)] = [x for x in sent(s) if x[0] == "delete"]
    await t.ctrl.handle(s, WorkAck(job_uid="u1", revision=del_rev, result="Deleted"))
    await settle()
    # Both 8-GPU nodes gone: only a 4-GPU node is left, no member could ever hold 8 GPUs now.
    m1 = t.ctrl.state.members["m1"]
    small = hgx_node("m1-n2").model_copy(update={"allocatable": {"nvidia.com/gpu": 4}})
    t.ctrl.members.on_snapshot(m1, InventorySnapshot(seq=9, nodes=(small,)))
    await settle()
    t.clock.advance(3600)  # past the re-run's backoff
    await _cycle(t, "u1")
    job = t.ctrl.state.jobs["u1"]
    assert job.status.phase == "Pending", job.status
    assert "placed before" in (job.status.message or "")
    # The node comes back: the re-run is placed.
    t.ctrl.members.on_snapshot(m1, InventorySnapshot(seq=10, nodes=(small, hgx_node("m1-n0"))))
    await _cycle(t, "u1")
    assert t.ctrl.state.jobs["u1"].placed_cluster == "m1"


async def test_a_new_job_waits_while_a_member_is_not_ready() -> None:
    lease = 40.0
    t = Term(config=HubConfig(insecure=True, member_lease_s=lease, member_lost_s=600.0))
    t.member("m1", hgx_node("m1-n0"))
    t.member("m2", hgx_node("m2-n0"))
    t.connect("m1")
    t.connect("m2")
    t.clock.advance(lease + 1)
    t.ctrl.heard(t.ctrl.state.members["m1"].session)  # type: ignore[arg-type]
    await t.ctrl.members.check_health()
    assert t.ctrl.state.members["m2"].health == "NotReady"
    await t.submit("huge", "u1", gpus=64)
    await _cycle(t, "u1")
    job = t.ctrl.state.jobs["u1"]
    assert job.status.phase == "Pending"
    assert "m2 not Ready" in (job.status.message or "")


async def test_a_new_job_waits_while_the_only_nodes_of_its_shape_are_away_for_a_while() -> None:
    # issue 26 (chaos soak): new jobs failed for good while both GB200 trays (or the only MIG
    # node) were deleted for a minute. Nodes that left within the hour count for "could ever
    # hold"; a job no node of the last hour could hold still fails at once.
    t = Term()
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1").model_copy(
        update={"allocatable": {"nvidia.com/gpu": 4}}))  # fmt: skip
    m1 = t.ctrl.state.members["m1"]
    t.ctrl.members.on_delta(m1, InventoryDelta(seq=2, removed=("m1-n0",)))  # the 8-GPU node
    await settle()
    await t.submit("eight", "u1", gpus=8)
    await _cycle(t, "u1")
    job = t.ctrl.state.jobs["u1"]
    assert job.status.phase == "Pending", job.status
    assert "m1/m1-n0" in (job.status.message or ""), job.status.message
    await t.submit("huge", "u2", gpus=64)  # more than any node of the last hour
    await _cycle(t, "u2")
    assert t.ctrl.state.jobs["u2"].status.phase == "Failed"
    # the node comes back: the job is placed
    t.ctrl.members.on_delta(m1, InventoryDelta(seq=3, upserts=(hgx_node("m1-n0"),)))
    await _cycle(t, "u1")
    assert t.ctrl.state.jobs["u1"].placed_cluster == "m1"


async def test_a_node_away_for_longer_than_the_window_no_longer_holds_new_jobs_back() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1").model_copy(
        update={"allocatable": {"nvidia.com/gpu": 4}}))  # fmt: skip
    m1 = t.ctrl.state.members["m1"]
    t.ctrl.members.on_delta(m1, InventoryDelta(seq=2, removed=("m1-n0",)))
    await settle()
    t.clock.advance(3601)
    await t.submit("eight", "u1", gpus=8)
    await _cycle(t, "u1")
    assert t.ctrl.state.jobs["u1"].status.phase == "Failed"


async def test_gpus_withdrawn_from_the_only_fitting_node_make_a_new_job_wait() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    m1 = t.ctrl.state.members["m1"]
    withdrawn = hgx_node("m1-n0").model_copy(update={"allocatable": {"nvidia.com/gpu": 0}})
    t.ctrl.members.on_delta(m1, InventoryDelta(seq=2, upserts=(withdrawn,)))
    await settle()
    await t.submit("eight", "u1", gpus=8)
    await _cycle(t, "u1")
    job = t.ctrl.state.jobs["u1"]
    assert job.status.phase == "Pending", job.status
    assert "left or shrank" in (job.status.message or "")


async def test_a_new_leader_knows_the_nodes_that_left_before_it_led() -> None:
    # The 30-minute soak (seed 2): a MIG job waited while the only MIG node was deleted, then
    # the leader was killed and the new one, not knowing the node, failed it. The remembered
    # nodes are saved in etcd and a new leader starts from them.
    t = Term()
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1").model_copy(
        update={"allocatable": {"nvidia.com/gpu": 4}}))  # fmt: skip
    t.ctrl.members.on_delta(t.ctrl.state.members["m1"], InventoryDelta(seq=2, removed=("m1-n0",)))
    await settle()
    t.store.calls.clear()
    await t.ctrl.flush_inventories()
    # the memory of the node is in etcd before its departure is (a leader dying in between
    # must not leave its successor neither)
    assert t.store.calls.index("put_recent_nodes") < t.store.calls.index("write_nodes")
    saved = t.store.recent_nodes
    assert saved is not None
    assert [(r.cluster, r.node.name) for r in saved.nodes] == [("m1", "m1-n0")]
    t.clock.advance(60)
    t2 = Term(store=t.store, kube=t.kube, clock=t.clock)
    await t2.ctrl.load()
    t2.member("m1", hgx_node("m1-n1").model_copy(update={"allocatable": {"nvidia.com/gpu": 4}}))
    await t2.submit("eight", "u1", gpus=8)
    await _cycle(t2, "u1")
    job = t2.ctrl.state.jobs["u1"]
    assert job.status.phase == "Pending", job.status
    assert "m1/m1-n0 (60 s ago)" in (job.status.message or "")
