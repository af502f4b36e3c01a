"""The pure translation of managed plain workloads (hub/rules/managed.py): a workload becomes
the GPUJob ``gpufed submit`` would make of it, and every Job status written back is one the Job
API server accepts.

The API server's rules are written out here on their own (:func:`violations`), from what
kube-apiserver v1.36 answered to status patches of a Job with ``managedBy: gpufed.io/hub``
(its messages quoted), and every sequence of GPUJob statuses up to four long is checked
against them, brute force. tests/integration/hub/test_managed_status.py sends the same
sequences to a real API server.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from pydantic import ValidationError

from gpufed.api.errors import FieldError
from gpufed.api.gpujob import GPUJob, GPUJobStatus
from gpufed.api.labels import MANAGED_KIND_LABEL
from gpufed.cli.jobs import wrap
from gpufed.hub.components.config import HubConfig
from gpufed.hub.rules.managed import (
    KINDS,
    gpujob_for,
    gpujob_name,
    has_started,
    job_status,
    jobset_status,
    owner_of,
)
from gpufed.hub.rules.podsets import placement_request
from gpufed.sync.manifests import prepare_manifests

JOB, JOBSET = KINDS["Job"], KINDS["JobSet"]
NOW = "2026-12-03T11:05:00.123456Z"


def _true(status: dict[str, Any], type_: str) -> bool:
    return any(c["type"] == type_ and c["status"] == "True" for c in status.get("conditions", []))


def violations(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What kube-apiserver v1.36 refuses in a Job status update ``old`` -> ``new``."""
    out = []
    finished = _true(new, "Complete") or _true(new, "Failed")
    if _true(new, "Complete") and not _true(new, "SuccessCriteriaMet"):
        out.append("cannot set Complete=True condition without the SuccessCriteriaMet=true")
    if _true(new, "Failed") and not _true(new, "FailureTarget"):
        out.append("cannot set Failed=True condition without the FailureTarget=true")
    if _true(new, "Complete") and (_true(new, "Failed") or _true(new, "FailureTarget")):
        out.append("a Complete job cannot be Failed")
    if finished and not new.get("startTime"):
        out.append("startTime is required for finished job")
    if _true(new, "Complete") and not new.get("completionTime"):
        out.append("completionTime is required for Complete jobs")
    if new.get("completionTime") and not _true(new, "Complete"):
        out.append("cannot set completionTime when there is no Complete=True condition")
    if (
        new.get("completionTime")
        and new.get("startTime")
        and (new["completionTime"] < new["startTime"])
    ):
        out.append("completionTime must be equal to or after startTime")
    if finished and new.get("active", 0) > 0:
        out.append("active>0 is invalid for finished job")
    if finished and new.get("terminating", 0) > 0:
        out.append("terminating>0 is invalid for finished job")
    if new.get("ready", 0) > new.get("active", 0):
        out.append("cannot set more ready pods than active")
    if old.get("startTime") and new.get("startTime") != old["startTime"]:
        out.append("startTime: field is immutable for unsuspended job once set")
    for t in ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget"):
        if _true(old, t) and not _true(new, t):
            out.append(f"cannot disable the {t}=True condition")
    for key in ("startTime", "completionTime"):
        value = new.get(key)
        if value is not None and not (len(value) == 20 and value.endswith("Z")):
            out.append(f"{key}: {value!r} is not a whole-second RFC 3339 time")
    return out


def _cond(type_: str, status: str = "True", reason: str = "R", message: str = "") -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-12-03T11:00:05Z",
    }


#: GPUJob statuses as the hub writes them, including awkward ones (ready above active, a
#: member clock behind, a re-run starting later, a job that never ran).
GPUJOB_STATUSES: dict[str, GPUJobStatus] = {
    "pending": GPUJobStatus(phase="Pending"),
    "placed": GPUJobStatus(phase="Placed", active=1),
    "running": GPUJobStatus(
        phase="Running", active=1, ready=2, start_time="2026-12-03T11:00:01.5Z"
    ),
    "rerun": GPUJobStatus(
        phase="Running", active=2, ready=1, failed=1, start_time="2026-12-03T11:03:00Z"
    ),
    "succeeded": GPUJobStatus.model_validate(
        {
            "phase": "Succeeded",
            "succeeded": 1,
            "startTime": "2026-12-03T11:00:01Z",
            "completionTime": "2026-12-03T11:00:00Z",  # a member clock behind the start
            "conditions": [
                _cond("Finished", reason="Succeeded"),
                _cond("SuccessCriteriaMet", reason="CompletionsReached"),
                _cond("Complete", reason="CompletionsReached"),
            ],
        }
    ),
    "succeeded-bare": GPUJobStatus(phase="Succeeded"),
    "failed": GPUJobStatus.model_validate(
        {
            "phase": "Failed",
            "failed": 1,
            "startTime": "2026-12-03T11:00:01Z",
            "message": "failed in alpha",
            "conditions": [
                _cond("Finished", reason="Failed"),
                _cond("FailureTarget", reason="BackoffLimitExceeded"),
                _cond("Failed", reason="BackoffLimitExceeded", message="backoff limit"),
            ],
        }
    ),
    "invalid": GPUJobStatus.model_validate(
        {
            "phase": "Failed",
            "message": "spec.template.kind: not allowed",
            "conditions": [_cond("Valid", "False", reason="InvalidSpec")],
        }
    ),
    "lost": GPUJobStatus(phase="Lost", message="member alpha stopped reporting"),
    "rejected": GPUJobStatus.model_validate(
        {
            "phase": "Failed",
            "message": "no member cluster can ever hold this job",
            "conditions": [_cond("Valid"), _cond("Placed", "False", reason="Rejected")],
        }
    ),
}


def _run(sequence: tuple[str, ...]) -> list[dict[str, Any]]:
    states: list[dict[str, Any]] = [{}]
    for step in sequence:
        states.append(job_status(GPUJOB_STATUSES[step], states[-1], now=NOW))
    return states


@pytest.mark.parametrize("length", [1, 2, 3, 4])
def test_every_sequence_of_gpujob_statuses_gives_job_statuses_the_api_server_accepts(
    length: int,
) -> None:
    for sequence in itertools.product(GPUJOB_STATUSES, repeat=length):
        states = _run(sequence)
        for old, new in itertools.pairwise(states):
            assert violations(old, new) == [], (sequence, old, new)


@pytest.mark.parametrize("length", [1, 2, 3])
def test_the_first_terminal_gpujob_status_decides_the_job_and_nothing_changes_it_after(
    length: int,
) -> None:
    outcome = {"succeeded": "Complete", "succeeded-bare": "Complete", "failed": "Failed"}
    outcome |= {"invalid": "Failed", "lost": "Failed", "rejected": "Failed"}
    for sequence in itertools.product(GPUJOB_STATUSES, repeat=length):
        states = _run(sequence)
        first = next((i for i, s in enumerate(sequence) if s in outcome), None)
        if first is None:
            assert not any(_true(states[-1], t) for t in ("Complete", "Failed")), sequence
            continue
        decided = states[first + 1]
        assert _true(decided, outcome[sequence[first]]), sequence
        assert all(s == decided for s in states[first + 1 :]), sequence


def test_a_job_keeps_its_first_start_time_across_a_rerun_and_never_shows_ready_above_active() -> (
    None
):
    first = job_status(GPUJOB_STATUSES["running"], {}, now=NOW)
    assert first["startTime"] == "2026-12-03T11:00:01Z"
    assert (first["active"], first["ready"]) == (1, 1)
    again = job_status(GPUJOB_STATUSES["rerun"], first, now=NOW)
    assert again["startTime"] == "2026-12-03T11:00:01Z"
    assert (again["active"], again["ready"], again["failed"]) == (2, 1, 1)


def test_a_failed_job_carries_the_members_reason_and_a_lost_one_says_cluster_lost() -> None:
    failed = job_status(GPUJOB_STATUSES["failed"], {}, now=NOW)
    reasons = {c["type"]: c["reason"] for c in failed["conditions"]}
    assert reasons == {"FailureTarget": "BackoffLimitExceeded", "Failed": "BackoffLimitExceeded"}
    lost = job_status(GPUJOB_STATUSES["lost"], {}, now=NOW)
    assert {c["reason"] for c in lost["conditions"]} == {"ClusterLost"}
    invalid = job_status(GPUJOB_STATUSES["invalid"], {}, now=NOW)
    assert {c["reason"] for c in invalid["conditions"]} == {"InvalidSpec"}
    assert invalid["conditions"][1]["message"] == "spec.template.kind: not allowed"
    rejected = job_status(GPUJOB_STATUSES["rejected"], {}, now=NOW)
    assert {c["reason"] for c in rejected["conditions"]} == {"Rejected"}


def test_a_jobset_shows_its_start_once_and_its_end_once_as_terminal_state_and_condition() -> None:
    running = jobset_status(GPUJOB_STATUSES["running"], {}, now=NOW)
    # JobSet has no startTime: the Started condition is what keeps it from running twice.
    assert [(c["type"], c["status"]) for c in running["conditions"]] == [
        ("gpufed.io/Started", "True")
    ]
    assert running["conditions"][0]["lastTransitionTime"] == "2026-12-03T11:00:01Z"
    assert has_started(JOBSET, running)
    assert not has_started(JOBSET, {})
    assert jobset_status(GPUJOB_STATUSES["rerun"], running, now=NOW) == running
    done = jobset_status(GPUJOB_STATUSES["succeeded-bare"], running, now=NOW)
    assert done["terminalState"] == "Completed"
    assert [(c["type"], c["status"]) for c in done["conditions"]] == [
        ("gpufed.io/Started", "True"),
        ("Completed", "True"),
    ]
    assert jobset_status(GPUJOB_STATUSES["failed"], done, now=NOW) == done
    never_ran = jobset_status(GPUJOB_STATUSES["succeeded-bare"], {}, now=NOW)
    assert [c["type"] for c in never_ran["conditions"]] == ["Completed"]
    failed = jobset_status(GPUJOB_STATUSES["lost"], {}, now=NOW)
    assert (failed["terminalState"], failed["conditions"][0]["reason"]) == ("Failed", "ClusterLost")


# --- workload -> GPUJob ---------------------------------------------------------------------------


def hub_job(name: str = "train", **meta: Any) -> dict[str, Any]:
    """A Job as the hub's API server returns it after ``kubectl apply`` (selector and
    controller labels generated from its uid)."""
    uid = "0f0e0d0c-0000-4000-8000-000000000001"
    generated = {
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": name,
        "controller-uid": uid,
        "job-name": name,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": uid,
            "resourceVersion": "42",
            "generation": 1,
            "creationTimestamp": "2026-12-03T11:00:00Z",
            "labels": {**generated, **meta.pop("labels", {})},
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{}",
                **meta.pop("annotations", {}),
            },
            **meta,
        },
        "spec": {
            "managedBy": "gpufed.io/hub",
            "parallelism": 2,
            "completions": 2,
            "backoffLimit": 0,
            "manualSelector": False,
            "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}},
            "template": {
                "metadata": {"labels": dict(generated)},
                "spec": {
                    "restartPolicy": "Never",
                    "priorityClassName": "high",
                    "containers": [
                        {
                            "name": "main",
                            "image": "trainer:1",
                            "resources": {"limits": {"nvidia.com/gpu": 8}},
                        }
                    ],
                },
            },
        },
        "status": {},
    }


def test_a_managed_job_becomes_the_gpujob_gpufed_submit_makes_of_the_same_job() -> None:
    obj = hub_job(
        labels={"gpufed.io/queue": "research", "team": "vision"},
        annotations={"gpufed.io/gpu-products": "H100, A100", "gpufed.io/nvlink": "Required"},
    )
    made = gpujob_for(obj, JOB)
    wrapped = wrap(obj, "team-a")
    assert made["spec"]["placement"] == wrapped["spec"]["placement"]
    assert made["spec"]["placement"] == {
        "gpuProducts": ["H100", "A100"],
        "topology": {"nvlink": "Required"},
        "queue": "research",
    }
    assert made["metadata"]["name"] == "job-train"
    assert made["metadata"]["namespace"] == "team-a"
    assert made["metadata"]["labels"][MANAGED_KIND_LABEL] == "Job"
    assert made["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "train",
            "uid": obj["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": False,
        }
    ]
    template = made["spec"]["template"]
    # What the member's API server and Job controller must generate or run themselves:
    assert "managedBy" not in template["spec"]
    assert "selector" not in template["spec"]
    assert template["metadata"] == {
        "name": "train",
        "labels": {"gpufed.io/queue": "research", "team": "vision"},
        "annotations": {"gpufed.io/gpu-products": "H100, A100", "gpufed.io/nvlink": "Required"},
    }
    assert template["spec"]["template"]["metadata"]["labels"] == {}
    assert template["spec"]["template"]["spec"]["priorityClassName"] == "high"
    # The intake's own checks accept it (as `gpufed submit --dry-run` runs them).
    model = GPUJob.model_validate({**made, "metadata": {**made["metadata"], "uid": "u"}})
    request = placement_request(model, submitted_at=0.0)
    assert [(p.count, p.gpus_per_pod) for p in request.pod_sets] == [(2, 8)]
    prepare_manifests(
        model.spec.template, job_uid="u", job_name="job-train", namespace="team-a", origin="o"
    )
    # The workload given is never changed.
    assert obj["spec"]["managedBy"] == "gpufed.io/hub"
    assert "selector" in obj["spec"]


def test_a_bad_placement_hint_is_refused_naming_the_annotation() -> None:
    with pytest.raises(FieldError) as err:
        gpujob_for(hub_job(annotations={"gpufed.io/nvlink": "Always"}), JOB)
    assert err.value.field == "metadata.annotations[gpufed.io/nvlink]"
    with pytest.raises(FieldError) as err:
        gpujob_for(hub_job(labels={"gpufed.io/queue": 3}), JOB)
    assert err.value.field == "metadata.labels[gpufed.io/queue]"


def test_gpujob_names_are_deterministic_per_kind_and_fit_a_dns_subdomain() -> None:
    assert gpujob_name(JOB, "x") == "job-x"
    assert gpujob_name(JOBSET, "x") == "jobset-x"
    long_a, long_b = "a" * 250 + "b", "a" * 250 + "c"
    assert len(gpujob_name(JOBSET, long_a)) <= 253
    assert gpujob_name(JOBSET, long_a) != gpujob_name(JOBSET, long_b)
    assert gpujob_name(JOBSET, long_a) == gpujob_name(JOBSET, long_a)


def test_only_a_labelled_gpujob_with_a_controller_reference_of_that_kind_has_an_owner() -> None:
    made = gpujob_for(hub_job(), JOB)
    assert owner_of(made) == (JOB, "train", "0f0e0d0c-0000-4000-8000-000000000001")
    unlabelled = {**made, "metadata": {**made["metadata"], "labels": {}}}
    assert owner_of(unlabelled) is None
    ref = dict(made["metadata"]["ownerReferences"][0])
    for forged in (
        {**ref, "controller": False},
        {**ref, "kind": "JobSet"},
        {**ref, "apiVersion": "batch/v2"},
        {**ref, "uid": ""},
    ):
        obj = {**made, "metadata": {**made["metadata"], "ownerReferences": [forged]}}
        assert owner_of(obj) is None, forged


@pytest.mark.parametrize("kind", ["PyTorchJob", "RayJob"])
def test_a_kind_whose_operator_leaves_no_room_for_managed_by_is_refused_with_the_reason(
    kind: str,
) -> None:
    """PyTorchJob and RayJob cannot carry ``gpufed.io/hub`` in the operators' own CRDs (the
    e2e applies them to the hub: tests/e2e/test_12_plain_jobs.py): ``--managed-kinds`` naming
    one is refused, naming the field, the operator's limit and what to do instead."""
    with pytest.raises(ValidationError) as refused:
        HubConfig(insecure=True, managed_kinds=frozenset({"Job", kind}))
    text = str(refused.value)
    assert f"managed_kinds: {kind} not among Job, JobSet" in text
    assert "managedBy" in text
    assert "gpufed submit" in text
    with pytest.raises(
        ValidationError, match=r"managed_kinds: MPIJob not among Job, JobSet \[type"
    ):
        HubConfig(insecure=True, managed_kinds=frozenset({"MPIJob"}))
