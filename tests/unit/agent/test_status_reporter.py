"""The agent's status reporter (gpufed.agent.status) fed by informer events: what is sent,
when, and what is not sent again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpufed.agent import status as status_mod
from gpufed.agent.status import StatusReporter, _ObjectEvents, _PodEvents
from gpufed.api.work import WorkloadStatus
from gpufed.sync.apply import ObjectRef

JOB = ObjectRef("batch/v1", "Job", "team-a", "train")


def job(status: dict[str, Any], uid: str = "u1") -> dict[str, Any]:
    return {
        "metadata": {"name": "train", "namespace": "team-a", "labels": {"gpufed.io/job-uid": uid}},
        "status": status,
    }


def pod(name: str, phase: str, uid: str = "u1") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team-a", "labels": {"gpufed.io/job-uid": uid}},
        "spec": {"nodeName": "n1"},
        "status": {"phase": phase},
    }


class Sent:
    def __init__(self) -> None:
        self.items: list[WorkloadStatus] = []
        self.connected = True

    def __call__(self, s: WorkloadStatus) -> bool:
        if self.connected:
            self.items.append(s)
        return self.connected


def reporter() -> tuple[StatusReporter, Sent, _ObjectEvents, _PodEvents]:
    sent = Sent()
    r = StatusReporter(None, send=sent)  # type: ignore[arg-type]
    r._informers["Job.batch"] = None  # type: ignore[assignment]  # the kind is watched
    return r, sent, _ObjectEvents(r, "Job.batch"), _PodEvents(r)


def test_nothing_is_sent_until_the_applied_object_is_observed() -> None:
    r, sent, jobs, pods = reporter()
    r.track("u1", revision=1, main=JOB)
    r.flush()
    assert sent.items == []
    jobs.upsert(job({"active": 1}))
    pods.upsert(pod("p0", "Running"))
    r.flush()
    assert [(s.phase, s.active, s.nodes) for s in sent.items] == [("Running", 1, ("n1",))]


def test_unchanged_summaries_are_not_resent_but_are_after_a_reconnect() -> None:
    r, sent, jobs, pods = reporter()
    r.track("u1", revision=1, main=JOB)
    jobs.upsert(job({"active": 1}))
    pods.upsert(pod("p0", "Running"))
    r.flush()
    jobs.upsert(job({"active": 1}))  # e.g. a resourceVersion bump only
    r.flush()
    assert len(sent.items) == 1
    sent.connected = False
    jobs.upsert(
        job({"active": 0, "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})
    )
    r.flush()  # lost: not connected
    sent.connected = True
    r.resend_all()
    r.flush()
    assert [s.phase for s in sent.items] == ["Running", "Succeeded"]


def test_a_seen_object_that_disappears_is_missing_and_untracked_jobs_are_silent() -> None:
    r, sent, jobs, _pods = reporter()
    r.track("u1", revision=2, main=JOB)
    r.track("other", revision=1, main=ObjectRef("batch/v1", "Job", "team-a", "x"))
    r.untrack("other")
    jobs.upsert(job({"active": 1}))
    r.flush()
    jobs.delete(job({}))
    r.flush()
    assert [(s.job_uid, s.phase, s.revision) for s in sent.items] == [
        ("u1", "Pending", 2),
        ("u1", "Missing", 2),
    ]


def test_relist_drops_pods_that_vanished() -> None:
    r, _sent, jobs, pods = reporter()
    r.track("u1", revision=1, main=JOB)
    jobs.upsert(job({"active": 2}))
    pods.upsert(pod("p0", "Running"))
    pods.upsert(pod("p1", "Running"))
    pods.begin_relist()
    pods.upsert(pod("p1", "Running"))
    pods.end_relist()
    assert list(r._pods["u1"]) == ["team-a/p1"]


async def test_a_crashed_informer_stops_the_reporter(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(self: Any) -> None:
        raise RuntimeError("informer bug")

    monkeypatch.setattr(status_mod.Informer, "run", broken)
    r = StatusReporter(None, send=Sent())  # type: ignore[arg-type]
    await r.watch_kinds([])  # starts the pod informer
    with pytest.raises(RuntimeError, match="informer bug"):
        await asyncio.wait_for(r.run(), 5)


def test_a_deleted_node_under_a_running_pod_is_reported_as_infrastructure_and_sticks() -> None:
    """The node of a running pod vanishes: the next status carries an Infrastructure cause
    naming it; once the pod is GC'd and replaced by a Pending one, the cause is still sent."""
    health = {"n1": status_mod.NodeHealth(ready=True, gpus=8)}
    sent = Sent()
    r = StatusReporter(None, send=sent, node_health=health.get)  # type: ignore[arg-type]
    r._informers["Job.batch"] = None  # type: ignore[assignment]
    jobs, pods = _ObjectEvents(r, "Job.batch"), _PodEvents(r)
    r.track("u1", revision=1, main=JOB)
    jobs.upsert(job({"active": 1}))
    pods.upsert(pod("p0", "Running"))
    r.flush()
    assert sent.items[-1].failure is None
    del health["n1"]
    r.node_changed("n1")
    r.flush()
    cause = sent.items[-1].failure
    assert cause is not None
    assert (cause.kind, cause.reason, cause.nodes) == (
        "Infrastructure",
        "NodeLost",
        ("n1",),
    )
    pods.delete(pod("p0", "Running"))
    pods.upsert({**pod("p1", "Pending"), "spec": {}})
    r.flush()
    assert sent.items[-1].failure == cause


def test_pods_of_a_previous_attempt_do_not_break_the_new_copy() -> None:
    """Attempt 1's pod still terminates on its deleted node when attempt 2 (same Job name)
    is applied: attempt 2's status leaves it out, so it is not reported NodeLost again."""
    health = {"n2": status_mod.NodeHealth(ready=True, gpus=8)}
    sent = Sent()
    r = StatusReporter(None, send=sent, node_health=health.get)  # type: ignore[arg-type]
    r._informers["Job.batch"] = None  # type: ignore[assignment]
    jobs, pods = _ObjectEvents(r, "Job.batch"), _PodEvents(r)
    old = pod("p-old", "Running")  # on n1, which is gone
    old["metadata"]["annotations"] = {"gpufed.io/attempt": "1"}
    new = {**pod("p-new", "Running"), "spec": {"nodeName": "n2"}}
    new["metadata"] = {**new["metadata"], "annotations": {"gpufed.io/attempt": "2"}}
    r.track("u1", revision=5, main=JOB, attempt="2")
    jobs.upsert(job({"active": 1}))
    pods.upsert(old)
    pods.upsert(new)
    r.flush()
    assert sent.items[-1].failure is None
    assert sent.items[-1].nodes == ("n2",)
