"""KEP-1623 conditions (gpufed.hub.rules.status): every condition the hub writes has a CamelCase,
non-empty reason and a lastTransitionTime, and matches the CRD's condition schema; the
kind-independent ``Finished`` condition is derived from the phase in one place, so one
``kubectl wait --for=condition=Finished`` covers Job, JobSet and PyTorchJob alike."""

from __future__ import annotations

import re

import pytest

from gpufed.api.crdgen import structural_schema
from gpufed.api.decision import Outcome
from gpufed.api.gpujob import GPUJobStatus, StatusCondition
from gpufed.api.work import Condition, WorkloadStatus
from gpufed.hub.rules import status as st
from tests.unit.hub.test_status import T0, T1, placed, running_status, unschedulable

SCHEMA = structural_schema(StatusCondition)


def assert_kep1623(conditions: list[StatusCondition]) -> None:
    """Each condition as the API server will validate it against the generated CRD schema."""
    for c in conditions:
        wire = c.model_dump(by_alias=True, exclude_none=True, mode="json")
        missing = [f for f in SCHEMA["required"] if f not in wire]
        assert wire["reason"], c.type
        assert wire["lastTransitionTime"], c.type
        assert not missing, f"{c.type}: missing {missing}"
        for name in ("type", "reason"):
            prop = SCHEMA["properties"][name]
            assert re.match(prop["pattern"], wire[name]), f"{c.type}: {name} {wire[name]!r}"


def report(kind: str, phase: str, *conditions: Condition) -> WorkloadStatus:
    return WorkloadStatus(
        job_uid="u", revision=5, kind=kind, name="j", phase=phase, conditions=conditions
    )


def finished(status: GPUJobStatus) -> StatusCondition:
    (c,) = [c for c in status.conditions if c.type == st.FINISHED_CONDITION]
    return c


def test_the_schema_requires_type_status_reason_and_last_transition_time() -> None:
    assert SCHEMA["required"] == ["type", "status", "reason", "message", "lastTransitionTime"]
    assert "default" not in SCHEMA["properties"]["reason"]
    assert SCHEMA["properties"]["observedGeneration"]["type"] == "integer"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("BackoffLimitExceeded", "BackoffLimitExceeded"),
        ("", st.NO_REASON),
        ("image pull back-off", "ImagePullBackOff"),
        ("42 things failed!", "ThingsFailed"),
        ("Reason_With:Colon,Comma", "Reason_With:Colon,Comma"),
        ("!!!", st.NO_REASON),
    ],
)
def test_condition_reason_is_camel_case_and_never_empty(raw: str, reason: str) -> None:
    assert st.condition_reason(raw) == reason


def test_set_condition_turns_a_free_text_reason_into_camel_case() -> None:
    conds = st.set_condition([], "Placed", "False", reason="no room", message="m", now=T0)
    assert conds[0].reason == "NoRoom"
    assert_kep1623(conds)


@pytest.mark.parametrize(
    ("kind", "member_conditions"),
    [
        ("Job.batch", [Condition(type="Complete", status="True", reason="")]),
        (
            "JobSet.jobset.x-k8s.io",
            [Condition(type="Completed", status="True", reason="AllJobsCompleted")],
        ),
        (
            "PyTorchJob.kubeflow.org",
            [
                Condition(type="Running", status="False", reason="PyTorchJobRunning"),
                Condition(type="Succeeded", status="True", reason="PyTorchJob succeeded"),
            ],
        ),
    ],
)
def test_finished_is_true_with_reason_succeeded_whatever_the_workload_kind(
    kind: str, member_conditions: list[Condition]
) -> None:
    s = st.derived(running_status(), generation=1, now=T0)
    assert (finished(s).status, finished(s).reason) == ("False", "Running")
    s = st.workload(s, report(kind, "Succeeded", *member_conditions), now=T1)
    s = st.derived(s, generation=1, now=T1)
    assert (finished(s).status, finished(s).reason) == ("True", "Succeeded")
    assert finished(s).last_transition_time == T1
    assert_kep1623(s.conditions)


def test_finished_says_failed_for_a_failed_job_and_lost_for_a_lost_one() -> None:
    failed = st.workload(
        running_status(),
        report("Job.batch", "Failed", Condition(type="Failed", status="True", reason="")),
        now=T1,
    )
    assert finished(st.derived(failed, generation=1, now=T1)).reason == "Failed"
    rejected = st.decided(
        GPUJobStatus(),
        placed().model_copy(update={"outcome": Outcome.REJECTED}),
        gpus=8,
        placement_ms=1.0,
        now=T0,
    )
    assert (finished(st.derived(rejected, generation=1, now=T0)).status) == "True"
    lost = st.cluster_lost(
        running_status(), cluster="m1", rescheduled=False, lost_for_s=600, now=T1
    )
    c = finished(st.derived(lost, generation=1, now=T1))
    assert (c.status, c.reason) == ("True", "Lost")


def test_finished_is_false_while_the_job_waits_and_keeps_its_transition_time() -> None:
    s = st.derived(
        st.decided(GPUJobStatus(), unschedulable(), gpus=8, placement_ms=1.0, now=T0),
        generation=3,
        now=T0,
    )
    assert (finished(s).status, finished(s).reason) == ("False", "Pending")
    again = st.derived(
        st.decided(s, placed(), gpus=8, placement_ms=1.0, now=T1), generation=3, now=T1
    )
    assert (finished(again).status, finished(again).reason) == ("False", "Placed")
    assert finished(again).last_transition_time == T0  # status unchanged: time unchanged
    assert st.derived(again, generation=3, now=T1) == again  # idempotent


def test_derived_stamps_observed_generation_on_every_condition() -> None:
    s = st.workload(
        running_status(),
        report("Job.batch", "Running", Condition(type="Suspended", status="False", reason="")),
        now=T0,
    )
    s = st.derived(s, generation=7, now=T0)
    assert s.observed_generation == 7
    assert {c.observed_generation for c in s.conditions} == {7}
    assert [c.type for c in s.conditions] == [
        "Valid",
        "Placed",
        "Dispatched",
        "Finished",
        "Suspended",
    ]
    assert_kep1623(s.conditions)


def test_a_member_condition_type_the_api_server_would_refuse_is_left_out() -> None:
    s = st.workload(
        running_status(),
        report(
            "Job.batch",
            "Running",
            Condition(type="not a type!", status="True", reason="x"),
            Condition(type="example.com/Ready", status="True", reason="ok"),
        ),
        now=T0,
    )
    assert [c.type for c in s.conditions if c.type not in st.HUB_CONDITIONS] == [
        "example.com/Ready"
    ]
