"""Workloads their member controller would never start are refused at admission, naming the
field and the fix: a suspended job, one handed to another controller (``managedBy``), an MPIJob
of a version, slot count or MPI implementation mpi-operator refuses. Admitted, their gang would
hold GPUs for no pod until the reservation's TTL (gpufed.sync.workloads). Container lists that
are not lists of objects are refused naming the entry, instead of crashing the sizing."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from gpufed.api.errors import FieldError
from gpufed.api.resources import QuantityError, pod_requests
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.rules.podsets import derive_pod_sets
from tests.unit.hub.builders import (
    batch_job,
    gpujob_obj,
    hgx_node,
    jobset,
    manifest_list,
    mpijob,
    pytorchjob,
    rayjob,
)
from tests.unit.hub.term import Term, sent, settle

T = "spec.template"


def _set(tpl: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """``tpl`` with ``value`` at the dotted path under the object (``spec.runPolicy.suspend``)."""
    out = copy.deepcopy(tpl)
    node = out
    *parents, last = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out


#: (builder, where the kind keeps suspend/managedBy, its own controller)
KINDS: list[tuple[str, Callable[[], dict[str, Any]], str, str]] = [
    ("job", lambda: batch_job(8), "spec", "kubernetes.io/job-controller"),
    (
        "jobset",
        lambda: jobset(("w", 1, 2, 8)),
        "spec",
        "jobset.sigs.k8s.io/jobset-controller",
    ),
    ("rayjob", lambda: rayjob(("w", 2, 8)), "spec", "ray.io/kuberay-operator"),
    ("pytorchjob", pytorchjob, "spec.runPolicy", "kubeflow.org/training-operator"),
    ("mpijob", mpijob, "spec.runPolicy", "kubeflow.org/mpi-operator"),
]
IDS = [k[0] for k in KINDS]


@pytest.mark.parametrize(("_id", "build", "where", "own"), KINDS, ids=IDS)
def test_a_suspended_workload_is_refused_naming_the_field(
    _id: str, build: Callable[[], dict[str, Any]], where: str, own: str
) -> None:
    with pytest.raises(FieldError) as err:
        derive_pod_sets(_set(build(), f"{where}.suspend", True))
    assert err.value.field == f"{T}.{where}.suspend"
    assert f"remove {where}.suspend: gpufed starts the job when it is placed" in err.value.message


@pytest.mark.parametrize(("_id", "build", "where", "own"), KINDS, ids=IDS)
def test_a_workload_managed_by_another_controller_is_refused(
    _id: str, build: Callable[[], dict[str, Any]], where: str, own: str
) -> None:
    tpl = _set(build(), f"{where}.managedBy", "kueue.x-k8s.io/multikueue")
    with pytest.raises(FieldError) as err:
        derive_pod_sets(tpl)
    assert err.value.field == f"{T}.{where}.managedBy"
    assert f"remove {where}.managedBy" in err.value.message
    assert own in err.value.message


@pytest.mark.parametrize(("_id", "build", "where", "own"), KINDS, ids=IDS)
def test_unsuspended_and_own_controller_workloads_are_sized(
    _id: str, build: Callable[[], dict[str, Any]], where: str, own: str
) -> None:
    expected = derive_pod_sets(build())
    tpl = _set(_set(build(), f"{where}.suspend", False), f"{where}.managedBy", own)
    assert derive_pod_sets(tpl) == expected


def test_suspend_is_checked_in_every_workload_of_a_list() -> None:
    tpl = manifest_list(batch_job(8, name="a"), _set(batch_job(8, name="b"), "spec.suspend", True))
    with pytest.raises(FieldError) as err:
        derive_pod_sets(tpl)
    assert err.value.field == f"{T}.items[1].spec.suspend"


def test_a_jobset_child_job_managed_by_another_controller_is_refused() -> None:
    tpl = jobset(("w", 1, 2, 8))
    job_spec = tpl["spec"]["replicatedJobs"][0]["template"]["spec"]
    job_spec["managedBy"] = "kueue.x-k8s.io/multikueue"
    with pytest.raises(FieldError) as err:
        derive_pod_sets(tpl)
    assert err.value.field == f"{T}.spec.replicatedJobs[0].template.spec.managedBy"
    job_spec["managedBy"] = "kubernetes.io/job-controller"
    assert derive_pod_sets(tpl) == derive_pod_sets(jobset(("w", 1, 2, 8)))


def test_a_run_policy_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(FieldError) as err:
        derive_pod_sets(_set(mpijob(), "spec.runPolicy", ["suspend"]))
    assert err.value.field == f"{T}.spec.runPolicy"
    assert "must be an object" in err.value.message


@pytest.mark.parametrize("slots", [0, -1, True, 2.0, "8", 2**31])
def test_mpijob_slots_per_worker_below_one_or_not_int32_is_refused(slots: Any) -> None:
    with pytest.raises(FieldError) as err:
        derive_pod_sets(_set(mpijob(), "spec.slotsPerWorker", slots))
    assert err.value.field == f"{T}.spec.slotsPerWorker"
    assert "must be a whole number from 1" in err.value.message


@pytest.mark.parametrize("impl", ["Bogus", "openmpi", "", 1])
def test_mpijob_unknown_mpi_implementation_is_refused(impl: Any) -> None:
    with pytest.raises(FieldError) as err:
        derive_pod_sets(_set(mpijob(), "spec.mpiImplementation", impl))
    assert err.value.field == f"{T}.spec.mpiImplementation"
    assert "OpenMPI, Intel, MPICH" in err.value.message


@pytest.mark.parametrize("impl", ["OpenMPI", "Intel", "MPICH"])
def test_mpijob_known_mpi_implementations_are_sized(impl: str) -> None:
    tpl = _set(_set(mpijob(), "spec.mpiImplementation", impl), "spec.slotsPerWorker", 1)
    assert derive_pod_sets(tpl) == derive_pod_sets(mpijob())


@pytest.mark.parametrize("version", ["kubeflow.org/v1", "kubeflow.org/v1alpha2"])
def test_mpijob_of_a_version_mpi_operator_does_not_serve_is_refused(version: str) -> None:
    tpl = mpijob()
    tpl["apiVersion"] = version
    with pytest.raises(FieldError) as err:
        derive_pod_sets(tpl)
    assert err.value.field == f"{T}.apiVersion"
    assert "write apiVersion: kubeflow.org/v2beta1" in err.value.message


def _mpi_worker_containers(value: list[Any]) -> dict[str, Any]:
    tpl = mpijob()
    tpl["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"] = value
    return tpl


@pytest.mark.parametrize(
    ("template", "field"),
    [
        (
            _mpi_worker_containers([None]),
            f"{T}.spec.mpiReplicaSpecs.Worker.template.spec.containers[0]",
        ),
        (batch_job(8, containers=[None]), f"{T}.spec.template.spec.containers[0]"),
        (
            batch_job(8, initContainers=["busybox"]),
            f"{T}.spec.template.spec.initContainers[0]",
        ),
    ],
    ids=["mpijob-null", "job-null", "job-init-str"],
)
def test_a_container_that_is_not_an_object_is_refused_naming_it(
    template: dict[str, Any], field: str
) -> None:
    with pytest.raises(FieldError) as err:
        derive_pod_sets(template)
    assert err.value.field == field
    assert err.value.message.startswith("must be an object")


def test_pod_requests_names_a_container_that_is_not_an_object() -> None:
    with pytest.raises(QuantityError, match=r"^pod\.spec\.containers\[1\]: must be an object"):
        pod_requests({"containers": [{"name": "a"}, None]}, field="pod.spec")


async def test_admission_fails_a_suspended_mpijob_and_sends_nothing() -> None:
    """Through intake and a scheduling cycle on an idle member: phase Failed, Valid False naming
    the field and the fix, no work sent (before: its gang was placed and held the GPUs)."""
    t = Term()
    t.member("m1", hgx_node("n1"), hgx_node("n2"))
    s = t.connect("m1")
    sent(s)
    obj = gpujob_obj("mpi", "u1", template=_set(mpijob(), "spec.runPolicy.suspend", True))
    t.kube.objects["gpujobs"].append(obj)
    t.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()
    await t.ctrl.scheduler.cycle()
    await settle()
    job = t.ctrl.state.jobs["u1"]
    assert job.status.phase == "Failed"
    valid = next(c for c in job.status.conditions if c.type == "Valid")
    assert valid.status == "False"
    assert valid.message.startswith(f"{T}.spec.runPolicy.suspend: ")
    assert "gpufed starts the job when it is placed" in valid.message
    assert sent(s) == []
