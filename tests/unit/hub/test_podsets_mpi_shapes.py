"""Malformed MPIJob (kubeflow.org/v2beta1) shapes are refused at admission, naming the field and
the fix, instead of being sized: mpi-operator would never start them (its own validation refuses
them), so a gang placed for them would hold GPUs promised to others (gpufed.sync.workloads)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.api.errors import FieldError
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.rules.podsets import derive_pod_sets
from tests.unit.hub.builders import gpujob_obj, hgx_node, mpijob
from tests.unit.hub.term import Term, sent, settle

SPECS = "spec.template.spec.mpiReplicaSpecs"


def _without(role: str) -> dict[str, Any]:
    tpl = mpijob()
    del tpl["spec"]["mpiReplicaSpecs"][role]
    return tpl


def _with(role: str, **fields: Any) -> dict[str, Any]:
    tpl = mpijob()
    tpl["spec"]["mpiReplicaSpecs"][role].update(fields)
    return tpl


def _renamed(old: str, new: str) -> dict[str, Any]:
    tpl = mpijob()
    specs = tpl["spec"]["mpiReplicaSpecs"]
    specs[new] = specs.pop(old)
    return tpl


def _no_containers(role: str, replicas: int | None = None) -> dict[str, Any]:
    tpl = mpijob()
    spec = tpl["spec"]["mpiReplicaSpecs"][role]
    spec["template"]["spec"]["containers"] = []
    if replicas is not None:
        spec["replicas"] = replicas
    return tpl


@pytest.mark.parametrize(
    ("template", "field", "why"),
    [
        # no launcher: mpi-operator refuses it; sized before, the workers' GPUs were held
        (_without("Launcher"), f"{SPECS}.Launcher", "add a Launcher replica spec"),
        # mpirun runs in exactly one launcher pod
        (_with("Launcher", replicas=2), f"{SPECS}.Launcher.replicas", "must be 1"),
        (_with("Launcher", replicas=0), f"{SPECS}.Launcher.replicas", "must be 1"),
        # a Worker spec with no workers: the operator wants at least one
        (_with("Worker", replicas=0), f"{SPECS}.Worker.replicas", "at least 1"),
        (_with("Worker", replicas=-3), f"{SPECS}.Worker.replicas", "at least 1"),
        (_with("Launcher", replicas=-1), f"{SPECS}.Launcher.replicas", "must be 1"),
        # the operator looks the types up by their exact names; others are never started
        (_renamed("Launcher", "launcher"), f"{SPECS}.launcher", "write Launcher"),
        (_renamed("Worker", "Workers"), f"{SPECS}.Workers", "Launcher and Worker"),
        # a pod template without containers, whatever the replica count
        (_no_containers("Worker"), f"{SPECS}.Worker.template.spec.containers", "add at least one"),
        (_no_containers("Launcher", 0), f"{SPECS}.Launcher.replicas", "must be 1"),
        (
            _no_containers("Launcher"),
            f"{SPECS}.Launcher.template.spec.containers",
            "add at least one",
        ),
    ],
)
def test_malformed_mpijob_shapes_are_refused_naming_the_field_and_the_fix(
    template: dict[str, Any], field: str, why: str
) -> None:
    with pytest.raises(FieldError) as err:
        derive_pod_sets(template)
    assert err.value.field == field
    assert why in err.value.message


def test_a_launcher_only_mpijob_is_one_pod_set() -> None:
    """mpi-operator runs an MPIJob without a Worker spec (mpirun on the launcher alone)."""
    sets = derive_pod_sets(_without("Worker"))
    assert [(s.name, s.count) for s in sets] == [("launcher", 1)]


def test_a_launcher_without_replicas_is_one_pod() -> None:
    """mpi-operator defaults the launcher's replicas to 1."""
    tpl = mpijob(workers=3)
    del tpl["spec"]["mpiReplicaSpecs"]["Launcher"]["replicas"]
    assert [(s.name, s.count) for s in derive_pod_sets(tpl)] == [("launcher", 1), ("worker", 3)]


async def test_admission_fails_an_mpijob_without_a_launcher_and_sends_nothing() -> None:
    """Through intake and a scheduling cycle on an idle member: phase Failed, condition Valid
    False naming the field and the fix, no work sent (before: its workers were placed)."""
    t = Term()
    t.member("m1", hgx_node("n1"))
    s = t.connect("m1")
    sent(s)
    obj = gpujob_obj("mpi", "u1", template=_without("Launcher"))
    t.kube.objects["gpujobs"].append(obj)
    t.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()
    await t.ctrl.scheduler.cycle()
    await settle()
    job = t.ctrl.state.jobs["u1"]
    assert job.status.phase == "Failed"
    valid = next(c for c in job.status.conditions if c.type == "Valid")
    assert valid.status == "False"
    assert valid.message.startswith(f"{SPECS}.Launcher: an MPIJob needs a launcher")
    assert "add a Launcher replica spec" in valid.message
    assert sent(s) == []
