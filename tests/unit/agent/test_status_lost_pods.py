"""The agent's status reporter on a failed copy whose pods are gone (rule 4a of
gpufed.sync.failure): a backoffLimit-0 Job whose node was deleted while the agent was down is
NodeLost (the hub re-runs it elsewhere), a job that failed on its own stays an application
failure, and nothing is judged before the pods are listed."""

from __future__ import annotations

import asyncio
from typing import Any

from gpufed.agent import status as status_mod
from gpufed.agent.status import StatusReporter
from gpufed.agent.status_watch import ObjectEvents, PodEvents
from gpufed.api.work import WorkloadStatus
from gpufed.sync.apply import ObjectRef
from gpufed.sync.manifests import PodSetPinning, pin_pod_template

JOB = ObjectRef("batch/v1", "Job", "team-a", "train")
BACKOFF = {
    "type": "Failed",
    "status": "True",
    "reason": "BackoffLimitExceeded",
    "message": "Job has reached the specified backoff limit",
    "lastTransitionTime": "2027-01-15T08:00:00Z",
}


def pinned_job(status: dict[str, Any], where: PodSetPinning, uid: str = "u1") -> dict[str, Any]:
    """The member Job as the hub applied it: its template pinned by
    gpufed.sync.manifests.pin_pod_template (the writer), ``status`` as the member shows it."""
    template: dict[str, Any] = {
        "metadata": {"labels": {"gpufed.io/job-uid": uid}},
        "spec": {"containers": [{"name": "main"}], "restartPolicy": "Never"},
    }
    pin_pod_template(template, where)
    return {
        "metadata": {"name": "train", "namespace": "team-a", "labels": {"gpufed.io/job-uid": uid}},
        "spec": {"backoffLimit": 0, "template": template},
        "status": status,
    }


def failed_status() -> dict[str, Any]:
    return {"failed": 1, "conditions": [BACKOFF]}


def exited_pod(node: str, code: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "p0", "namespace": "team-a", "labels": {"gpufed.io/job-uid": "u1"}},
        "spec": {"nodeName": node},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "main", "state": {"terminated": {"exitCode": code, "reason": "Error"}}}
            ],
        },
    }


class Sent(list[WorkloadStatus]):
    def __call__(self, s: WorkloadStatus) -> bool:
        self.append(s)
        return True


def fresh_agent(
    nodes: dict[str, status_mod.NodeHealth], hostnames: dict[str, str] | None = None
) -> tuple[StatusReporter, Sent, ObjectEvents, PodEvents]:
    """A reporter as a restarted agent has it: the inventory lists ``nodes`` (``hostnames``:
    hostname label value -> node); it never saw the copy's old pods."""
    sent = Sent()
    r = StatusReporter(
        None,  # type: ignore[arg-type]
        send=sent,
        node_health=nodes.get,
        node_of_hostname=(hostnames or {}).get,
        coalesce_s=0,
    )
    r._informers["Job.batch"] = None  # type: ignore[assignment]  # the kind is watched
    return r, sent, ObjectEvents(r, "Job.batch"), PodEvents(r)


HEALTHY = status_mod.NodeHealth(ready=True, gpus=8)


def test_an_agent_restarted_after_a_backoff_limit_0_job_lost_its_node_reports_node_lost() -> None:
    """Agent down; n1 deleted under the running pod; the Job controller failed the Job
    (BackoffLimitExceeded) and the pod was collected. The restarted agent sees a Failed Job,
    no pod, pinned to n1, which no longer exists: NodeLost, so the hub re-runs it elsewhere
    (without the rule: an Application failure, the job failed for good)."""
    r, sent, jobs, _pods = fresh_agent({"n2": HEALTHY})
    r.track("u1", revision=3, main=JOB)
    jobs.upsert(pinned_job(failed_status(), PodSetPinning(nodes=("n1",))))
    r.flush()
    assert sent[-1].phase == "Failed"
    cause = sent[-1].failure
    assert cause is not None
    assert (cause.kind, cause.reason, cause.nodes) == ("Infrastructure", "NodeLost", ("n1",))


def test_a_gang_pinned_by_hostname_is_node_lost_when_one_of_its_nodes_is_gone() -> None:
    where = PodSetPinning(nodes=("n1", "n2"), hostnames={"n1": "host-1", "n2": "host-2"})
    r, sent, jobs, _pods = fresh_agent({"n2": HEALTHY}, hostnames={"host-2": "n2"})
    r.track("u1", revision=1, main=JOB)
    jobs.upsert(pinned_job(failed_status(), where))
    r.flush()
    cause = sent[-1].failure
    assert cause is not None
    assert (cause.kind, cause.reason, cause.nodes) == ("Infrastructure", "NodeLost", ("host-1",))
    # every hostname still carried by a node: the job's own failure
    r2, sent2, jobs2, _ = fresh_agent(
        {"n1": HEALTHY, "n2": HEALTHY}, hostnames={"host-1": "n1", "host-2": "n2"}
    )
    r2.track("u1", revision=1, main=JOB)
    jobs2.upsert(pinned_job(failed_status(), where))
    r2.flush()
    assert sent2[-1].failure is not None
    assert sent2[-1].failure.kind == "Application"


def test_a_job_that_failed_on_its_own_stays_an_application_failure_when_its_node_goes_later() -> (
    None
):
    """The agent watched: the pod exited 1 on n1, the Job Failed: Application (exit code 1).
    Then n1 is deleted and the pod collected: the cause stays the observed one (sticky), it
    is not re-read as NodeLost from the now empty copy."""
    nodes = {"n1": HEALTHY, "n2": HEALTHY}
    r, sent, jobs, pods = fresh_agent(nodes)
    r.track("u1", revision=1, main=JOB)
    jobs.upsert(pinned_job(failed_status(), PodSetPinning(nodes=("n1",))))
    pods.upsert(exited_pod("n1", 1))
    r.flush()
    first = sent[-1].failure
    assert first is not None
    assert (first.kind, first.exit_codes) == ("Application", (1,))
    del nodes["n1"]
    r.node_changed("n1")
    pods.delete(exited_pod("n1", 1))
    r.flush()
    assert r.current("u1") is not None
    assert r.current("u1").failure == first  # type: ignore[union-attr]


def test_a_restarted_agent_keeps_a_failure_of_its_own_when_the_pod_is_still_there() -> None:
    """Restarted after the node went but before the pod garbage collector removed the
    finished pod: its exit code speaks (Application), and that verdict sticks."""
    r, sent, jobs, pods = fresh_agent({"n2": HEALTHY})
    r.track("u1", revision=1, main=JOB)
    jobs.upsert(pinned_job(failed_status(), PodSetPinning(nodes=("n1",))))
    pods.upsert(exited_pod("n1", 3))
    r.flush()
    cause = sent[-1].failure
    assert cause is not None
    assert (cause.kind, cause.exit_codes) == ("Application", (3,))
    pods.delete(exited_pod("n1", 3))  # collected now
    r.flush()
    assert r.current("u1").failure == cause  # type: ignore[union-attr]


def test_a_time_limit_failure_whose_node_is_gone_is_not_node_lost() -> None:
    r, sent, jobs, _pods = fresh_agent({"n2": HEALTHY})
    r.track("u1", revision=1, main=JOB)
    deadline = {**BACKOFF, "reason": "DeadlineExceeded", "message": "Job was active longer"}
    jobs.upsert(pinned_job({"failed": 1, "conditions": [deadline]}, PodSetPinning(nodes=("n1",))))
    r.flush()
    cause = sent[-1].failure
    assert cause is not None
    assert (cause.kind, cause.reason) == ("Application", "DeadlineExceeded")


class _Listing:
    """The pod informer as the reporter sees it: ``synced`` once it listed."""

    def __init__(self) -> None:
        self.synced = asyncio.Event()


def test_nothing_is_judged_before_the_pods_are_listed() -> None:
    """A restarted agent's Job list can arrive before its pod list: "no pod left" would be a
    guess, and a cause sticks. The copy is summarised once the pods are listed (its pod still
    there: its own failure)."""
    r, sent, jobs, pods = fresh_agent({"n2": HEALTHY})
    listing = _Listing()
    r._informers["Pod"] = listing  # type: ignore[assignment]
    r.track("u1", revision=1, main=JOB)
    jobs.upsert(pinned_job(failed_status(), PodSetPinning(nodes=("n1",))))
    r.flush()
    assert sent == []
    pods.begin_relist()
    pods.upsert(exited_pod("n1", 1))
    pods.end_relist()
    listing.synced.set()  # what Informer.relist does right after end_relist
    r.flush()
    cause = sent[-1].failure
    assert cause is not None
    assert cause.kind == "Application"


def test_a_copy_with_no_pods_is_summarised_once_the_pod_list_ends() -> None:
    """The pod list marks every tracked job, also one with no pod at all (else it would wait
    for an unrelated change)."""
    r, sent, jobs, pods = fresh_agent({"n2": HEALTHY})
    listing = _Listing()
    r._informers["Pod"] = listing  # type: ignore[assignment]
    r.track("u1", revision=1, main=JOB)
    jobs.upsert(pinned_job(failed_status(), PodSetPinning(nodes=("n1",))))
    r.flush()
    assert sent == []
    pods.begin_relist()
    pods.end_relist()
    listing.synced.set()
    r.flush()
    assert sent[-1].failure is not None
    assert sent[-1].failure.reason == "NodeLost"
