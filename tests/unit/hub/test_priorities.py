"""A GPUJob's priority from a PriorityClass on the hub (gpufed.hub.rules.admission): where the class
comes from, the deprecated free integer, resolution (default class, missing class, system
classes, the GPUQueue's cap), and in a real leader term over typed fakes: a job whose class does
not exist waits and is placed once it appears, a class above the queue's cap fails the job, the
job record keeps the priority the job was placed with."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.api.errors import FieldError
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.rules.admission import (
    PriorityClasses,
    PrioritySource,
    priority_source,
)
from tests.unit.hub.builders import batch_job, gpujob, gpujob_obj, hgx_node, jobset
from tests.unit.hub.term import Term, settle


def priorityclass(
    name: str, value: int, *, policy: str | None = None, default: bool = False
) -> dict[str, Any]:
    """A ``scheduling.k8s.io/v1`` PriorityClass as the hub API serves it."""
    obj: dict[str, Any] = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "resourceVersion": "1"},
        "value": value,
    }
    if policy is not None:
        obj["preemptionPolicy"] = policy
    if default:
        obj["globalDefault"] = True
    return obj


def classes(*objs: dict[str, Any]) -> PriorityClasses:
    pcs = PriorityClasses()
    pcs.listed(objs)
    return pcs


# --- where the class comes from --------------------------------------------------------------


def test_the_spec_names_the_class_before_the_pod_template() -> None:
    job = gpujob(
        batch_job(priorityClassName="from-template"),
        placement={"priorityClassName": "prod"},
    )
    assert priority_source(job, placed=False) == PrioritySource(
        "prod", "spec.placement.priorityClassName", 0
    )


def test_without_a_spec_class_the_pod_template_names_it_at_its_field() -> None:
    src = priority_source(gpujob(batch_job(priorityClassName="prod")), placed=False)
    assert src.class_name == "prod"
    assert src.field == "spec.template.spec.template.spec.priorityClassName"


def test_pod_templates_naming_different_classes_are_refused_naming_the_spec_field() -> None:
    template = jobset(("a", 1, 1, 8), ("b", 1, 1, 8))
    rjs = template["spec"]["replicatedJobs"]
    rjs[0]["template"]["spec"]["template"]["spec"]["priorityClassName"] = "prod"
    rjs[1]["template"]["spec"]["template"]["spec"]["priorityClassName"] = "dev"
    with pytest.raises(FieldError) as exc:
        priority_source(gpujob(template), placed=False)
    assert exc.value.field == "spec.placement.priorityClassName"
    assert "dev, prod" in exc.value.message


def test_a_positive_free_priority_is_refused_for_a_new_job_and_kept_for_a_placed_one() -> None:
    job = gpujob(placement={"priority": 100})
    with pytest.raises(FieldError) as exc:
        priority_source(job, placed=False)
    assert exc.value.field == "spec.placement.priority"
    assert "priorityClassName" in exc.value.message
    assert priority_source(job, placed=True).value == 100


def test_a_free_priority_together_with_a_class_is_refused() -> None:
    job = gpujob(placement={"priority": -5, "priorityClassName": "prod"})
    with pytest.raises(FieldError) as exc:
        priority_source(job, placed=False)
    assert exc.value.field == "spec.placement.priority"


def test_a_negative_free_priority_without_a_class_is_accepted() -> None:
    src = priority_source(gpujob(placement={"priority": -10}), placed=False)
    assert (src.class_name, src.value) == (None, -10)
    assert classes().resolve(src, queue="q", cap=None).priority == -10


# --- resolution ------------------------------------------------------------------------------


def test_a_named_class_gives_its_value_and_preemption_policy() -> None:
    pcs = classes(priorityclass("prod", 100_000, policy="Never"))
    res = pcs.resolve(PrioritySource("prod"), queue="q", cap=None)
    assert (res.priority, res.preemption_policy, res.waiting, res.error) == (
        100_000,
        "Never",
        None,
        None,
    )
    # preemptionPolicy unset: the Kubernetes default
    pcs.on_event("MODIFIED", priorityclass("prod", 100_000))
    assert pcs.resolve(PrioritySource("prod"), queue="q", cap=None).preemption_policy == (
        "PreemptLowerPriority"
    )


def test_no_class_means_the_lowest_global_default_else_zero() -> None:
    assert classes().resolve(PrioritySource(), queue="q", cap=None).priority == 0
    pcs = classes(
        priorityclass("high-default", 500, default=True),
        priorityclass("low-default", 50, default=True, policy="Never"),
        priorityclass("prod", 1000),
    )
    res = pcs.resolve(PrioritySource(), queue="q", cap=None)
    assert (res.priority, res.class_name, res.preemption_policy) == (50, "low-default", "Never")


def test_a_missing_class_waits_with_a_message_naming_it_and_how_to_create_it() -> None:
    res = classes().resolve(PrioritySource("prod"), queue="q", cap=None)
    assert res.error is None
    assert res.waiting is not None
    assert "PriorityClass prod (spec.placement.priorityClassName) does not exist" in res.waiting
    assert "kubectl create priorityclass prod --value=" in res.waiting


def test_a_class_above_the_queue_cap_is_an_error_naming_the_field_and_the_cap() -> None:
    pcs = classes(priorityclass("prod", 100_000))
    src = PrioritySource("prod", "spec.template.spec.template.spec.priorityClassName")
    res = pcs.resolve(src, queue="team-a", cap=1000)
    assert res.error_field == "spec.template.spec.template.spec.priorityClassName"
    assert res.error is not None
    assert "GPUQueue team-a (spec.maxPriority 1000)" in res.error
    assert pcs.resolve(src, queue="team-a", cap=100_000).priority == 100_000


def test_the_implicit_default_is_lowered_to_the_cap_instead_of_failing() -> None:
    pcs = classes(priorityclass("normal", 1000, default=True))
    res = pcs.resolve(PrioritySource(), queue="team-a", cap=10)
    assert (res.priority, res.error) == (10, None)


def test_system_classes_are_refused() -> None:
    pcs = classes(priorityclass("system-node-critical", 2_000_001_000))
    res = pcs.resolve(PrioritySource("system-node-critical"), queue="q", cap=None)
    assert res.error is not None
    assert "cluster's own components" in res.error


def test_a_relist_forgets_deleted_classes_and_unreadable_ones_are_skipped() -> None:
    pcs = classes(priorityclass("prod", 1), priorityclass("dev", 0))
    pcs.listed([priorityclass("dev", 0), {"metadata": {"name": "bad"}, "value": "high"}])
    assert (pcs.get("prod"), pcs.get("bad"), len(pcs)) == (None, None, 1)


# --- in a leader term ------------------------------------------------------------------------


async def submit(t: Term, name: str, uid: str, placement: dict[str, Any]) -> None:
    obj = gpujob_obj(name, uid)
    obj["spec"]["placement"] = placement
    t.kube.objects["gpujobs"].append(obj)
    t.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()


async def test_a_job_whose_class_is_missing_waits_and_is_placed_once_it_appears() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    await submit(t, "a", "ua", {"priorityClassName": "prod"})
    await t.ctrl.scheduler.cycle()
    job = t.ctrl.state.jobs["ua"]
    assert job.status.phase == "Pending"
    placed = next(c for c in job.status.conditions if c.type == "Placed")
    assert (placed.status, placed.reason) == ("False", "PriorityClassNotFound")
    assert "PriorityClass prod" in job.status.message
    assert "place" not in t.store.calls
    # The class appears: the watch event kicks a cycle that places the job at its value.
    t.ctrl.intake._on_event("priorityclasses", WatchEvent("ADDED", priorityclass("prod", 7000)))
    assert t.ctrl.state.cycle_due.is_set()
    await t.ctrl.scheduler.cycle()
    assert job.status.phase == "Placed"
    assert job.request is not None
    assert job.request.priority == 7000
    record, _ = t.store.jobs["ua"]
    assert (record.priority, record.preemption_policy) == (7000, "PreemptLowerPriority")


async def test_a_class_above_the_gpuqueue_cap_fails_the_job_with_valid_false() -> None:
    t = Term()
    t.kube.objects["gpuqueues"].append(
        {
            "apiVersion": "gpufed.io/v1alpha1",
            "kind": "GPUQueue",
            "metadata": {"name": "team-a", "uid": "q1", "resourceVersion": "1"},
            "spec": {"namespaces": ["team-a"], "maxPriority": 1000},
        }
    )
    t.ctrl.queues.listed(t.kube.objects["gpuqueues"])
    t.ctrl.state.priorities.listed(
        [priorityclass("critical", 1_000_000), priorityclass("dev", 100)]
    )
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
    await submit(t, "a", "ua", {"priorityClassName": "critical"})
    await submit(t, "b", "ub", {"priorityClassName": "dev"})
    await t.ctrl.scheduler.cycle()
    bad = t.ctrl.state.jobs["ua"]
    assert bad.status.phase == "Failed"
    valid = next(c for c in bad.status.conditions if c.type == "Valid")
    assert valid.status == "False"
    assert "spec.placement.priorityClassName" in bad.status.message
    assert "spec.maxPriority 1000" in bad.status.message
    assert t.ctrl.state.jobs["ub"].status.phase == "Placed"


async def test_nothing_is_placed_before_the_first_priorityclass_list() -> None:
    t = Term()
    t.ctrl.state.priorities.synced.clear()
    t.member("m1", hgx_node("m1-n0"))
    await submit(t, "a", "ua", {})
    await t.ctrl.scheduler.cycle()
    assert "place" not in t.store.calls
    t.ctrl.state.priorities.listed([priorityclass("normal", 5, default=True)])
    await t.ctrl.scheduler.cycle()
    assert t.store.jobs["ua"][0].priority == 5


async def test_a_placed_job_keeps_the_priority_of_its_record_after_a_restart() -> None:
    t = Term()
    t.ctrl.state.priorities.listed([priorityclass("prod", 7000)])
    t.member("m1", hgx_node("m1-n0"))
    await submit(t, "a", "ua", {"priorityClassName": "prod"})
    await t.ctrl.scheduler.cycle()
    # A new term whose hub cluster lost the class: the placed job keeps 7000.
    t2 = Term(store=t.store, kube=t.kube)
    t2.ctrl.restore(await t.store.load())
    t2.ctrl.intake.on_job_event(WatchEvent("ADDED", t.kube.objects["gpujobs"][0]))
    await settle()
    job = t2.ctrl.state.jobs["ua"]
    assert job.request is not None
    assert job.request.priority == 7000
    assert job.error is None
