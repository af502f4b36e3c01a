"""GPUJob status rules (gpufed.hub.rules.status): terminal phases are final, conditions keep order."""

from __future__ import annotations

from gpufed.api.decision import (
    ClusterRejection,
    ClusterScore,
    Decision,
    Outcome,
    PodSetAssignment,
)
from gpufed.api.gpujob import GPUJobStatus
from gpufed.api.work import Condition, PodIssue, WorkloadStatus
from gpufed.hub.rules import status as st

T0 = "2026-01-01T00:00:00.000000Z"
T1 = "2026-01-01T00:01:00.000000Z"


def placed(cluster: str = "m1") -> Decision:
    return Decision(
        job="team-a/j",
        uid="u",
        outcome=Outcome.PLACED,
        cluster=cluster,
        gpu_product="NVIDIA-H100-80GB-HBM3",
        nvlink_domains=("node:n1",),
        pod_sets=(PodSetAssignment(name="main", requests={"nvidia.com/gpu": 8}, nodes={"n1": 1}),),
        score=90.0,
        scores=(ClusterScore(cluster=cluster, score=90.0, parts={"nvlink_fit": 100.0}),),
        message="fits one node",
        decided_at=1767225600.5,
    )


def unschedulable(message: str = "no member has 8 free GPUs on one node") -> Decision:
    return Decision(
        job="team-a/j",
        uid="u",
        outcome=Outcome.UNSCHEDULABLE,
        rejections=(
            ClusterRejection(
                cluster="m1", plugin="TopologyFit", code="Unschedulable", reason="fragmented"
            ),
        ),
        message=message,
    )


def report(phase: str, **kw: object) -> WorkloadStatus:
    return WorkloadStatus(job_uid="u", revision=5, kind="Job.batch", name="j", phase=phase, **kw)  # type: ignore[arg-type]


def running_status() -> GPUJobStatus:
    s = st.decided(GPUJobStatus(), placed(), gpus=8, placement_ms=12.0, now=T0)
    s = st.dispatched(s, dispatch_ms=30.0, now=T0)
    return st.workload(s, report("Running", active=1), now=T0)


def test_a_placed_decision_sets_phase_cluster_and_timings() -> None:
    s = st.decided(GPUJobStatus(), placed(), gpus=8, placement_ms=12.0, now=T0)
    assert (s.phase, s.cluster, s.gpus) == ("Placed", "m1", 8)
    assert s.timings is not None
    assert s.timings.placement_ms == 12.0
    assert s.placement is not None
    assert s.placement.outcome == "Placed"
    assert [c.type for c in s.conditions] == ["Valid", "Placed"]


def test_unschedulable_waits_in_pending_with_the_reason() -> None:
    s = st.decided(GPUJobStatus(), unschedulable(), gpus=8, placement_ms=None, now=T0)
    assert s.phase == "Pending"
    assert "no member has 8 free GPUs" in s.message
    placed_cond = next(c for c in s.conditions if c.type == "Placed")
    assert (placed_cond.status, placed_cond.reason) == ("False", "Unschedulable")


def test_rejected_fails_the_job() -> None:
    rejected = unschedulable("16 GPUs in one pod: the largest node has 8").model_copy(
        update={"outcome": Outcome.REJECTED}
    )
    s = st.decided(GPUJobStatus(), rejected, gpus=16, placement_ms=None, now=T0)
    assert s.phase == "Failed"
    assert "can ever hold" in s.message


def test_member_conditions_follow_hub_conditions_in_the_members_order() -> None:
    s = running_status()
    done = report(
        "Succeeded",
        succeeded=1,
        conditions=(
            Condition(type="SuccessCriteriaMet", status="True", reason="CompletionsReached"),
            Condition(type="Complete", status="True", reason="CompletionsReached"),
        ),
        completion_time="2026-01-01T00:05:00Z",
    )
    s = st.workload(s, done, now=T1)
    assert [c.type for c in s.conditions] == [
        "Valid",
        "Placed",
        "Dispatched",
        "SuccessCriteriaMet",
        "Complete",
    ]
    assert (s.phase, s.succeeded, s.completion_time) == ("Succeeded", 1, "2026-01-01T00:05:00Z")


def test_terminal_phases_are_final() -> None:
    s = st.workload(running_status(), report("Failed", failed=1), now=T1)
    assert s.phase == "Failed"
    for later in (
        st.workload(s, report("Running", active=1), now=T1),
        st.workload(s, report("Succeeded"), now=T1),
        st.dispatched(s, dispatch_ms=1.0, now=T1),
        st.decided(s, placed("m2"), gpus=8, placement_ms=1.0, now=T1),
        st.cluster_lost(s, cluster="m1", rescheduled=True, lost_for_s=600, now=T1),
    ):
        assert later == s


def test_the_members_failure_reason_is_kept() -> None:
    failed = report(
        "Failed",
        failed=3,
        conditions=(
            Condition(
                type="Failed",
                status="True",
                reason="BackoffLimitExceeded",
                message="Job has reached the specified backoff limit",
            ),
        ),
    )
    s = st.workload(running_status(), failed, now=T1)
    assert "BackoffLimitExceeded" in s.message
    cond = next(c for c in s.conditions if c.type == "Failed")
    assert cond.reason == "BackoffLimitExceeded"


def test_missing_objects_fail_the_job_without_recreating() -> None:
    s = st.workload(running_status(), report("Missing"), now=T1)
    assert s.phase == "Failed"
    cond = next(c for c in s.conditions if c.type == "Dispatched")
    assert (cond.status, cond.reason) == ("False", "MemberObjectsMissing")


def test_transition_time_moves_only_when_status_changes() -> None:
    conds = st.set_condition([], "Placed", "False", reason="Unschedulable", message="a", now=T0)
    conds = st.set_condition(conds, "Placed", "False", reason="Unschedulable", message="b", now=T1)
    assert conds[0].last_transition_time == T0
    assert conds[0].message == "b"
    conds = st.set_condition(conds, "Placed", "True", reason="Placed", message="", now=T1)
    assert conds[0].last_transition_time == T1


def test_pod_issues_are_capped() -> None:
    issues = tuple(PodIssue(pod=f"p{i}", reason="ImagePullBackOff") for i in range(50))
    s = st.workload(running_status(), report("Pending", pod_issues=issues), now=T1)
    assert len(s.pod_issues) == st.MAX_POD_ISSUES
    assert "ImagePullBackOff" in s.message


def test_a_lost_member_makes_the_job_lost_or_pending_again() -> None:
    lost = st.cluster_lost(
        running_status(), cluster="m1", rescheduled=False, lost_for_s=600, now=T1
    )
    assert lost.phase == "Lost"
    again = st.cluster_lost(
        running_status(), cluster="m1", rescheduled=True, lost_for_s=600, now=T1
    )
    assert (again.phase, again.cluster) == ("Pending", None)
    assert [c.type for c in again.conditions] == ["Valid", "Placed", "ClusterLost"]


def test_invalid_spec_names_the_field() -> None:
    s = st.invalid(
        GPUJobStatus(), field="spec.template.kind", message="spec.template.kind: x", now=T0
    )
    assert s.phase == "Failed"
    assert s.conditions[0].type == "Valid"
    assert s.conditions[0].status == "False"


def test_placement_status_round_trips_to_the_decision() -> None:
    d = placed()
    back = st.decision_from_status(d.job, d.uid, st.placement_status(d))
    assert back.model_dump(exclude={"decided_at"}) == d.model_dump(exclude={"decided_at"})
    assert abs(back.decided_at - d.decided_at) < 1e-3


def test_a_placement_stored_in_etcd_but_never_written_shows_again_after_a_restart() -> None:
    # The hub stopped after the placement transaction and before the status write: the new
    # hub knows the cluster only from jobs/<uid>; a later Running report must name it.
    s = st.resumed(GPUJobStatus(), cluster="m1", gpus=8, now=T1)
    assert (s.phase, s.cluster, s.gpus) == ("Placed", "m1", 8)
    assert [(c.type, c.status) for c in s.conditions] == [("Valid", "True"), ("Placed", "True")]
    s = st.workload(s, report("Running", active=1), now=T1)
    assert (s.phase, s.message) == ("Running", "running in m1")


def test_restoring_a_placement_leaves_written_and_terminal_statuses_alone() -> None:
    running = running_status()
    assert st.resumed(running, cluster="m1", gpus=8, now=T1) == running
    done = st.workload(running, report("Succeeded", succeeded=1), now=T1)
    assert st.resumed(done, cluster="m2", gpus=8, now=T1) == done


def test_placements_own_waiting_and_rejected_prefixes_are_not_doubled() -> None:
    # placement's messages already start with "waiting: " / "rejected: "; the status said
    # "waiting: waiting: no member can hold ..." and "... ever hold this job: rejected: ...".
    s = st.decided(
        GPUJobStatus(),
        unschedulable("waiting: no member can hold 1 pod x 1 GPU (1 GPU) now"),
        gpus=1,
        placement_ms=None,
        now=T0,
    )
    assert s.message == "waiting: no member can hold 1 pod x 1 GPU (1 GPU) now"
    rejected = unschedulable("rejected: no member of the fleet could ever hold 1 pod").model_copy(
        update={"outcome": Outcome.REJECTED}
    )
    s = st.decided(GPUJobStatus(), rejected, gpus=1, placement_ms=None, now=T0)
    assert s.message == (
        "no member cluster can ever hold this job: no member of the fleet could ever hold 1 pod"
    )
