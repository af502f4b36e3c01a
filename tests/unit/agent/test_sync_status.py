"""Workload status summaries (gpufed.sync.status) from member objects and pods."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.sync.status import MAX_POD_ISSUES, summarize_workload, terminal_phase


def job_obj(status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "train", "namespace": "team-a"}, "status": status}


def pod(
    name: str,
    phase: str,
    *,
    node: str | None = "n1",
    waiting: str | None = None,
    scheduled: dict[str, str] | None = None,
    start: str | None = None,
    terminated: dict[str, Any] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if start:
        status["startTime"] = start
    if waiting:
        status["containerStatuses"] = [
            {"name": "c", "state": {"waiting": {"reason": waiting, "message": f"{waiting}!"}}}
        ]
    if terminated:
        status["containerStatuses"] = [{"name": "c", "state": {"terminated": terminated}}]
    if scheduled:
        status["conditions"] = [{"type": "PodScheduled", **scheduled}]
    return {"metadata": {"name": name}, "spec": {"nodeName": node}, "status": status}


def summarize(obj: dict[str, Any] | None, pods: list[dict[str, Any]] = (), **kw: Any):  # type: ignore[no-untyped-def, assignment]
    return summarize_workload(
        job_uid="uid-1",
        revision=3,
        kind=kw.pop("kind", "Job.batch"),
        name="train",
        obj=obj,
        pods=pods,
        **kw,
    )


def test_succeeded_job_keeps_conditions_in_order_counts_and_times() -> None:
    status = {
        "startTime": "2026-01-01T00:00:00Z",
        "completionTime": "2026-01-01T00:05:00Z",
        "succeeded": 2,
        "conditions": [
            {
                "type": "SuccessCriteriaMet",
                "status": "True",
                "reason": "CompletionsReached",
                "lastTransitionTime": "2026-01-01T00:05:00Z",
            },
            {
                "type": "Complete",
                "status": "True",
                "reason": "CompletionsReached",
                "message": "Reached expected number of succeeded pods",
                "lastTransitionTime": "2026-01-01T00:05:00Z",
            },
        ],
    }
    s = summarize(job_obj(status), [pod("p0", "Succeeded", node="n2"), pod("p1", "Succeeded")])
    assert s.phase == "Succeeded"
    assert [c.type for c in s.conditions] == ["SuccessCriteriaMet", "Complete"]
    assert s.conditions[1].message == "Reached expected number of succeeded pods"
    assert (s.succeeded, s.active, s.failed) == (2, 0, 0)
    assert (s.start_time, s.completion_time) == ("2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z")
    assert s.nodes == ("n1", "n2")
    assert (s.job_uid, s.revision, s.kind, s.name) == ("uid-1", 3, "Job.batch", "train")


def test_failed_job_keeps_reason_and_takes_completion_from_the_condition() -> None:
    status = {
        "startTime": "2026-01-01T00:00:00Z",
        "failed": 1,
        "conditions": [
            {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded"},
            {
                "type": "Failed",
                "status": "True",
                "reason": "BackoffLimitExceeded",
                "message": "Job has reached the specified backoff limit",
                "lastTransitionTime": "2026-01-01T00:01:00Z",
            },
        ],
    }
    failed_pod = pod("p0", "Failed", terminated={"exitCode": 3, "reason": "Error"})
    s = summarize(job_obj(status), [failed_pod])
    assert s.phase == "Failed"
    assert s.conditions[-1].reason == "BackoffLimitExceeded"
    assert s.completion_time == "2026-01-01T00:01:00Z"
    assert s.failed == 1
    assert [(i.pod, i.reason, i.message) for i in s.pod_issues] == [("p0", "Error", "exit code 3")]


def test_unschedulable_and_image_pull_problems_keep_the_job_pending() -> None:
    pods = [
        pod(
            "p0",
            "Pending",
            node=None,
            scheduled={
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/4 nodes: Insufficient nvidia.com/gpu",
            },
        ),
        pod("p1", "Pending", waiting="ImagePullBackOff"),
        pod("p2", "Pending", waiting="ContainerCreating"),
    ]
    s = summarize(job_obj({"active": 3}), pods)
    assert s.phase == "Pending"
    assert [(i.pod, i.reason) for i in s.pod_issues] == [
        ("p0", "Unschedulable"),
        ("p1", "ImagePullBackOff"),
    ]
    assert "Insufficient nvidia.com/gpu" in s.pod_issues[0].message
    assert s.nodes == ("n1",)


def test_running_when_a_pod_runs_and_crash_loops_are_reported() -> None:
    s = summarize(
        job_obj({"active": 2, "ready": 1}),
        [
            pod("p0", "Running", start="2026-01-01T00:00:09Z"),
            pod("p1", "Running", waiting="CrashLoopBackOff"),
        ],
    )
    assert s.phase == "Running"
    assert (s.active, s.ready) == (2, 1)
    assert [i.reason for i in s.pod_issues] == ["CrashLoopBackOff"]
    assert s.start_time == "2026-01-01T00:00:09Z"  # no status.startTime: earliest pod start


def test_a_job_whose_pods_finished_stays_running_until_its_terminal_condition() -> None:
    # The pod has Succeeded, the Job controller has not marked the Job Complete yet: the job
    # does not fall back to Pending (the GPUJob would go Running -> Placed -> Succeeded).
    just_finished = summarize(
        job_obj({"active": 1, "startTime": "2026-01-01T00:00:00Z"}),
        [pod("p0", "Succeeded", start="2026-01-01T00:00:01Z")],
    )
    assert just_finished.phase == "Running"
    counted = summarize(job_obj({"succeeded": 1, "startTime": "2026-01-01T00:00:00Z"}), [])
    assert counted.phase == "Running"
    failed_once = summarize(job_obj({"failed": 1, "active": 1}), [pod("p1", "Pending")])
    assert failed_once.phase == "Running"
    # Never started: still Pending.
    assert summarize(job_obj({"active": 1}), [pod("p0", "Pending")]).phase == "Pending"


def test_not_observed_yet_is_pending_and_missing_is_missing() -> None:
    assert summarize(None).phase == "Pending"
    gone = summarize(None, missing=True)
    assert gone.phase == "Missing"
    assert gone.conditions == ()


def test_jobset_counts_sum_replicated_jobs_and_completed_means_succeeded() -> None:
    status = {
        "replicatedJobsStatus": [
            {"name": "workers", "active": 0, "succeeded": 4, "failed": 0, "ready": 0},
            {"name": "driver", "active": 0, "succeeded": 1, "failed": 0, "ready": 0},
        ],
        "conditions": [
            {"type": "Completed", "status": "True", "lastTransitionTime": "2026-01-01T01:00:00Z"}
        ],
    }
    s = summarize(job_obj(status), kind="JobSet.jobset.x-k8s.io")
    assert (s.phase, s.succeeded, s.completion_time) == ("Succeeded", 5, "2026-01-01T01:00:00Z")


def test_pytorchjob_running_condition_and_replica_counts() -> None:
    status = {
        "startTime": "2026-01-01T00:00:00Z",
        "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 3}},
        "conditions": [
            {"type": "Created", "status": "True"},
            {"type": "Running", "status": "True"},
        ],
    }
    s = summarize(job_obj(status), kind="PyTorchJob.kubeflow.org")
    assert (s.phase, s.active) == ("Running", 4)
    status["conditions"].append({"type": "Failed", "status": "True", "reason": "WorkerFailed"})
    assert summarize(job_obj(status), kind="PyTorchJob.kubeflow.org").phase == "Failed"


def test_pod_issues_are_bounded() -> None:
    pods = [pod(f"p{i:03d}", "Pending", waiting="ErrImagePull") for i in range(MAX_POD_ISSUES + 5)]
    assert len(summarize(job_obj({}), pods).pod_issues) == MAX_POD_ISSUES


# RayJob statuses as KubeRay v1.2 writes them (no conditions: jobDeploymentStatus + jobStatus).
RAY_RUNNING = {
    "jobDeploymentStatus": "Running",
    "jobStatus": "RUNNING",
    "jobId": "rj-7x2kq",
    "rayClusterName": "rj-raycluster-8hc2v",
    "startTime": "2026-01-01T00:00:00Z",
}
RAY_SUCCEEDED = {
    **RAY_RUNNING,
    "jobDeploymentStatus": "Complete",
    "jobStatus": "SUCCEEDED",
    "message": "Job finished successfully.",
    "endTime": "2026-01-01T00:20:00Z",
}
RAY_FAILED = {
    **RAY_RUNNING,
    "jobDeploymentStatus": "Failed",
    "jobStatus": "FAILED",
    "reason": "AppFailed",
    "message": "Job entrypoint command failed with exit code 1",
    "endTime": "2026-01-01T00:05:00Z",
}


def test_a_rayjob_is_summarised_from_its_deployment_and_job_status() -> None:
    kind = "RayJob.ray.io"
    assert summarize(job_obj({"jobDeploymentStatus": "Initializing"}), kind=kind).phase == "Pending"
    running = summarize(job_obj(RAY_RUNNING), kind=kind)
    assert (running.phase, running.start_time) == ("Running", "2026-01-01T00:00:00Z")
    assert [(c.type, c.status, c.reason) for c in running.conditions] == [
        ("Running", "True", "RUNNING")
    ]
    done = summarize(job_obj(RAY_SUCCEEDED), kind=kind)
    assert (done.phase, done.completion_time) == ("Succeeded", "2026-01-01T00:20:00Z")
    failed = summarize(job_obj(RAY_FAILED), kind=kind)
    assert failed.phase == "Failed"
    assert (failed.conditions[0].reason, failed.completion_time) == (
        "AppFailed",
        "2026-01-01T00:05:00Z",
    )
    assert "exit code 1" in failed.conditions[0].message


def test_a_rayjob_stopped_inside_a_complete_deployment_failed() -> None:
    status = {**RAY_SUCCEEDED, "jobStatus": "STOPPED"}
    assert summarize(job_obj(status), kind="RayJob.ray.io").phase == "Failed"


def test_a_rayjobs_pods_give_its_counts() -> None:
    pods = [pod("rj-head", "Running"), pod("rj-w-1", "Running"), pod("rj-w-2", "Pending")]
    s = summarize(job_obj(RAY_RUNNING), pods, kind="RayJob.ray.io")
    assert s.active == 3


# An MPIJob status as mpi-operator v0.5 (kubeflow.org/v2beta1) writes it.
MPI_SUCCEEDED = {
    "startTime": "2026-01-01T00:00:00Z",
    "completionTime": "2026-01-01T01:00:00Z",
    "replicaStatuses": {"Launcher": {"succeeded": 1}, "Worker": {}},
    "conditions": [
        {"type": "Created", "status": "True", "reason": "MPIJobCreated"},
        {"type": "Running", "status": "False", "reason": "MPIJobRunning"},
        {
            "type": "Succeeded",
            "status": "True",
            "reason": "MPIJobSucceeded",
            "message": "MPIJob team-a/mpi successfully completed.",
            "lastTransitionTime": "2026-01-01T01:00:00Z",
        },
    ],
}


def test_an_mpijob_is_summarised_from_its_conditions_and_replica_statuses() -> None:
    kind = "MPIJob.kubeflow.org"
    running = {
        "startTime": "2026-01-01T00:00:00Z",
        "replicaStatuses": {"Launcher": {"active": 1}, "Worker": {"active": 4}},
        "conditions": [{"type": "Running", "status": "True", "reason": "MPIJobRunning"}],
    }
    s = summarize(job_obj(running), kind=kind)
    assert (s.phase, s.active) == ("Running", 5)
    done = summarize(job_obj(MPI_SUCCEEDED), kind=kind)
    assert (done.phase, done.succeeded, done.completion_time) == (
        "Succeeded",
        1,
        "2026-01-01T01:00:00Z",
    )
    assert [c.type for c in done.conditions] == ["Created", "Running", "Succeeded"]
    failed = {
        **running,
        "conditions": [{"type": "Failed", "status": "True", "reason": "MPIJobFailed"}],
    }
    assert summarize(job_obj(failed), kind=kind).phase == "Failed"


@pytest.mark.parametrize(
    ("kind", "status", "phase"),
    [
        ("Job.batch", {"conditions": [{"type": "Complete", "status": "True"}]}, "Succeeded"),
        ("Job.batch", {"conditions": [{"type": "Failed", "status": "True"}]}, "Failed"),
        ("Job.batch", {"conditions": [{"type": "Complete", "status": "False"}]}, None),
        ("Job.batch", {"active": 1}, None),
        (
            "JobSet.jobset.x-k8s.io",
            {"conditions": [{"type": "Completed", "status": "True"}]},
            "Succeeded",
        ),
        # a Job's Complete is not a JobSet's terminal condition
        ("JobSet.jobset.x-k8s.io", {"conditions": [{"type": "Complete", "status": "True"}]}, None),
        (
            "PyTorchJob.kubeflow.org",
            {"conditions": [{"type": "Succeeded", "status": "True"}]},
            "Succeeded",
        ),
        (
            "RayJob.ray.io",
            {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"},
            "Succeeded",
        ),
        ("RayJob.ray.io", {"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED"}, "Failed"),
        ("RayJob.ray.io", {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}, None),
    ],
)
def test_terminal_phase_follows_each_kinds_own_terminal_conditions(
    kind: str, status: dict[str, Any], phase: str | None
) -> None:
    """The rule the agent applies to a deleted object's last state is summarize's rule."""
    assert terminal_phase(kind, job_obj(status)) == phase
    if phase is not None:
        assert summarize(job_obj(status), kind=kind).phase == phase


def test_terminal_phase_of_nothing_is_none() -> None:
    assert terminal_phase("Job.batch", None) is None
