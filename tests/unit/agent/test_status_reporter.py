"""The agent's status reporter (gpufed.agent.status) fed by informer events: what is sent,
when, and what is not sent again."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from gpufed.agent import status as status_mod
from gpufed.agent.status import StatusReporter
from gpufed.agent.status_watch import ObjectEvents as _ObjectEvents
from gpufed.agent.status_watch import PodEvents as _PodEvents
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


# --- a copy deleted in the member: the member's last word counts (issue 24 item 5) ------------

COMPLETE = {
    "active": 0,
    "succeeded": 1,
    "startTime": "2026-01-02T03:00:00Z",
    "completionTime": "2026-01-02T03:04:05Z",
    "conditions": [
        {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached"},
        {"type": "Complete", "status": "True", "reason": "CompletionsReached"},
    ],
}
FAILED = {
    "active": 0,
    "failed": 1,
    "conditions": [
        {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded"},
        {
            "type": "Failed",
            "status": "True",
            "reason": "BackoffLimitExceeded",
            "message": "Job has reached the specified backoff limit",
            "lastTransitionTime": "2026-01-02T03:04:05Z",
        },
    ],
}


def exited(name: str, code: int) -> dict[str, Any]:
    """A failed pod whose container exited with ``code``."""
    p = pod(name, "Failed")
    p["status"]["containerStatuses"] = [
        {"name": "train", "state": {"terminated": {"exitCode": code, "reason": "Error"}}}
    ]
    return p


def test_a_job_deleted_by_its_ttl_controller_after_completing_stays_succeeded() -> None:
    """ttlSecondsAfterFinished: 0 — the Job turns Complete and is deleted within one coalescing
    window, so no Succeeded went out before; the DELETED event's final state is reported, with
    its conditions and times, and stays so as its pods go and the work manager finds it gone."""
    r, sent, jobs, pods = reporter()
    r.track("u1", revision=1, main=JOB)
    jobs.upsert(job({"active": 1}))
    pods.upsert(pod("p0", "Running"))
    r.flush()
    pods.upsert(pod("p0", "Succeeded"))
    jobs.upsert(job(COMPLETE))
    jobs.delete(job(COMPLETE))  # the TTL controller (foreground: pods go with it)
    pods.delete(pod("p0", "Succeeded"))
    r.flush()
    r.track("u1", revision=1, main=JOB, missing=True)  # a reconcile: gone, ran before
    r.flush()
    assert [s.phase for s in sent.items] == ["Running", "Succeeded"]
    done = sent.items[-1]
    assert [c.type for c in done.conditions] == ["SuccessCriteriaMet", "Complete"]
    assert (done.succeeded, done.completion_time) == (1, "2026-01-02T03:04:05Z")
    assert done.nodes == ("n1",)  # the pods as cached when the Job went
    assert r.current("u1") == done


def test_a_failed_job_deleted_in_the_member_stays_failed_with_its_reason() -> None:
    """An application failure deleted by a cleanup policy stays an application failure: Failed
    with BackoffLimitExceeded and the exit code, never Missing (an infrastructure failure)."""
    health = {"n1": status_mod.NodeHealth(ready=True, gpus=8)}
    sent = Sent()
    r = StatusReporter(None, send=sent, node_health=health.get)  # type: ignore[arg-type]
    r._informers["Job.batch"] = None  # type: ignore[assignment]
    jobs, pods = _ObjectEvents(r, "Job.batch"), _PodEvents(r)
    r.track("u1", revision=3, main=JOB)
    jobs.upsert(job({"active": 1}))
    pods.upsert(pod("p0", "Running"))
    r.flush()
    pods.upsert(exited("p0", 3))
    jobs.delete(job(FAILED))  # Failed and deleted before the next flush
    pods.delete(exited("p0", 3))
    r.flush()
    last = sent.items[-1]
    assert (last.phase, last.revision) == ("Failed", 3)
    failed = next(c for c in last.conditions if c.type == "Failed")
    assert (failed.reason, failed.message) == (
        "BackoffLimitExceeded",
        "Job has reached the specified backoff limit",
    )
    assert last.completion_time == "2026-01-02T03:04:05Z"
    assert [i.reason for i in last.pod_issues] == ["Error"]
    assert last.failure is not None
    assert (last.failure.kind, last.failure.exit_codes) == ("Application", (3,))
    assert "Missing" not in [s.phase for s in sent.items]


def test_a_finished_job_gone_at_a_relist_keeps_its_cached_outcome() -> None:
    """The DELETED event was missed (the watch expired, 410) and the re-list no longer shows the
    Job: the last cached state, Complete, is its last word; also when the status could not be
    sent then and goes out after the reconnect, whose reconcile finds the Job gone."""
    r, sent, jobs, _pods = reporter()
    r.track("u1", revision=1, main=JOB)
    jobs.upsert(job({"active": 1}))
    r.flush()
    sent.connected = False  # the hub is away: Succeeded is not delivered
    jobs.upsert(job(COMPLETE))
    r.flush()
    jobs.begin_relist()
    jobs.end_relist()  # gone
    r.flush()
    sent.connected = True
    r.resend_all()
    r.track("u1", revision=1, main=JOB, missing=True)  # the reconcile after the reconnect
    r.flush()
    assert [s.phase for s in sent.items] == ["Pending", "Succeeded"]
    assert sent.items[-1].conditions[-1].type == "Complete"


def test_an_agent_that_never_saw_the_finished_job_reports_it_missing() -> None:
    """After an agent restart the final state is not known (it lived in the old process's
    memory): a Job found gone is Missing, the honest answer. The hub keeps a Succeeded it had
    already received (terminal is final)."""
    r, sent, _jobs, _pods = reporter()
    r.track("u1", revision=1, main=JOB, missing=True)
    r.flush()
    assert [s.phase for s in sent.items] == ["Missing"]


def test_a_job_deleted_while_running_is_still_missing() -> None:
    """Deleted before it finished (DELETED event with a running state, or gone at a re-list):
    Missing, as before."""
    r, sent, jobs, pods = reporter()
    r.track("u1", revision=1, main=JOB)
    jobs.upsert(job({"active": 1}))
    pods.upsert(pod("p0", "Running"))
    r.flush()
    jobs.delete(job({"active": 1}))
    r.flush()
    assert [s.phase for s in sent.items] == ["Running", "Missing"]

    other = ObjectRef("batch/v1", "Job", "team-a", "train")
    r.track("u2", revision=1, main=other)
    jobs.upsert(job({"active": 1}, uid="u2"))
    r.flush()
    jobs.begin_relist()
    jobs.end_relist()
    r.flush()
    assert [(s.job_uid, s.phase) for s in sent.items[2:]] == [("u2", "Pending"), ("u2", "Missing")]


def test_a_job_the_work_manager_finds_gone_before_the_watch_says_so() -> None:
    """The reconcile's read (404) can beat the DELETED event: a cached finished state is the
    last word already (no Missing first, which the hub would make final); a cached running one
    is Missing at once, as before."""
    r, sent, jobs, _pods = reporter()
    r.track("u1", revision=1, main=JOB)
    jobs.upsert(job(COMPLETE))
    r.track("u1", revision=1, main=JOB, missing=True)
    r.flush()
    jobs.delete(job(COMPLETE))
    r.flush()
    assert [s.phase for s in sent.items] == ["Succeeded"]

    r.track("u2", revision=1, main=ObjectRef("batch/v1", "Job", "team-a", "run"))
    jobs.upsert(
        {
            **job({"active": 1}, uid="u2"),
            "metadata": {
                "name": "run",
                "namespace": "team-a",
                "labels": {"gpufed.io/job-uid": "u2"},
            },
        }
    )
    r.track("u2", revision=1, main=ObjectRef("batch/v1", "Job", "team-a", "run"), missing=True)
    r.flush()
    assert [(s.job_uid, s.phase) for s in sent.items[1:]] == [("u2", "Missing")]


@pytest.mark.parametrize(
    ("kind", "final", "phase"),
    [
        (
            "JobSet.jobset.x-k8s.io",
            {"conditions": [{"type": "Completed", "status": "True"}]},
            "Succeeded",
        ),
        (
            "PyTorchJob.kubeflow.org",
            {"conditions": [{"type": "Failed", "status": "True", "reason": "OOM"}]},
            "Failed",
        ),
        (
            "RayJob.ray.io",
            {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"},
            "Succeeded",
        ),
        (
            "JobSet.jobset.x-k8s.io",
            {"conditions": [{"type": "Complete", "status": "True"}]},
            "Missing",
        ),
    ],
)
def test_each_kind_keeps_its_own_terminal_state_when_deleted(
    kind: str, final: dict[str, Any], phase: str
) -> None:
    sent = Sent()
    r = StatusReporter(None, send=sent)  # type: ignore[arg-type]
    r._informers[kind] = None  # type: ignore[assignment]
    objs = _ObjectEvents(r, kind)
    group = kind.split(".", 1)[1]
    r.track("u1", revision=1, main=ObjectRef(f"{group}/v1", kind.split(".")[0], "team-a", "train"))
    objs.upsert(job({}))
    r.flush()
    objs.delete(job(final))
    r.flush()
    assert [s.phase for s in sent.items] == ["Pending", phase]


# --- Kubernetes' timing: a not-Ready node or a GPU drop is a suspicion for the grace period ---

T0 = 1_800_000_000.0  # seconds since the epoch


class Clock:
    """Fake wall clock: tests move it, nothing sleeps."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def watched(
    health: dict[str, Any], *, grace_s: float | None = None
) -> tuple[StatusReporter, Sent, Clock, _PodEvents]:
    """A reporter with one Running job (pod p0 on n1, 8 GPUs seen) and its first status sent."""
    sent, clock = Sent(), Clock()
    r = StatusReporter(None, send=sent, wall=clock, node_health=health.get, coalesce_s=0)  # type: ignore[arg-type]
    r._informers["Job.batch"] = None  # type: ignore[assignment]
    jobs, pods = _ObjectEvents(r, "Job.batch"), _PodEvents(r)
    if grace_s is None:
        r.track("u1", revision=1, main=JOB)
    else:
        r.track("u1", revision=1, main=JOB, node_grace_s=grace_s)
    jobs.upsert(job({"active": 1}))
    pods.upsert(pod("p0", "Running"))
    r.flush()
    assert sent.items[-1].failure is None
    return r, sent, clock, pods


def set_node(r: StatusReporter, health: dict[str, Any], **fields: Any) -> None:
    health["n1"] = status_mod.NodeHealth(**{"ready": True, "gpus": 8, **fields})
    r.node_changed("n1")
    r.recheck()
    r.flush()


def test_a_20s_not_ready_blip_that_recovers_reports_no_failure() -> None:
    """The suspicion is reported as a pod issue while it lasts, then vanishes; past the grace
    period nothing is reported, and nothing sticks."""
    health = {"n1": status_mod.NodeHealth(ready=True, gpus=8)}
    r, sent, clock, _pods = watched(health)
    clock.now = T0 + 5
    set_node(r, health, ready=False, not_ready_since=T0)
    assert sent.items[-1].failure is None
    assert [(i.pod, i.reason) for i in sent.items[-1].pod_issues] == [("p0", "NodeNotReady")]
    # ... and as the job's condition NodeNotReady, True since the node turned not Ready
    [cond] = [c for c in sent.items[-1].conditions if c.type == "NodeNotReady"]
    assert (cond.status, cond.reason) == ("True", "NodeNotReady")
    assert "n1" in cond.message
    assert cond.last_transition_time == datetime.fromtimestamp(T0, UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    clock.now = T0 + 20
    set_node(r, health)  # Ready again
    assert sent.items[-1].pod_issues == ()
    assert not [c for c in sent.items[-1].conditions if c.type == "NodeNotReady"]
    clock.now = T0 + 400
    r.recheck()
    r.flush()
    assert all(s.failure is None for s in sent.items)
    assert r._tracked["u1"].trouble.failure is None


def test_not_ready_past_300s_fails_with_node_not_ready_and_sticks() -> None:
    health = {"n1": status_mod.NodeHealth(ready=True, gpus=8)}
    r, sent, clock, _pods = watched(health)
    clock.now = T0 + 10
    set_node(r, health, ready=False, not_ready_since=T0)
    clock.now = T0 + 299
    r.recheck()
    r.flush()
    assert all(s.failure is None for s in sent.items)
    clock.now = T0 + 300
    r.recheck()  # the grace period ended: re-summarised without any node event
    r.flush()
    cause = sent.items[-1].failure
    assert cause is not None
    assert (cause.kind, cause.reason, cause.nodes) == ("Infrastructure", "NodeNotReady", ("n1",))
    set_node(r, health)  # Ready again: too late, the verdict stands
    assert sent.items[-1].failure == cause


def test_a_not_ready_node_without_transition_time_counts_from_when_the_agent_saw_it() -> None:
    health = {"n1": status_mod.NodeHealth(ready=True, gpus=8)}
    r, sent, clock, _pods = watched(health)
    clock.now = T0 + 1000
    set_node(r, health, ready=False)
    assert sent.items[-1].failure is None
    clock.now = T0 + 1300
    r.recheck()
    r.flush()
    assert sent.items[-1].failure is not None


def test_a_10s_gpu_drop_that_recovers_reports_nothing() -> None:
    """A device-plugin restart: 8 -> 0 -> 8 GPUs within 10 s is no failure."""
    health = {"n1": status_mod.NodeHealth(ready=True, gpus=8)}
    r, sent, clock, _pods = watched(health)
    clock.now = T0 + 1
    set_node(r, health, gpus=0)
    assert sent.items[-1].failure is None
    assert [i.reason for i in sent.items[-1].pod_issues] == ["GPUUnavailable"]
    clock.now = T0 + 11
    set_node(r, health, gpus=8)
    clock.now = T0 + 1000
    r.recheck()
    r.flush()
    assert all(s.failure is None for s in sent.items)
    assert sent.items[-1].pod_issues == ()


def test_a_gpu_drop_past_the_grace_period_fails_with_gpu_unavailable() -> None:
    health = {"n1": status_mod.NodeHealth(ready=True, gpus=8)}
    r, sent, clock, _pods = watched(health)
    set_node(r, health, gpus=7)
    clock.now = T0 + 300
    r.recheck()
    r.flush()
    cause = sent.items[-1].failure
    assert cause is not None
    assert cause.reason == "GPUUnavailable"


def test_disruption_target_fails_at_once_while_the_node_is_suspected() -> None:
    health = {"n1": status_mod.NodeHealth(ready=True, gpus=8)}
    r, sent, clock, pods = watched(health)
    set_node(r, health, ready=False, not_ready_since=T0)
    evicted = pod("p0", "Running")
    evicted["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}
    ]
    clock.now = T0 + 2
    pods.upsert(evicted)
    r.flush()
    cause = sent.items[-1].failure
    assert cause is not None
    assert cause.reason == "DeletionByTaintManager"


def test_node_not_ready_seconds_zero_fails_at_once_as_before() -> None:
    health = {"n1": status_mod.NodeHealth(ready=True, gpus=8)}
    r, sent, _clock, _pods = watched(health, grace_s=0)
    set_node(r, health, ready=False, not_ready_since=T0)
    cause = sent.items[-1].failure
    assert cause is not None
    assert cause.reason == "NodeNotReady"


async def test_run_rechecks_when_the_grace_period_ends() -> None:
    """No node event comes after the node went NotReady: run() itself re-summarises the job
    once the grace period has passed (its wait is bounded by the deadline)."""
    health = {"n1": status_mod.NodeHealth(ready=True, gpus=8)}
    r, sent, clock, _pods = watched(health)
    set_node(r, health, ready=False, not_ready_since=T0)
    clock.now = T0 + 301
    task = asyncio.create_task(r.run())
    try:
        for _ in range(50):
            await asyncio.sleep(0)
            if sent.items[-1].failure is not None:
                break
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    cause = sent.items[-1].failure
    assert cause is not None
    assert cause.reason == "NodeNotReady"


def test_the_jobs_compute_domain_readiness_is_a_condition_of_its_status() -> None:
    r, sent, jobs, _pods = reporter()
    domains = _ObjectEvents(r, "ComputeDomain.resource.nvidia.com")
    r.track("u1", revision=1, main=JOB)
    jobs.upsert(job({"active": 1}))
    r.flush()
    domain = {
        "metadata": {"name": "train", "namespace": "team-a", "labels": {"gpufed.io/job-uid": "u1"}},
        "status": {"status": "NotReady"},
    }
    domains.upsert(domain)
    r.flush()
    domain["status"] = {"status": "Ready", "nodes": [{"name": "n1"}, {"name": "n2"}]}
    domains.upsert(domain)
    r.flush()
    cds = [
        [(c.status, c.message) for c in s.conditions if c.type == "ComputeDomainReady"]
        for s in sent.items
    ]
    assert cds == [
        [],
        [("False", "ComputeDomain train: NotReady, 0 nodes joined")],
        [("True", "ComputeDomain train: Ready, 2 nodes joined")],
    ]
    domains.delete(domain)  # deleted with the job: the condition goes
    r.flush()
    assert not [c for c in sent.items[-1].conditions if c.type == "ComputeDomainReady"]


def pinned_pod(name: str, node: str, uid: str = "u1") -> dict[str, Any]:
    """A replacement pod the Job controller made from the pinned template: unbound, Pending,
    required to run on ``node`` by name (as gpufed.sync.manifests.pin_pod_template pins it)."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "metadata": {"name": name, "namespace": "team-a", "labels": {"gpufed.io/job-uid": uid}},
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            },
            "containers": [{"name": "main"}],
        },
        "status": {"phase": "Pending"},
    }


def test_an_agent_restarted_after_the_pods_were_collected_reports_the_node_lost() -> None:
    """A fresh reporter (the agent restarted) never saw the old pod on n1: the node was deleted
    and its pod collected while the agent was down. What the member still has is the Job's
    replacement pod, pinned to n1, which no longer exists: the job is NodeLost (re-run from
    its checkpoint), not Pending for ever."""
    sent = Sent()
    health = {"n2": status_mod.NodeHealth(ready=True, gpus=8)}  # n1 is gone
    r = StatusReporter(None, send=sent, node_health=health.get, coalesce_s=0)  # type: ignore[arg-type]
    r._informers["Job.batch"] = None  # type: ignore[assignment]
    jobs, pods = _ObjectEvents(r, "Job.batch"), _PodEvents(r)
    r.track("u1", revision=1, main=JOB)
    jobs.upsert(job({"active": 1, "failed": 1}))
    pods.upsert(pinned_pod("p1", "n1"))
    r.flush()
    cause = sent.items[-1].failure
    assert cause is not None
    assert (cause.kind, cause.reason, cause.nodes) == ("Infrastructure", "NodeLost", ("n1",))
    # pinned to a node that exists: only Pending, no cause
    sent2 = Sent()
    r2 = StatusReporter(None, send=sent2, node_health=health.get, coalesce_s=0)  # type: ignore[arg-type]
    r2._informers["Job.batch"] = None  # type: ignore[assignment]
    jobs2, pods2 = _ObjectEvents(r2, "Job.batch"), _PodEvents(r2)
    r2.track("u1", revision=1, main=JOB)
    jobs2.upsert(job({"active": 1}))
    pods2.upsert(pinned_pod("p1", "n2"))
    r2.flush()
    assert sent2.items[-1].failure is None
