"""Manifest preparation for members (gpufed.sync.manifests)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.api.errors import FieldError
from gpufed.api.labels import JOB_ANNOTATION, JOB_UID_LABEL, ORIGIN_LABEL
from gpufed.sync.manifests import (
    PodSetPinning,
    is_valid_label_value,
    label_value,
    node_not_ready_of,
    prepare_manifests,
    workload_pod_templates,
)
from tests.unit.hub.builders import batch_job, jobset, manifest_list, pytorchjob

UID = "0f0e0d0c-0000-4000-8000-000000000001"


def prepare(template: dict[str, Any], **kw: Any) -> list[dict[str, Any]]:
    args: dict[str, Any] = {
        "job_uid": UID,
        "job_name": "llama-ft",
        "namespace": "team-a",
        "origin": "hub-1",
    }
    args.update(kw)
    return prepare_manifests(template, **args)


def test_server_filled_fields_and_owner_references_are_stripped() -> None:
    job = batch_job()
    job["metadata"].update(
        resourceVersion="42",
        uid="abc",
        managedFields=[{"manager": "kubectl"}],
        creationTimestamp="2026-01-01T00:00:00Z",
        generation=3,
        ownerReferences=[{"apiVersion": "gpufed.io/v1alpha1", "kind": "GPUJob", "uid": "x"}],
    )
    job["status"] = {"active": 1}
    (out,) = prepare(job)
    assert set(out["metadata"]) == {"name", "namespace", "labels", "annotations"}
    assert "status" not in out
    assert job["metadata"]["uid"] == "abc", "the input must not be modified"


def test_every_object_and_pod_template_carries_origin_and_job_uid() -> None:
    template = manifest_list(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {}},
        batch_job(name="train"),
        jobset(("workers", 2, 1, 8), name="js"),
    )
    out = prepare(template)
    for obj in out:
        assert obj["metadata"]["labels"][ORIGIN_LABEL] == "hub-1"
        assert obj["metadata"]["labels"][JOB_UID_LABEL] == UID
        assert obj["metadata"]["annotations"][JOB_ANNOTATION] == "team-a/llama-ft"
        assert obj["metadata"]["namespace"] == "team-a"
    job_pod = out[1]["spec"]["template"]["metadata"]["labels"]
    js_pod = out[2]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]
    assert job_pod[JOB_UID_LABEL] == UID
    assert js_pod["labels"][ORIGIN_LABEL] == "hub-1"


def test_a_long_origin_becomes_a_valid_label_with_the_full_value_annotated() -> None:
    origin = "hub.gpu-platform.example.com/" + "x" * 80
    (out,) = prepare(batch_job(), origin=origin)
    value = out["metadata"]["labels"][ORIGIN_LABEL]
    assert is_valid_label_value(value)
    assert out["metadata"]["annotations"][ORIGIN_LABEL] == origin
    assert is_valid_label_value(out["spec"]["template"]["metadata"]["labels"][ORIGIN_LABEL])


@pytest.mark.parametrize(
    "value",
    ["a" * 64, "-starts-with-dash", "has space", "ends.", "x" * 200 + "/y", "///", "é"],
)
def test_label_value_is_always_valid_and_distinct(value: str) -> None:
    assert is_valid_label_value(label_value(value))
    assert label_value(value) != label_value(value + "z")


def test_valid_label_values_are_kept() -> None:
    assert label_value("hub-1") == "hub-1"
    assert label_value("") == ""


def test_a_single_object_without_a_name_takes_the_gpujob_name() -> None:
    (out,) = prepare(batch_job(name=None))
    assert out["metadata"]["name"] == "llama-ft"


def test_list_items_need_names() -> None:
    with pytest.raises(FieldError) as err:
        prepare(manifest_list(batch_job(name="a"), batch_job(name=None)))
    assert err.value.field == "spec.template.items[1].metadata.name"


def test_kinds_outside_the_allow_list_are_refused_naming_the_field() -> None:
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {}}
    with pytest.raises(FieldError) as err:
        prepare(manifest_list(batch_job(), role))
    assert err.value.field == "spec.template.items[1].kind"
    assert "ClusterRole.rbac.authorization.k8s.io may not be created" in str(err.value)


def test_the_allow_list_is_configurable() -> None:
    with pytest.raises(FieldError):
        prepare(batch_job(), allowed_kinds={"ConfigMap"})


def test_objects_for_another_namespace_are_refused() -> None:
    job = batch_job()
    job["metadata"]["namespace"] = "kube-system"
    with pytest.raises(FieldError) as err:
        prepare(job)
    assert err.value.field == "spec.template.metadata.namespace"
    assert "own namespace 'team-a'" in err.value.message


def test_generate_name_is_refused() -> None:
    job = batch_job(name=None)
    job["metadata"] = {"generateName": "train-"}
    with pytest.raises(FieldError, match="generateName"):
        prepare(job)


def _terms(obj: dict[str, Any]) -> list[dict[str, Any]]:
    terms: list[dict[str, Any]] = obj["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    return terms


def test_pods_of_one_node_are_pinned_by_name() -> None:
    (out,) = prepare(batch_job(), pinning={"main": PodSetPinning(nodes=("n1",))})
    assert _terms(out) == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    ]


def test_pods_of_several_nodes_are_pinned_by_hostname_label() -> None:
    """The API server allows one value for a metadata.name field selector; the hostname label
    takes a list (the nodes' own label values when the member reported them)."""
    where = PodSetPinning(nodes=("n2", "n1"), hostnames={"n1": "host-1"})
    (out,) = prepare(batch_job(), pinning={"main": where})
    assert _terms(out) == [
        {
            "matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["host-1", "n2"]}
            ]
        }
    ]


def test_pinning_is_anded_into_every_existing_node_selector_term() -> None:
    user_terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
    ]
    job = batch_job(
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": user_terms}
            }
        }
    )
    (out,) = prepare(job, pinning={"main": PodSetPinning(nvlink_domains=("clique:abc.1",))})
    terms = out["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert len(terms) == 2
    for term in terms:
        assert term["matchExpressions"][-1] == {
            "key": "nvidia.com/gpu.clique",
            "operator": "In",
            "values": ["abc.1"],
        }
    assert len(user_terms[0]["matchExpressions"]) == 1, "the input must not be modified"


def test_each_pod_set_gets_its_own_pinning() -> None:
    out = prepare(
        pytorchjob(),
        pinning={
            "master": PodSetPinning(nodes=("m",)),
            "worker": PodSetPinning(nodes=("w1", "w2")),
        },
    )
    specs = out[0]["spec"]["pytorchReplicaSpecs"]

    def pinned(role: str) -> list[str]:
        aff = specs[role]["template"]["spec"]["affinity"]["nodeAffinity"]
        term = aff["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
        values: list[str] = (term.get("matchFields") or term["matchExpressions"])[0]["values"]
        return values

    assert pinned("Master") == ["m"]
    assert pinned("Worker") == ["w1", "w2"]


def test_pod_set_names_follow_the_workload_shape() -> None:
    assert [r.pod_set for r in workload_pod_templates(batch_job())] == ["main"]
    assert [r.pod_set for r in workload_pod_templates(pytorchjob())] == ["master", "worker"]
    two = manifest_list(batch_job(name="a"), jobset(("w", 1, 1, 8), name="b"))
    assert [r.pod_set for r in workload_pod_templates(two)] == ["a.main", "b.w"]


def test_the_attempt_reaches_every_pod_template_and_container() -> None:
    """Pods learn their placement attempt (annotation gpufed.io/attempt, env GPUFED_ATTEMPT),
    replacing a GPUFED_ATTEMPT the template set; without an attempt nothing is stamped."""
    job = batch_job(name="train")
    job["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "GPUFED_ATTEMPT", "value": "99"},
        {"name": "KEEP", "value": "x"},
    ]
    template = manifest_list(job, jobset(("workers", 2, 1, 8), name="js"))
    out = prepare(template, attempt=3)
    pods = [
        out[0]["spec"]["template"],
        out[1]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"],
    ]
    for pod in pods:
        assert pod["metadata"]["annotations"]["gpufed.io/attempt"] == "3"
        for c in pod["spec"]["containers"]:
            assert [e for e in c["env"] if e["name"] == "GPUFED_ATTEMPT"] == [
                {"name": "GPUFED_ATTEMPT", "value": "3"}
            ]
    assert {"name": "KEEP", "value": "x"} in pods[0]["spec"]["containers"][0]["env"]
    plain = prepare(template)
    assert "annotations" not in plain[0]["spec"]["template"]["metadata"]


def test_priority_stays_at_the_hub_no_pod_template_carries_it_to_the_member() -> None:
    """A new user's Jobs named `priorityClassName: low`, a class that exists on the hub only: the
    member's Priority admission refused every pod ("no PriorityClass with name low was found")
    and the job hung Dispatched. The member copy carries neither the class nor a priority; the
    input keeps both (the hub reads the class from it)."""
    job = batch_job(name="train", priorityClassName="low")
    job["spec"]["template"]["spec"]["priority"] = 100
    template = manifest_list(job, jobset(("workers", 2, 1, 8), name="js"))
    template["items"][1]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "priorityClassName"
    ] = "low"
    out = prepare(template)
    pods = [
        out[0]["spec"]["template"]["spec"],
        out[1]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"],
    ]
    for pod in pods:
        assert "priorityClassName" not in pod
        assert "priority" not in pod
    assert job["spec"]["template"]["spec"]["priorityClassName"] == "low"


def test_a_non_default_node_grace_reaches_the_agent_on_the_objects_metadata() -> None:
    """spec.placement.retry.nodeNotReadySeconds travels as an object annotation (a Job's pod
    template is immutable); the default 300 s and an unreadable value are not stamped or read
    as 300, so a default job's manifests are unchanged."""
    template = manifest_list(batch_job(name="train"), jobset(("workers", 2, 1, 8), name="js"))
    out = prepare(template, node_not_ready_s=0)
    assert [o["metadata"]["annotations"]["gpufed.io/node-not-ready-seconds"] for o in out] == [
        "0",
        "0",
    ]
    assert node_not_ready_of(out) == 0
    default = prepare(template, node_not_ready_s=300)
    assert default == prepare(template)
    assert node_not_ready_of(default) == 300
    out[0]["metadata"]["annotations"]["gpufed.io/node-not-ready-seconds"] = "-5"
    assert node_not_ready_of(out) == 300


def test_a_time_limit_becomes_each_jobs_active_deadline_unless_it_has_a_smaller_one() -> None:
    """issue 29: spec.placement.timeLimitSeconds reaches a batch/v1 Job copy as
    spec.activeDeadlineSeconds (the member's Job controller stops it there too); a Job's own
    smaller deadline is kept, a larger one lowered; other kinds are left as they are."""
    own_small, own_large = batch_job(name="small"), batch_job(name="large")
    own_small["spec"]["activeDeadlineSeconds"] = 60
    own_large["spec"]["activeDeadlineSeconds"] = 7200
    template = manifest_list(
        batch_job(name="plain"), own_small, own_large, jobset(("workers", 2, 1, 8), name="js")
    )
    out = prepare(template, time_limit_s=600)
    deadlines = [o["spec"].get("activeDeadlineSeconds") for o in out]
    assert deadlines == [600, 60, 600, None]
    assert "activeDeadlineSeconds" not in out[3]["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert own_large["spec"]["activeDeadlineSeconds"] == 7200, "the input must not be modified"
    assert prepare(template) == prepare(template, time_limit_s=None)
    assert [o["spec"].get("activeDeadlineSeconds") for o in prepare(template)] == [
        None,
        60,
        7200,
        None,
    ]
