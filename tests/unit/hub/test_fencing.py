"""Fenced writes (issue 10 item 8): a hub replica that no longer leads writes nothing to the hub
API, a status computed from an older view never overwrites a newer one, and the leader corrects
what it finds overwritten (level-triggered).

- The fence: :meth:`gpufed.hub.components.term.Term.check_fence` before every status write and Event,
  false once the leader lease is not known to be held (:meth:`LeaderElector.holds`).
- The precondition: every status write carries the resourceVersion the term last saw; a 409
  re-reads and writes again, behind the fence again.
- The resync: :meth:`gpufed.hub.components.mirror.Mirror.resync_jobs`.

Two Controllers over one FakeHubAPI play the ex-leader and the new leader.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpufed.api.labels import FINALIZER
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.adapters.store import NotLeaderError
from gpufed.hub.components.config import HubConfig
from gpufed.hub.components.core import Controller
from gpufed.hub.components.metrics import HubMetrics
from gpufed.hub.components.term import JobState
from gpufed.hub.edge.leader import LeaderElector
from gpufed.hub.rules import status as st
from tests.unit.hub.builders import gpujob_obj, membercluster_obj
from tests.unit.hub.fakes import FakeHubAPI, FakeStore, TermClock


@dataclass
class Lease:
    """What the term's fence answers: ``held``, except that the next checks answer ``then``
    (one per check, first to last)."""

    held: bool
    then: list[bool] = field(default_factory=list)

    def __call__(self) -> bool:
        return self.then.pop(0) if self.then else self.held


def term(kube: FakeHubAPI, leading: Lease) -> Controller:
    """A controller whose fence is ``leading``."""
    clock = TermClock()
    ctrl = Controller(
        HubConfig(insecure=True, status_hold_s=0),  # writes at once: these tests are about fences
        store=FakeStore(),
        kube=kube,
        metrics=HubMetrics(),
        mono=clock.mono,
        wall=clock.wall,
        leading=leading,
    )
    # The builders' namespace, as the Namespace watch shows it (no Pod Security label).
    ctrl.intake.namespaces.seen("team-a", {})
    ctrl.mirror.start()
    return ctrl


def one_job(lease: Lease) -> tuple[FakeHubAPI, Controller, JobState]:
    """One GPUJob on the hub API, seen by one term's watch."""
    kube = FakeHubAPI()
    kube.objects["gpujobs"].append(gpujob_obj())
    ctrl = term(kube, lease)
    return kube, ctrl, seen(ctrl, kube.objects["gpujobs"][0])


def seen(ctrl: Controller, obj: dict[str, Any]) -> JobState:
    """The GPUJob watch delivered ``obj`` (a copy, as a watch event is) to ``ctrl``."""
    ctrl.intake.on_job_event(WatchEvent("MODIFIED", _copy(obj)))
    return ctrl.state.jobs[obj["metadata"]["uid"]]


def _copy(obj: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(obj)


def shown(kube: FakeHubAPI) -> dict[str, Any]:
    return dict(kube.objects["gpujobs"][0].get("status") or {})


async def drained(*ctrls: Controller) -> None:
    for _ in range(3):
        for c in ctrls:
            await asyncio.wait_for(c.mirror.jobs.drained(), 5)
        await asyncio.sleep(0)


def placed(job: JobState, cluster: str, ctrl: Controller) -> None:
    ctrl.mirror.set_status(job, st.resumed(job.status, cluster=cluster, gpus=8, now="t"))


async def test_a_replica_that_lost_its_lease_writes_no_status_and_no_event() -> None:
    # The lease deadline passed (paused, or cut off from etcd).
    kube, ctrl, job = one_job(Lease(held=False))

    placed(job, "m1", ctrl)
    ctrl.mirror.event(job, "Normal", "Placed", "on m1")
    await asyncio.sleep(0)
    await asyncio.sleep(0)

    assert kube.requests["patch_job_status"] == 0
    assert kube.requests["emit_event"] == 0
    assert ctrl.metrics.status_writes.labels("job", "fenced")._value.get() >= 1
    await ctrl.mirror.stop()


async def test_a_stopped_term_writes_no_status_and_no_event_while_its_lease_is_held() -> None:
    # The term ended (another leader in etcd, a bug) before the lease ran out.
    kube, ctrl, job = one_job(Lease(held=True))
    ctrl.stop("another leader")

    placed(job, "m1", ctrl)
    ctrl.mirror.event(job, "Normal", "Placed", "on m1")
    await asyncio.sleep(0)
    await asyncio.sleep(0)

    assert kube.requests["patch_job_status"] == 0
    assert kube.requests["emit_event"] == 0
    await ctrl.mirror.stop()


async def test_an_ex_leaders_pending_write_does_not_land_after_the_new_leader_wrote() -> None:
    old_lease = Lease(held=True)
    kube, old, old_job = one_job(old_lease)

    # The ex-leader's lease is gone; the new leader writes what it computed from etcd.
    old_lease.held = False
    new = term(kube, Lease(held=True))
    new_job = seen(new, kube.objects["gpujobs"][0])
    placed(new_job, "m2", new)
    await drained(new)
    assert shown(kube)["cluster"] == "m2"

    # The ex-leader wakes up with a queued status computed from its old view. Worst case:
    # its fence check passed just before the pause, so the write goes out once; by the
    # re-read after the 409 its lease deadline has passed.
    old_lease.then = [True]
    placed(old_job, "m1", old)
    for _ in range(5):
        await asyncio.sleep(0)

    assert shown(kube)["cluster"] == "m2"
    assert old.metrics.status_writes.labels("job", "conflict")._value.get() == 1
    await old.mirror.stop()
    await new.mirror.stop()


async def test_a_conflict_rereads_the_object_and_writes_the_latest_value() -> None:
    kube, ctrl, job = one_job(Lease(held=True))
    kube.bump(kube.objects["gpujobs"][0])  # a user changed a label; the watch did not tell yet

    placed(job, "m1", ctrl)
    await drained(ctrl)

    assert shown(kube)["cluster"] == "m1"
    assert kube.requests["get_job"] == 1
    assert kube.requests["patch_job_status"] == 2


async def test_the_leader_corrects_a_status_someone_else_overwrote() -> None:
    kube, ctrl, job = one_job(Lease(held=True))
    placed(job, "m2", ctrl)
    await drained(ctrl)
    seen(ctrl, kube.objects["gpujobs"][0])  # the watch shows our write

    # A stale write lands (say, an ex-leader's pause came after its last check) ...
    obj = kube.objects["gpujobs"][0]
    obj["status"] = {**obj["status"], "cluster": "m1"}
    kube.bump(obj)
    seen(ctrl, obj)
    assert ctrl.mirror.resync_jobs() == 1
    await drained(ctrl)

    assert shown(kube)["cluster"] == "m2"
    seen(ctrl, kube.objects["gpujobs"][0])
    assert ctrl.mirror.resync_jobs() == 0  # nothing left to correct


async def test_resync_leaves_alone_a_status_the_watch_has_not_shown_yet() -> None:
    kube, ctrl, job = one_job(Lease(held=True))
    placed(job, "m1", ctrl)
    await drained(ctrl)

    # The watch still shows the status before our write: that is lag, not an overwrite.
    assert ctrl.mirror.resync_jobs() == 0
    assert kube.requests["patch_job_status"] == 1


class LeaseStore:
    """The part of Store the elector uses, answering like etcd."""

    hub_id = "hub-a"

    def __init__(self, clock: TermClock) -> None:
        self.clock = clock
        self.ttl_left = 3

    async def grant_lease(self, ttl_s: int) -> object:
        return object()

    async def try_acquire(self, lease: object) -> bool:
        return True

    async def refresh(self, lease: object) -> int:
        self.clock.advance(0.5)  # the round trip
        return self.ttl_left


async def test_the_lease_is_held_until_ttl_after_the_keepalive_was_sent() -> None:
    clock = TermClock()
    store = LeaseStore(clock)
    elector = LeaderElector(store, ttl_s=3, clock=clock.mono)  # type: ignore[arg-type]
    await elector.acquire()
    assert elector.holds()
    clock.advance(2.9)
    assert elector.holds()
    clock.advance(0.2)  # 3.1 s after the grant was sent: etcd may have expired the lease
    assert not elector.holds()


async def test_a_replica_that_lost_its_lease_adds_and_drops_no_finalizer() -> None:
    """The finalizer is a hub API write like a status: behind the fence. Dropping it after the
    lease passed would let the API server delete a GPUJob whose member copy the new leader
    still has to delete."""
    lease = Lease(held=True)
    kube, ctrl, job = one_job(lease)
    assert FINALIZER in job.obj.metadata.finalizers
    lease.held = False
    with pytest.raises(NotLeaderError):
        await ctrl.finalizers.drop_finalizer(job)
    job.obj.metadata.finalizers.remove(FINALIZER)
    with pytest.raises(NotLeaderError):
        await ctrl.finalizers.add_finalizer(job.uid)
    assert kube.requests["set_job_finalizers"] == 0
    lease.held = True  # the same write from a leader goes out
    await ctrl.finalizers.add_finalizer(job.uid)
    assert kube.finalizer_writes == [("team-a", job.obj.metadata.name, [FINALIZER])]
    await ctrl.mirror.stop()


async def test_a_member_status_someone_else_overwrote_is_corrected_by_the_resync() -> None:
    """MemberCluster statuses are level-triggered too: the resync writes again what the watch
    shows changed by someone else (an ex-leader), but not before the watch showed anything
    since our write, and not while a write is pending."""
    kube = FakeHubAPI()
    kube.objects["memberclusters"].append(membercluster_obj("m1"))
    ctrl = term(kube, Lease(held=True))
    ctrl.members.on_event("ADDED", _copy(kube.objects["memberclusters"][0]))
    ctrl.members.write_status(ctrl.state.member("m1"))
    await asyncio.wait_for(ctrl.mirror.members.drained(), 5)
    ours = copy.deepcopy(kube.objects["memberclusters"][0]["status"])
    assert ctrl.mirror.resync_members() == 0, "the watch has shown nothing since our write"

    # An ex-leader's stale write lands: Ready=False; the watch shows it.
    mc = kube.objects["memberclusters"][0]
    stale = copy.deepcopy(ours)
    for c in stale["conditions"]:
        c["status"] = "False" if c["type"] == "Ready" else c["status"]
    mc["status"] = stale
    kube.bump(mc)
    ctrl.members.on_event("MODIFIED", _copy(mc))
    assert ctrl.mirror.resync_members() == 1
    assert ctrl.mirror.resync_members() == 0, "pending: not submitted twice"
    await asyncio.wait_for(ctrl.mirror.members.drained(), 5)
    assert mc["status"] == ours
    assert ctrl.metrics.status_corrections.labels("member")._value.get() == 1
    # Our write's echo: equal to what we wrote, nothing to correct.
    ctrl.members.on_event("MODIFIED", _copy(mc))
    assert ctrl.mirror.resync_members() == 0
    await ctrl.mirror.stop()
