"""The agent's work manager (gpufed.agent.work) over an in-memory member: acks per revision,
stale revisions, refusals, deletes, and the reconcile after a reconnect."""

from __future__ import annotations

import pytest

from gpufed.agent.work import WorkManager
from gpufed.api.work import WorkAck
from gpufed.sync.apply import ref_of

from .builders import apply_item, config_map, delete_item, gpu_job
from .fakes import FakeApiError, MemoryCluster, RecordingStatus


class Harness:
    def __init__(self) -> None:
        self.api = MemoryCluster()
        self.acks: list[WorkAck] = []
        self.status = RecordingStatus()
        self.work = WorkManager(self.api, ack=self.acks.append, status=self.status)

    def job_names(self) -> set[str]:
        return {r.name for r in self.api.objects if r.kind == "Job"}

    def grant_creates(self) -> int:
        """POSTs of the agent's workload grant (a RoleBinding per namespace)."""
        return sum(op == "create" and what.startswith("RoleBinding") for op, what in self.api.calls)

    def object_creates(self) -> int:
        """POSTs of a job's own objects."""
        return [op for op, _ in self.api.calls].count("create") - self.grant_creates()


async def test_apply_creates_namespace_and_objects_then_acks_the_revision() -> None:
    h = Harness()
    h.work.submit(apply_item("u1", 1, config_map("u1"), gpu_job("u1", "job-u1")))
    await h.work.idle()
    assert h.acks == [WorkAck(job_uid="u1", revision=1, result="Applied")]
    assert h.api.namespaces["team-a"]["metadata"]["labels"] == {"gpufed.io/managed": "true"}
    assert h.job_names() == {"job-u1"}
    revision, main, missing = h.status.tracked["u1"]
    assert (revision, main.name if main else None, missing) == (1, "job-u1", False)


async def test_same_revision_is_idempotent_and_older_revisions_are_ignored() -> None:
    h = Harness()
    h.work.submit(apply_item("u1", 5))
    await h.work.idle()
    h.work.submit(apply_item("u1", 5))
    h.work.submit(apply_item("u1", 4))
    await h.work.idle()
    assert [a.revision for a in h.acks] == [5, 5]
    assert h.object_creates() == 1


async def test_refused_manifest_is_acked_failed_not_retryable() -> None:
    h = Harness()
    h.work.submit(apply_item("u1", 1, gpu_job("u1", namespace="kube-system")))
    await h.work.idle()
    (ack,) = h.acks
    assert (ack.result, ack.retryable) == ("Failed", False)
    assert "differs from the job namespace" in ack.message
    assert not h.api.objects


async def test_member_rejection_is_acked_with_the_api_message_once() -> None:
    h = Harness()
    h.api.refuse["job-u1"] = FakeApiError(422, 'Job.batch "job-u1" is invalid: spec.template')
    h.work.submit(apply_item("u1", 1))
    await h.work.idle()
    (ack,) = h.acks
    assert (ack.result, ack.retryable) == ("Failed", False)
    assert ack.message == 'Job.batch "job-u1" is invalid: spec.template'
    assert h.object_creates() == 1  # not retried


async def test_unavailable_member_is_acked_failed_retryable_after_bounded_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("gpufed.sync.retry.backoff_seconds", lambda *a, **k: 0.0)
    h = Harness()
    h.api.fail_next = [FakeApiError(503, "apiserver is shutting down")] * 50
    h.work.submit(apply_item("u1", 1))
    await h.work.idle()
    (ack,) = h.acks
    assert (ack.result, ack.retryable) == ("Failed", True)
    assert len(h.api.calls) < 10


async def test_delete_removes_labelled_objects_and_acks_deleted() -> None:
    h = Harness()
    h.work.submit(apply_item("u1", 1, config_map("u1"), gpu_job("u1", "job-u1")))
    h.work.submit(apply_item("u2", 1))
    await h.work.idle()
    h.work.submit(delete_item("u1", 2))
    await h.work.idle()
    assert h.acks[-1] == WorkAck(job_uid="u1", revision=2, result="Deleted")
    assert h.job_names() == {"job-u2"}
    assert not any(r.kind == "ConfigMap" for r in h.api.objects)
    assert "u1" in h.status.untracked
    # An Apply older than the Delete arriving late changes nothing.
    h.work.submit(apply_item("u1", 1))
    await h.work.idle()
    assert h.job_names() == {"job-u2"}


async def test_reconcile_adopts_creates_keeps_finished_and_deletes_orphans() -> None:
    h = Harness()
    h.api.namespaces["team-a"] = {}
    for uid in ("running", "finished", "orphan"):
        h.api.put(
            {
                **gpu_job(uid, f"job-{uid}"),
                "metadata": {**gpu_job(uid, f"job-{uid}")["metadata"], "namespace": "team-a"},
            }
        )
    h.api.put(
        {
            **config_map("orphan"),
            "metadata": {**config_map("orphan")["metadata"], "namespace": "team-a"},
        }
    )
    h.work.connected()
    h.work.desired_part([apply_item("running", 3, applied_before=True)], final=False)
    h.work.desired_part(
        [
            apply_item("finished", 2, applied_before=True),
            apply_item("new", 1),
            apply_item("gone", 4, applied_before=True),
        ],
        final=True,
    )
    await h.work.idle()
    assert h.job_names() == {"job-running", "job-finished", "job-new"}
    assert not any(r.kind == "ConfigMap" for r in h.api.objects)  # the orphan's too
    acked = {(a.job_uid, a.revision, a.result) for a in h.acks}
    assert acked == {("running", 3, "Applied"), ("finished", 2, "Applied"), ("new", 1, "Applied")}
    # Applied before and gone: never re-created, reported Missing, not acked.
    assert h.status.tracked["gone"][2] is True
    assert [op for op, what in h.api.calls if op == "create" and "job-gone" in what] == []


async def test_a_job_applied_by_this_agent_is_not_recreated_after_it_vanished() -> None:
    h = Harness()
    h.work.submit(apply_item("u1", 1))
    await h.work.idle()
    job_ref = next(r for r in h.api.objects if r.kind == "Job")
    del h.api.objects[job_ref]  # deleted in the member by someone
    h.work.submit(apply_item("u1", 2))  # hub did not set applied_before (it had no ack yet)
    await h.work.idle()
    assert h.job_names() == set()
    assert h.status.tracked["u1"][2] is True
    assert [a.revision for a in h.acks] == [1]


async def test_object_of_another_live_job_with_the_same_name_fails_for_good() -> None:
    h = Harness()
    h.work.submit(apply_item("old", 1, gpu_job("old", "train")))
    await h.work.idle()
    h.work.submit(apply_item("new", 1, gpu_job("new", "train")))
    await h.work.idle()
    ack = h.acks[-1]
    assert (ack.job_uid, ack.result, ack.retryable) == ("new", "Failed", False)
    assert "belongs to job 'old' of this hub" in ack.message
    owner = h.api.objects[
        ref_of({**gpu_job("old", "train"), "metadata": {"name": "train", "namespace": "team-a"}})
    ]
    assert owner["metadata"]["labels"]["gpufed.io/job-uid"] == "old"


async def test_disconnect_drops_queued_work() -> None:
    h = Harness()
    h.work.submit(apply_item("u1", 1))
    h.work.disconnected()  # before the worker ran
    await h.work.idle()
    assert h.acks == []
    assert h.job_names() == set()


async def test_jobs_the_hub_no_longer_has_are_forgotten_after_a_desired_set() -> None:
    h = Harness()
    h.work.submit(apply_item("kept", 1))
    h.work.submit(apply_item("dropped", 1))
    await h.work.idle()
    h.work.connected()
    h.work.desired_part([apply_item("kept", 1, applied_before=True)], final=True)
    await h.work.idle()
    assert h.work.job_revision("kept") == 1
    assert h.work.job_revision("dropped") == 0
    assert h.job_names() == {"job-kept"}  # the dropped job's objects were orphans


async def test_the_namespace_is_read_once_and_recreated_when_deleted_meanwhile() -> None:
    h = Harness()
    for uid in ("u1", "u2", "u3"):
        h.work.submit(apply_item(uid))
    await h.work.idle()
    ops = [op for op, _ in h.api.calls]
    assert ops.count("get_namespace") == 1  # one read for three jobs in team-a
    assert h.object_creates() == 3  # and one request per new Job
    assert h.grant_creates() == 1  # and the namespace's workload grant, once
    del h.api.namespaces["team-a"]  # an operator deleted it in the member
    h.work.submit(apply_item("u4"))
    await h.work.idle()
    assert h.acks[-1] == WorkAck(job_uid="u4", revision=1, result="Applied")
    assert h.api.namespaces["team-a"]["metadata"]["labels"] == {"gpufed.io/managed": "true"}
    assert "job-u4" in h.job_names()
    assert h.grant_creates() == 2  # the new namespace has its grant again


async def test_the_jobs_node_grace_reaches_the_status_reporter() -> None:
    """spec.placement.retry.nodeNotReadySeconds travels as the gpufed.io/node-not-ready-seconds
    annotation of the job's objects; absent, the reporter waits Kubernetes' 300 s."""
    h = Harness()
    quick = gpu_job("u1", "job-u1")
    quick["metadata"].setdefault("annotations", {})["gpufed.io/node-not-ready-seconds"] = "30"
    h.work.submit(apply_item("u1", 1, quick))
    h.work.submit(apply_item("u2", 1, gpu_job("u2", "job-u2")))
    await h.work.idle()
    assert h.status.grace == {"u1": 30, "u2": 300}


async def test_a_forbidden_apply_is_retried_for_the_grace_period_then_refused_with_the_fix() -> (
    None
):
    # issue 26: right after a member API server restart it forbade the agent everything for a
    # while (no RBAC suffix), and the job failed for good at its first 403.
    from gpufed.sync.retry import ForbiddenGrace

    clock = [500.0]
    h = Harness()
    h.work = WorkManager(
        h.api,
        ack=h.acks.append,
        status=h.status,
        member="m1",
        forbidden=ForbiddenGrace(60.0, clock=lambda: clock[0]),
    )
    denied = 'jobs.batch is forbidden: User "agent" cannot create resource "jobs"'
    h.api.refuse["job-u1"] = FakeApiError(403, denied)
    h.work.submit(apply_item("u1", 1))
    await h.work.idle()
    clock[0] += 30
    h.work.submit(apply_item("u1", 2))  # the hub sends it again after its backoff
    await h.work.idle()
    first, second = h.acks
    assert (first.result, first.retryable) == ("Failed", True)
    assert (second.result, second.retryable) == ("Failed", True)
    assert second.message.startswith(denied)
    assert "forbidden for 30 s" in second.message
    clock[0] += 31  # 61 s since the first 403: a grant that stays missing
    h.work.submit(apply_item("u1", 3))
    await h.work.idle()
    third = h.acks[-1]
    assert (third.result, third.retryable) == ("Failed", False)
    assert "forbidden for 61 s" in third.message
    assert "grant the agent's ServiceAccount this right in member m1" in third.message
    # the grant is given: the job applies, and its period is over
    del h.api.refuse["job-u1"]
    h.work.submit(apply_item("u1", 4))
    await h.work.idle()
    assert h.acks[-1].result == "Applied"
    assert h.work._forbidden.forbidden_for("u1") is None
