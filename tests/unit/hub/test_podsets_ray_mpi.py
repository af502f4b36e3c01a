"""Pod sets of RayJob (ray.io/v1) and MPIJob (kubeflow.org/v2beta1) templates, and their
pinning and ownership labels in the manifests a member gets (gpufed.hub.rules.podsets,
gpufed.sync.manifests)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.api.errors import FieldError
from gpufed.hub.rules.podsets import derive_pod_sets, placement_request
from gpufed.sync.manifests import PodSetPinning, prepare_manifests
from tests.unit.hub.builders import gpujob, mpijob, rayjob


def test_a_rayjob_has_a_head_pod_set_and_one_per_worker_group() -> None:
    sets = derive_pod_sets(rayjob(("gpu-workers", 4, 8), ("cpu-workers", 2, 0)))
    assert [(s.name, s.count, s.gpus_per_pod) for s in sets] == [
        ("head", 1, 0),
        ("gpu-workers", 4, 8),
        ("cpu-workers", 2, 0),
    ]


@pytest.mark.parametrize(
    ("extra", "count"),
    [
        ({}, 3),  # replicas as written
        ({"minReplicas": 5}, 5),  # KubeRay starts at least minReplicas
        ({"maxReplicas": 2}, 2),  # and at most maxReplicas
        ({"numOfHosts": 2}, 6),  # multi-host groups: replicas x hosts
    ],
)
def test_a_worker_group_counts_the_pods_kuberay_starts(extra: dict[str, Any], count: int) -> None:
    sets = derive_pod_sets(rayjob(("w", 3, 8), **extra))
    assert sets[1].count == count


def test_a_worker_group_without_replicas_starts_min_replicas_or_none() -> None:
    tpl = rayjob(("w", 1, 8))
    del tpl["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"]
    assert [s.name for s in derive_pod_sets(tpl)] == ["head"]  # KubeRay's default is 0
    tpl["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["minReplicas"] = 2
    assert derive_pod_sets(tpl)[1].count == 2


def test_an_mpijob_has_a_launcher_and_a_worker_pod_set() -> None:
    sets = derive_pod_sets(mpijob(workers=4, gpus=8))
    assert [(s.name, s.count, s.gpus) for s in sets] == [("launcher", 1, 0), ("worker", 4, 32)]


def _without_cluster_spec() -> dict[str, Any]:
    tpl = rayjob(("w", 1, 8))
    del tpl["spec"]["rayClusterSpec"]
    tpl["spec"]["clusterSelector"] = {"ray.io/cluster": "shared"}
    return tpl


def _dup_group() -> dict[str, Any]:
    return rayjob(("w", 1, 8), ("w", 2, 8))


def _head_named_group() -> dict[str, Any]:
    return rayjob(("head", 1, 8))


def _min_over_max() -> dict[str, Any]:
    return rayjob(("w", 1, 8), minReplicas=4, maxReplicas=2)


def _no_group_name() -> dict[str, Any]:
    tpl = rayjob(("w", 1, 8))
    del tpl["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"]
    return tpl


def _autoscaling() -> dict[str, Any]:
    """Sized at replicas 1, an in-tree autoscaler could grow it to maxReplicas 64 on GPUs of the
    pinned nodes promised to other jobs (found by the stop-19 hostile-tenant probe)."""
    tpl = rayjob(("w", 1, 8), maxReplicas=64)
    tpl["spec"]["rayClusterSpec"]["enableInTreeAutoscaling"] = True
    return tpl


def _no_mpi_specs() -> dict[str, Any]:
    tpl = mpijob()
    del tpl["spec"]["mpiReplicaSpecs"]
    return tpl


@pytest.mark.parametrize(
    ("template", "field", "why"),
    [
        (_without_cluster_spec(), "spec.template.spec.rayClusterSpec", "existing RayCluster"),
        (_dup_group(), "workerGroupSpecs[1].groupName", "must be unique"),
        (_head_named_group(), "workerGroupSpecs[0].groupName", "names the head"),
        (_min_over_max(), "workerGroupSpecs[0].minReplicas", "more than maxReplicas"),
        (_no_group_name(), "workerGroupSpecs[0].groupName", "needs a groupName"),
        (_no_mpi_specs(), "spec.template.spec.mpiReplicaSpecs", "needs mpiReplicaSpecs"),
        (_autoscaling(), "rayClusterSpec.enableInTreeAutoscaling", "turn autoscaling off"),
    ],
)
def test_malformed_rayjobs_and_mpijobs_name_the_field(
    template: dict[str, Any], field: str, why: str
) -> None:
    with pytest.raises(FieldError) as err:
        derive_pod_sets(template)
    assert field in err.value.field
    assert why in err.value.message


def test_every_group_of_a_rayjob_is_one_gang_in_the_request() -> None:
    req = placement_request(gpujob(rayjob(("w", 2, 8), head_gpus=1)), submitted_at=0.0)
    assert req.workload_kind == "RayJob.ray.io"
    assert [(ps.name, ps.count) for ps in req.pod_sets] == [("head", 1), ("w", 2)]
    assert sum(ps.gpus for ps in req.pod_sets) == 17


def test_rayjob_and_mpijob_pod_templates_are_owned_and_pinned_per_group() -> None:
    (ray,) = prepare_manifests(
        rayjob(("w", 2, 8)),
        job_uid="u1",
        job_name="rj",
        namespace="team-a",
        origin="hub",
        pinning={"w": PodSetPinning(nodes=("n1",)), "head": PodSetPinning(nodes=("n2",))},
    )
    cluster = ray["spec"]["rayClusterSpec"]
    for tpl, node in (
        (cluster["headGroupSpec"]["template"], "n2"),
        (cluster["workerGroupSpecs"][0]["template"], "n1"),
    ):
        assert tpl["metadata"]["labels"]["gpufed.io/job-uid"] == "u1"
        terms = tpl["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert terms == [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    (mpi,) = prepare_manifests(
        mpijob(), job_uid="u2", job_name="mpi", namespace="team-a", origin="hub"
    )
    worker = mpi["spec"]["mpiReplicaSpecs"]["Worker"]["template"]
    assert worker["metadata"]["labels"]["gpufed.io/origin"] == "hub"
