"""The agent's garbage collection is guarded by the hub state epoch (gpufed.agent.held): a
desired set from a hub whose etcd state was lost or replaced deletes nothing at once; the
objects are held for the eviction grace period, a desired set that names the job claims them
(re-stamped, never re-created), and an explicit Delete still deletes at once."""

from __future__ import annotations

from typing import Any

from gpufed.agent.held import EpochGuard, epoch_of, held_jobs
from gpufed.agent.work import WorkManager
from gpufed.api.work import WorkAck

from .builders import apply_item, config_map, delete_item, gpu_job
from .fakes import MemoryCluster, RecordingStatus


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Harness:
    def __init__(self, grace_s: float = 3600.0) -> None:
        self.api = MemoryCluster()
        self.acks: list[WorkAck] = []
        self.clock = Clock()
        self.work = WorkManager(
            self.api,
            ack=self.acks.append,
            status=RecordingStatus(),
            guard=EpochGuard(grace_s, clock=self.clock),
        )

    def jobs(self) -> dict[str, dict[str, Any]]:
        return {r.name: o for r, o in self.api.objects.items() if r.kind == "Job"}

    def job_objects(self) -> dict[Any, dict[str, Any]]:
        """The member's objects but the agent's workload grants (RoleBindings, never deleted)."""
        return {r: o for r, o in self.api.objects.items() if r.kind != "RoleBinding"}

    async def reconcile(self, epoch: str, *items: Any) -> None:
        self.work.connected(epoch)
        self.work.desired_part(list(items), final=True)
        await self.work.idle()


def u1(revision: int, **kw: Any) -> Any:
    return apply_item("u1", revision, gpu_job("u1", "job-u1"), config_map("u1"), **kw)


def u2(revision: int, **kw: Any) -> Any:
    return apply_item("u2", revision, gpu_job("u2", "job-u2"), config_map("u2", "c2"), **kw)


async def running(h: Harness, epoch: str = "epoch-1") -> dict[str, str]:
    """Two jobs applied under ``epoch``; returns their Job names -> member UIDs."""
    await h.reconcile(epoch, u1(5), u2(6))
    return {n: o["metadata"]["uid"] for n, o in h.jobs().items()}


async def test_applied_objects_carry_the_hub_epoch() -> None:
    h = Harness()
    await running(h)
    assert {epoch_of(o) for o in h.jobs().values()} == {"epoch-1"}


async def test_an_empty_desired_set_of_the_same_epoch_still_deletes_at_once() -> None:
    """The hub that applied them no longer wants them (a fenced copy, a job deleted meanwhile)."""
    h = Harness()
    await running(h)
    await h.reconcile("epoch-1")
    assert h.job_objects() == {}


async def test_an_empty_desired_set_of_a_new_epoch_deletes_nothing_until_the_grace_ends() -> None:
    """The headline: a hub with wiped etcd sends an empty desired set; nothing dies."""
    h = Harness(grace_s=3600)
    before = await running(h)
    await h.reconcile("epoch-2")
    assert {n: o["metadata"]["uid"] for n, o in h.jobs().items()} == before
    assert h.work.guard.held == ["u1", "u2"]
    assert [op for op, _ in h.api.calls].count("delete") == 0
    h.clock.now += 3599
    await h.reconcile("epoch-2")
    assert set(h.jobs()) == {"job-u1", "job-u2"}
    h.clock.now += 2  # unclaimed for the whole grace period: evicted
    await h.reconcile("epoch-2")
    assert h.job_objects() == {}
    assert h.work.guard.held == []


async def test_objects_without_an_epoch_are_held_too() -> None:
    """Applied by an agent from before epochs: unknown, so not deleted at once."""
    h = Harness()
    h.api.namespaces["team-a"] = {}
    h.api.put(
        {**config_map("old"), "metadata": {**config_map("old")["metadata"], "namespace": "team-a"}}
    )
    await h.reconcile("epoch-1")
    assert len(h.job_objects()) == 1
    assert h.work.guard.held == ["old"]


async def test_a_desired_set_of_the_new_epoch_adopts_without_recreating_or_patching() -> None:
    h = Harness()
    before = await running(h)
    # The new hub state counts revisions from 1 again: lower than what this agent saw.
    await h.reconcile("epoch-2", u1(2, applied_before=True), u2(3, applied_before=True))
    assert {n: o["metadata"]["uid"] for n, o in h.jobs().items()} == before
    # A batch Job is create-only: adopted untouched, its annotation still the old epoch's.
    assert {epoch_of(o) for o in h.jobs().values()} == {"epoch-1"}
    assert not [what for op, what in h.api.calls if op in ("apply", "patch") and "job-" in what]
    creates = [what for op, what in h.api.calls if op == "create" and "job-" in what]
    assert len(creates) == 2  # the two creates of the first epoch, none since
    assert {(a.job_uid, a.revision, a.result) for a in h.acks[-2:]} == {
        ("u1", 2, "Applied"),
        ("u2", 3, "Applied"),
    }
    assert h.work.guard.held == []
    # Claimed under the current epoch: a later desired set without them deletes at once.
    await h.reconcile("epoch-2", u2(3, applied_before=True))
    assert set(h.jobs()) == {"job-u2"}


async def test_an_explicit_delete_of_a_held_job_deletes_at_once() -> None:
    h = Harness()
    await running(h)
    await h.reconcile("epoch-2")
    h.work.submit(delete_item("u1", 1))
    await h.work.idle()
    assert set(h.jobs()) == {"job-u2"}
    assert h.acks[-1] == WorkAck(job_uid="u1", revision=1, result="Deleted")


async def test_held_jobs_report_one_entry_per_job_with_its_epoch_and_workload() -> None:
    h = Harness()
    await running(h)
    held = await h.work.held_jobs()
    assert [(j.job_uid, j.hub_epoch, j.kind, j.name, j.namespace) for j in held] == [
        ("u1", "epoch-1", "Job.batch", "job-u1", "team-a"),
        ("u2", "epoch-1", "Job.batch", "job-u2", "team-a"),
    ]
    assert held_jobs([]) == []
