"""Pod sets and placement requests derived from GPUJob templates (gpufed.hub.rules.podsets)."""

from __future__ import annotations

import pytest

from gpufed.api.errors import FieldError
from gpufed.api.inventory import Taint
from gpufed.hub.rules.podsets import derive_pod_sets, placement_request
from tests.unit.hub.builders import (
    batch_job,
    container,
    gpujob,
    jobset,
    manifest_list,
    pod_spec,
    pytorchjob,
)


def test_a_job_runs_parallelism_pods_capped_by_completions() -> None:
    (ps,) = derive_pod_sets(batch_job(8, parallelism=4, completions=2))
    assert (ps.name, ps.count, ps.gpus_per_pod) == ("main", 2, 8)
    (ps,) = derive_pod_sets(batch_job(8, parallelism=3))
    assert ps.count == 3
    (ps,) = derive_pod_sets(batch_job(8))
    assert ps.count == 1


def test_a_jobset_has_one_pod_set_per_replicated_job() -> None:
    sets = derive_pod_sets(jobset(("leader", 1, 1, 0), ("workers", 4, 2, 8)))
    assert [(s.name, s.count, s.gpus_per_pod) for s in sets] == [
        ("leader", 1, 0),
        ("workers", 8, 8),
    ]


def test_a_pytorchjob_has_one_pod_set_per_replica_type() -> None:
    sets = derive_pod_sets(pytorchjob(masters=1, workers=3, gpus=4))
    assert [(s.name, s.count, s.gpus) for s in sets] == [("master", 1, 4), ("worker", 3, 12)]


def test_a_list_sums_its_workloads_and_ignores_config_objects() -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    sets = derive_pod_sets(manifest_list(cm, batch_job(2, name="a"), batch_job(4, name="b")))
    assert [(s.name, s.gpus) for s in sets] == [("a.main", 2), ("b.main", 4)]


def test_init_containers_count_as_their_max_and_overhead_is_added() -> None:
    spec = pod_spec(
        4,
        initContainers=[container(8, name="warm"), container(2, name="other")],
        overhead={"cpu": "250m"},
    )
    spec["containers"][0]["resources"]["requests"] = {"cpu": "1"}
    job = batch_job()
    job["spec"]["template"]["spec"] = spec
    (ps,) = derive_pod_sets(job)
    assert ps.requests["nvidia.com/gpu"] == 8
    assert ps.requests["cpu"] == 1250


def test_node_selector_and_tolerations_come_from_the_pod_template() -> None:
    job = batch_job(
        1,
        nodeSelector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "inference"}],
    )
    (ps,) = derive_pod_sets(job)
    assert ps.node_selector == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert ps.tolerations[0].key == "dedicated"


@pytest.mark.parametrize(
    ("template", "field"),
    [
        (batch_job(parallelism=-1), "spec.template.spec.parallelism"),
        (batch_job(completions="2"), "spec.template.spec.completions"),  # type: ignore[arg-type]
        (
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}},
            "spec.template.kind",
        ),
        (
            {"apiVersion": "batch/v1", "kind": "Job", "spec": {}},
            "spec.template.spec.template",
        ),
        (
            {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "spec": {}},
            "spec.template.spec.pytorchReplicaSpecs",
        ),
    ],
)
def test_bad_templates_name_the_field(template: dict[str, object], field: str) -> None:
    with pytest.raises(FieldError) as err:
        derive_pod_sets(template)
    assert err.value.field == field


def test_a_fractional_gpu_is_refused_naming_the_container() -> None:
    job = batch_job()
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/gpu": "0.5"
    }
    with pytest.raises(FieldError, match=r"containers\[0\].resources.limits.nvidia.com/gpu"):
        derive_pod_sets(job)


def test_a_job_with_zero_parallelism_runs_no_pods() -> None:
    with pytest.raises(FieldError, match="runs no pods"):
        derive_pod_sets(batch_job(parallelism=0))


def test_placement_request_carries_spec_placement() -> None:
    job = gpujob(
        jobset(("w", 2, 1, 8)),
        placement={
            "gpuProducts": ["NVIDIA-H100-80GB-HBM3"],
            "clusterSelector": {"matchLabels": {"region": "us-east"}},
            "topology": {"nvlink": "Required"},
            "priority": 100,
        },
    )
    req = placement_request(job, submitted_at=12.5)
    assert req.job == "team-a/llama-ft"
    assert req.uid == job.metadata.uid
    assert req.gpus == 16
    assert req.gpu_products == ("NVIDIA-H100-80GB-HBM3",)
    assert req.cluster_selector is not None
    assert req.cluster_selector.matches({"region": "us-east"})
    assert req.topology.nvlink == "Required"
    assert req.priority == 100
    assert req.workload_kind == "JobSet.jobset.x-k8s.io"
    assert req.submitted_at == 12.5


def test_the_time_limit_is_spec_placement_else_the_jobs_active_deadline() -> None:
    job = batch_job(8)
    job["spec"]["activeDeadlineSeconds"] = 7200
    assert placement_request(gpujob(job), submitted_at=0.0).time_limit_s == 7200
    ours = gpujob(job, placement={"timeLimitSeconds": 3600})
    assert placement_request(ours, submitted_at=0.0).time_limit_s == 3600
    assert placement_request(gpujob(jobset(("w", 1, 1, 8))), submitted_at=0.0).time_limit_s is None
    job["spec"]["activeDeadlineSeconds"] = "soon"
    with pytest.raises(FieldError) as err:
        placement_request(gpujob(job), submitted_at=0.0)
    assert err.value.field == "spec.template.spec.activeDeadlineSeconds"


@pytest.mark.parametrize(
    "expression",
    [
        {"key": "region", "operator": "In", "values": []},
        {"key": "region", "operator": "Exists", "values": ["eu"]},
    ],
)
def test_a_malformed_cluster_selector_expression_names_its_field(
    expression: dict[str, object],
) -> None:
    job = gpujob(
        jobset(("w", 1, 1, 8)), placement={"clusterSelector": {"matchExpressions": [expression]}}
    )
    with pytest.raises(FieldError) as err:
        placement_request(job, submitted_at=0.0)
    assert err.value.field == "spec.placement.clusterSelector.matchExpressions[0]"
    assert "values" in err.value.message


def test_tolerations_with_toleration_seconds_are_accepted_and_still_tolerate() -> None:
    # the usual NoExecute toleration of a pod template (Kubernetes adds such ones by default)
    tol = {
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    }
    (ps,) = derive_pod_sets(batch_job(8, tolerations=[tol]))
    [t] = ps.tolerations
    assert t.toleration_seconds == 300
    assert t.tolerates(Taint(key="node.kubernetes.io/unreachable", effect="NoExecute"))


# --- review: templates that used to crash the hub's intake (a ValidationError escaped) -----------


def _pytorch_master_twice() -> dict[str, object]:
    """A PyTorchJob whose replica types ``Master`` and ``master`` differ only in case."""
    ptj = pytorchjob(gpus=1)
    specs = ptj["spec"]["pytorchReplicaSpecs"]
    specs["master"] = specs.pop("Worker")
    return ptj


@pytest.mark.parametrize(
    ("template", "field"),
    [
        # two workloads of one kind and name in a List: the second would overwrite the first
        (
            manifest_list(batch_job(1, name="j"), batch_job(1, name="j")),
            "spec.template.items[1].metadata.name",
        ),
        # replica types that differ only in case are one pod set
        (
            _pytorch_master_twice(),
            "spec.template.spec.pytorchReplicaSpecs.master",
        ),
        # replicated jobs need distinct, non-empty names
        (jobset(("w", 1, 1, 1), ("w", 1, 1, 1)), "spec.template.spec.replicatedJobs[1].name"),
        (jobset(("", 1, 1, 1)), "spec.template.spec.replicatedJobs[0].name"),
    ],
)
def test_templates_whose_pod_sets_collide_are_invalid_naming_the_field(
    template: dict[str, object], field: str
) -> None:
    with pytest.raises(FieldError) as err:
        placement_request(gpujob(template), submitted_at=0.0)
    assert err.value.field == field


def test_a_gpu_count_beyond_int64_is_invalid_not_a_status_the_api_server_refuses() -> None:
    # 10^20 GPUs: status.gpus (an int64 in the CRD) could never be written; the job stayed
    # without any status while the hub retried the write every second.
    huge = batch_job(1)
    huge["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/gpu": 10**20
    }
    with pytest.raises(FieldError, match=r"nvidia\.com/gpu") as err:
        placement_request(gpujob(huge), submitted_at=0.0)
    assert err.value.field == "spec.template.spec.template.spec"
    many = batch_job(8, parallelism=2**62, completions=2**62)
    with pytest.raises(FieldError) as err:
        placement_request(gpujob(many), submitted_at=0.0)
    assert err.value.field == "spec.template.spec.parallelism"
