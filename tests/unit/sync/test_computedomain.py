"""Rendering a job's ComputeDomain: the object, owned like the job's other objects, and the channel
claim on every GPU pod (and only there); the readiness condition the agent reports."""

from __future__ import annotations

from typing import Any

from gpufed.api.decision import Decision, Outcome, PodSetAssignment
from gpufed.api.labels import JOB_UID_LABEL, ORIGIN_LABEL
from gpufed.sync.computedomain import (
    CHANNEL_CLAIM,
    ComputeDomainSpec,
    channel_template_name,
    compute_domain_of,
    domain_condition,
)
from gpufed.sync.manifests import prepare_manifests


def _pod(name: str, gpus: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": gpus} if gpus else {}
    return {
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": name, "image": "i:1", "resources": {"limits": limits}},
                {"name": f"{name}-side", "image": "i:1"},
            ],
        }
    }


JOBSET = {
    "apiVersion": "jobset.x-k8s.io/v1alpha2",
    "kind": "JobSet",
    "metadata": {"name": "train"},
    "spec": {
        "replicatedJobs": [
            {"name": "workers", "template": {"spec": {"parallelism": 8, "template": _pod("w", 4)}}},
            {"name": "launcher", "template": {"spec": {"template": _pod("l", 0)}}},
        ]
    },
}


def _decision(compute_domain: bool) -> Decision:
    return Decision(
        job="team-a/train",
        uid="u1",
        outcome=Outcome.PLACED,
        cluster="nvl72",
        pod_sets=(
            PodSetAssignment(
                name="workers",
                requests={"nvidia.com/gpu": 4},
                nodes={f"t{i}": 1 for i in range(8)},
            ),
            PodSetAssignment(name="launcher", requests={"cpu": 1000}, nodes={"cpu0": 1}),
        ),
        compute_domain=compute_domain,
    )


def test_the_decision_names_the_domain_its_nodes_and_gpu_pod_sets() -> None:
    assert compute_domain_of(_decision(False)) is None
    assert compute_domain_of(_decision(True)) == ComputeDomainSpec(
        name="train", nodes=8, pod_sets=("workers",)
    )


def test_prepared_manifests_carry_the_domain_and_every_gpu_pods_channel_claim() -> None:
    out = prepare_manifests(
        JOBSET,
        job_uid="u1",
        job_name="train",
        namespace="team-a",
        origin="hub-1",
        compute_domain=compute_domain_of(_decision(True)),
    )
    assert [o["kind"] for o in out] == ["JobSet", "ComputeDomain"]
    domain = out[1]
    assert domain["apiVersion"] == "resource.nvidia.com/v1beta1"
    assert domain["metadata"]["name"] == "train"
    assert domain["metadata"]["namespace"] == "team-a"
    assert domain["metadata"]["labels"][JOB_UID_LABEL] == "u1"
    assert domain["metadata"]["labels"][ORIGIN_LABEL] == "hub-1"
    assert domain["spec"] == {
        "numNodes": 8,
        "channel": {
            "resourceClaimTemplate": {"name": "train-imex-channel"},
            "allocationMode": "Single",
        },
    }
    workers, launcher = (
        rj["template"]["spec"]["template"]["spec"] for rj in out[0]["spec"]["replicatedJobs"]
    )
    assert workers["resourceClaims"] == [
        {"name": CHANNEL_CLAIM, "resourceClaimTemplateName": "train-imex-channel"}
    ]
    for c in workers["containers"]:
        assert c["resources"]["claims"] == [{"name": CHANNEL_CLAIM}]
    assert "resourceClaims" not in launcher
    assert all("claims" not in (c.get("resources") or {}) for c in launcher["containers"])
    # the input is untouched, and without a domain nothing is added
    assert (
        "resourceClaims"
        not in JOBSET["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    )
    plain = prepare_manifests(
        JOBSET, job_uid="u1", job_name="train", namespace="team-a", origin="hub-1"
    )
    assert [o["kind"] for o in plain] == ["JobSet"]


def test_existing_claims_are_kept_and_the_channel_is_not_added_twice() -> None:
    pod = _pod("w", 0)
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "g"}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpus"}]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {"template": pod},
    }
    spec = ComputeDomainSpec(name="j", nodes=2, pod_sets=("main",))
    once = prepare_manifests(
        job, job_uid="u", job_name="j", namespace="n", origin="o", compute_domain=spec
    )
    again = prepare_manifests(
        once[0], job_uid="u", job_name="j", namespace="n", origin="o", compute_domain=spec
    )
    pspec = again[0]["spec"]["template"]["spec"]
    assert [c["name"] for c in pspec["resourceClaims"]] == ["gpus", CHANNEL_CLAIM]
    assert pspec["containers"][0]["resources"]["claims"] == [
        {"name": "gpus"},
        {"name": CHANNEL_CLAIM},
    ]


def test_long_names_stay_valid() -> None:
    name = channel_template_name("x" * 253)
    assert len(name) <= 253
    assert name.endswith("-imex-channel")
    assert channel_template_name("x" * 253) != channel_template_name("x" * 252 + "y")


def test_readiness_condition() -> None:
    ready = domain_condition(
        {"metadata": {"name": "train"}, "status": {"status": "Ready", "nodes": [{}, {}]}}
    )
    assert (ready.type, ready.status, ready.reason) == ("ComputeDomainReady", "True", "Ready")
    assert ready.message == "ComputeDomain train: Ready, 2 nodes joined"
    new = domain_condition({"metadata": {"name": "train"}})
    assert (new.status, new.reason) == ("False", "NotReady")
