"""Jobs of hub namespaces no GPUQueue lists (``--unlisted-namespaces``,
``--default-queue-max-priority``) in a real leader term over typed fakes: with ``reject`` such a
job waits, naming its namespace and the fix, until a GPUQueue lists the namespace, while a job
of a listed namespace is placed as before; a job placed before (running when the hub restarts
with ``reject``) is never refused; the cap applies to the default queue only, and a GPUQueue
named like it that sets ``spec.maxPriority`` overrides it."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.components.config import HubConfig
from gpufed.hub.components.term import JobState
from tests.unit.hub.builders import batch_job, gpujob_obj, hgx_node
from tests.unit.hub.term import Term, settle
from tests.unit.hub.test_priorities import priorityclass
from tests.unit.hub.test_queues import gpuqueue

FIX = (
    "list namespace team-a in a GPUQueue's spec.namespaces, or run the hub with "
    "--unlisted-namespaces default-queue"
)


def reject_term(**config: Any) -> Term:
    """A term with ``--unlisted-namespaces reject`` over member m1 (two idle 8-GPU nodes);
    namespace team-b is listed by GPUQueue team-b, team-a by none."""
    t = Term(config=HubConfig(insecure=True, unlisted_namespaces="reject", **config))
    t.ctrl.intake.namespaces.seen("team-b", {})
    t.kube.objects["gpuqueues"].append(gpuqueue("team-b", namespaces=("team-b",)))
    t.ctrl.queues.listed(t.kube.objects["gpuqueues"])
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
    return t


async def submit(
    t: Term, name: str, uid: str, *, namespace: str = "team-a", **placement: Any
) -> None:
    obj: dict[str, Any] = gpujob_obj(name, uid, template=batch_job(8))
    obj["metadata"]["namespace"] = namespace
    obj["spec"]["placement"] = placement
    t.kube.objects["gpujobs"].append(obj)
    t.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()


async def judged(t: Term, **placement: Any) -> JobState:
    """Job ``ua`` of namespace team-a with ``placement``, after one scheduling cycle."""
    await submit(t, "a", "ua", **placement)
    await t.ctrl.scheduler.cycle()
    return t.ctrl.state.jobs["ua"]


# --- the flags -----------------------------------------------------------------------------------


def test_the_defaults_keep_today_s_behaviour() -> None:
    config = HubConfig(insecure=True)
    assert config.unlisted_namespaces == "default-queue"
    assert config.default_queue_max_priority is None


@pytest.mark.parametrize(
    "values",
    [
        {"unlisted_namespaces": "deny"},
        {"default_queue_max_priority": 2**31},
        {"default_queue_max_priority": -(2**31) - 1},
    ],
)
def test_a_bad_value_is_refused_by_the_config(values: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        HubConfig(insecure=True, **values)


# --- --unlisted-namespaces reject ----------------------------------------------------------------


async def test_reject_keeps_an_unlisted_job_pending_naming_its_namespace_and_the_fix() -> None:
    t = reject_term()
    job = await judged(t)
    assert job.status.phase == "Pending"
    placed = next(c for c in job.status.conditions if c.type == "Placed")
    assert (placed.status, placed.reason) == ("False", "NamespaceNotListed")
    assert "namespace team-a is listed by no GPUQueue" in placed.message
    assert placed.message.endswith(FIX)
    assert job.status.message == placed.message
    assert "place" not in t.store.calls, "nothing is placed, nothing dispatched"
    assert t.ctrl.state.work == {}
    await settle()  # Events go out after the status writes
    (event,) = [e for e in t.kube.events if e[1] == "NamespaceNotListed"]
    assert "namespace team-a" in event[2]
    assert ("GPUJob", "ua", "Warning", "NamespaceNotListed") in t.kube.event_refs
    # Not counted as a job waiting in the default queue.
    assert t.ctrl.metrics.queue_depth._value.get() == 0
    # Judged each cycle, but written once.
    events = list(t.kube.events)
    await t.ctrl.scheduler.cycle()
    await settle()
    assert t.kube.events == events


async def test_reject_leaves_jobs_of_listed_namespaces_alone() -> None:
    t = reject_term()
    await submit(t, "a", "ua")
    await submit(t, "b", "ub", namespace="team-b")
    await t.ctrl.scheduler.cycle()
    assert t.ctrl.state.jobs["ub"].status.phase == "Placed"
    assert t.store.jobs["ub"][0].queue == "team-b"
    assert t.ctrl.state.jobs["ua"].status.phase == "Pending"
    assert "ua" not in t.store.jobs


async def test_a_refused_job_is_placed_once_a_gpuqueue_lists_its_namespace() -> None:
    t = reject_term()
    await submit(t, "a", "ua")
    await t.ctrl.scheduler.cycle()
    assert t.ctrl.state.jobs["ua"].status.phase == "Pending"
    # The administrator lists team-a: the GPUQueue event kicks a cycle that places the job.
    listed = gpuqueue("team-b", namespaces=("team-b", "team-a"))
    listed["metadata"]["resourceVersion"] = "2"
    t.ctrl.intake._on_event("gpuqueues", WatchEvent("MODIFIED", listed))
    assert t.ctrl.state.cycle_due.is_set()
    await t.ctrl.scheduler.cycle()
    assert t.ctrl.state.jobs["ua"].status.phase == "Placed"
    assert t.store.jobs["ua"][0].queue == "team-b"


async def test_naming_the_default_queue_does_not_get_around_reject() -> None:
    t = reject_term()
    job = await judged(t, queue="default")
    assert job.status.phase == "Pending"
    assert job.status.message.endswith(FIX)
    assert "place" not in t.store.calls


async def test_default_queue_mode_places_an_unlisted_job_in_the_default_queue() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    await submit(t, "a", "ua")
    await t.ctrl.scheduler.cycle()
    assert t.ctrl.state.jobs["ua"].status.phase == "Placed"
    assert t.store.jobs["ua"][0].queue == "default"


async def test_a_job_placed_before_keeps_running_when_the_hub_restarts_with_reject() -> None:
    # Placed by a hub in default-queue mode; a new leader runs with reject.
    t = Term()
    t.member("m1", hgx_node("m1-n0"))
    await submit(t, "a", "ua")
    await t.ctrl.scheduler.cycle()
    assert t.store.jobs["ua"][0].cluster == "m1"
    calls = len(t.store.calls)
    t2 = Term(
        config=HubConfig(insecure=True, unlisted_namespaces="reject"), store=t.store, kube=t.kube
    )
    await t2.ctrl.load()
    t2.member("m1", hgx_node("m1-n0"))
    for obj in t.kube.objects["gpujobs"]:
        obj = {**obj, "status": t.ctrl.state.jobs["ua"].status.model_dump(by_alias=True)}
        t2.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()
    await t2.ctrl.scheduler.cycle()
    job = t2.ctrl.state.jobs["ua"]
    assert job.status.phase == "Placed"
    assert job.record is not None
    assert job.record.cluster == "m1"
    assert job.record.stopping is None
    assert not any(c in ("place", "preempt") for c in t.store.calls[calls:])
    assert not any(e[1] == "NamespaceNotListed" for e in t.kube.events)
    # Requeued later (its record without a cluster): it goes back to the default queue.
    job.record = job.record.model_copy(update={"cluster": None})
    assert t2.ctrl.queues.unlisted(job) is None


# --- --default-queue-max-priority ----------------------------------------------------------------


def capped_term(cap: int | None = 1000, *gpuqueues: dict[str, Any]) -> Term:
    """A term whose default queue is capped at ``cap`` by the flag; GPUQueue team-b (no cap)
    lists team-b; classes dev (100) and prod (5000); member m1 with two idle nodes."""
    t = Term(config=HubConfig(insecure=True, default_queue_max_priority=cap))
    t.ctrl.intake.namespaces.seen("team-b", {})
    t.kube.objects["gpuqueues"] += [gpuqueue("team-b", namespaces=("team-b",)), *gpuqueues]
    t.ctrl.queues.listed(t.kube.objects["gpuqueues"])
    t.ctrl.state.priorities.listed([priorityclass("dev", 100), priorityclass("prod", 5000)])
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
    return t


async def test_the_cap_fails_a_default_queue_job_above_it_naming_the_flag() -> None:
    t = capped_term()
    job = await judged(t, priorityClassName="prod")
    assert job.status.phase == "Failed"
    valid = next(c for c in job.status.conditions if c.type == "Valid")
    assert valid.status == "False"
    assert valid.message.startswith(
        "spec.placement.priorityClassName: PriorityClass prod has value 5000, above the cap of "
        "the default queue default (hub flag --default-queue-max-priority 1000)"
    )
    assert "place" not in t.store.calls


async def test_the_cap_applies_to_the_default_queue_only() -> None:
    t = capped_term()
    await submit(t, "a", "ua", priorityClassName="dev")
    await submit(t, "b", "ub", namespace="team-b", priorityClassName="prod")
    await t.ctrl.scheduler.cycle()
    assert t.store.jobs["ua"][0].priority == 100, "within the cap"
    record, _ = t.store.jobs["ub"]
    assert (record.queue, record.priority) == ("team-b", 5000), "another queue: no cap"


async def test_the_cap_lowers_an_implicit_default_priority_as_spec_max_priority_does() -> None:
    t = capped_term(10)
    t.ctrl.state.priorities.listed([priorityclass("normal", 500, default=True)])
    await submit(t, "a", "ua")
    await t.ctrl.scheduler.cycle()
    assert t.store.jobs["ua"][0].priority == 10


async def test_a_gpuqueue_named_default_with_max_priority_overrides_the_cap() -> None:
    own = gpuqueue("default")
    own["spec"]["maxPriority"] = 10_000
    t = capped_term(1000, own)
    await submit(t, "a", "ua", priorityClassName="prod")
    await t.ctrl.scheduler.cycle()
    assert t.store.jobs["ua"][0].priority == 5000
    cap = t.ctrl.queues.max_priority("default")
    assert cap is not None
    assert (cap.value, cap.flag) == (10_000, None)


async def test_a_gpuqueue_named_default_without_max_priority_keeps_the_cap() -> None:
    t = capped_term(1000, gpuqueue("default", nominal=16))
    cap = t.ctrl.queues.max_priority("default")
    assert cap is not None
    assert (cap.value, cap.flag) == (1000, "--default-queue-max-priority")
    assert t.ctrl.queues.max_priority("team-b") is None
