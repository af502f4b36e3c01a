"""GPUQueues in a real leader term over typed fakes (gpufed.hub.components.queues, gpufed.hub.components.scheduling):
admission by quota inside one pass, the ledger rebuilt from etcd records after a restart (never
doubled), quota changes at the next cycle, broken queues, the job -> queue rule, the GPUQueue
status and its gauges."""

from __future__ import annotations

from typing import Any

from gpufed.api.work import WorkloadStatus
from gpufed.hub.adapters.ports import WatchEvent
from tests.unit.hub.builders import hgx_node
from tests.unit.hub.fakes import FakeStore
from tests.unit.hub.term import Term, settle

H100 = "NVIDIA-H100-80GB-HBM3"


def gpuqueue(
    name: str,
    *,
    namespaces: tuple[str, ...] = (),
    nominal: int | None = None,
    parent: str | None = None,
    product: str = H100,
    borrowing: int | None = None,
) -> dict[str, Any]:
    """A GPUQueue object as the hub API serves it (one quota on ``product`` when ``nominal``)."""
    spec: dict[str, Any] = {"namespaces": list(namespaces)}
    if parent is not None:
        spec["parent"] = parent
    if nominal is not None:
        quota: dict[str, Any] = {"gpuProduct": product, "nominal": nominal}
        if borrowing is not None:
            quota["borrowingLimit"] = borrowing
        spec["quotas"] = [quota]
    return {
        "apiVersion": "gpufed.io/v1alpha1",
        "kind": "GPUQueue",
        "metadata": {"name": name, "uid": f"q-{name}", "resourceVersion": "1"},
        "spec": spec,
    }


def team_a_term(nominal: int, *, nodes: int = 3, store: FakeStore | None = None) -> Term:
    """A term whose GPUQueue ``team-a`` (namespace team-a) has ``nominal`` H100s, over a
    member ``m1`` of ``nodes`` idle 8-GPU H100 nodes."""
    t = Term(store=store or FakeStore())
    t.kube.objects["gpuqueues"].append(gpuqueue("team-a", namespaces=("team-a",), nominal=nominal))
    t.ctrl.queues.listed(t.kube.objects["gpuqueues"])
    t.member("m1", *(hgx_node(f"m1-n{i}") for i in range(nodes)))
    return t


def phases(t: Term) -> dict[str, str]:
    return {uid: j.status.phase for uid, j in sorted(t.ctrl.state.jobs.items())}


def last_queue_status(t: Term, name: str) -> dict[str, Any]:
    """The GPUQueue status the term computed last (what its mirror writes)."""
    return t.ctrl.queues.shown[name].model_dump(by_alias=True, mode="json", exclude_none=True)


async def test_two_jobs_of_one_pass_never_exceed_the_quota_together() -> None:
    # 24 free GPUs but a quota of 8: only one of two 8-GPU jobs is admitted in the same pass.
    t = team_a_term(8)
    await t.submit("a", "ua", gpus=8)
    await t.submit("b", "ub", gpus=8)
    await t.ctrl.scheduler.cycle()
    assert sorted(phases(t).values()) == ["Pending", "Placed"]
    placed = next(u for u, p in phases(t).items() if p == "Placed")
    record, _ = t.store.jobs[placed]
    assert (record.queue, record.charged) == ("team-a", {H100: 8})
    waiting = next(u for u, p in phases(t).items() if p == "Pending")
    message = t.ctrl.state.jobs[waiting].status.message
    assert f"team-a uses 8 of 8 {H100}; 8 more needed" in message


async def test_without_gpuqueues_every_job_is_admitted_as_before() -> None:
    t = Term()
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
    await t.submit("a", "ua", gpus=8)
    await t.submit("b", "ub", gpus=8)
    await t.ctrl.scheduler.cycle()
    assert set(phases(t).values()) == {"Placed"}
    assert t.store.jobs["ua"][0].queue == "default"


async def test_nothing_is_placed_before_the_first_gpuqueue_list() -> None:
    t = Term()
    t.ctrl.queues.synced.clear()
    t.member("m1", hgx_node("m1-n0"))
    await t.submit("a", "ua", gpus=8)
    await t.ctrl.scheduler.cycle()
    assert "place" not in t.store.calls
    t.ctrl.queues.listed([])
    await t.ctrl.scheduler.cycle()
    assert phases(t) == {"ua": "Placed"}


async def test_a_restarted_hub_rebuilds_usage_from_etcd_and_never_doubles_it() -> None:
    t = team_a_term(16)
    for i in range(3):
        await t.submit(f"j{i}", f"u{i}", gpus=8)
    await t.ctrl.scheduler.cycle()
    assert sorted(phases(t).values()) == ["Pending", "Placed", "Placed"]
    # A new leader term over the same etcd and hub API: the two placed jobs still count once.
    t2 = Term(store=t.store, kube=t.kube)
    await t2.ctrl.load()
    t2.ctrl.queues.listed(t.kube.objects["gpuqueues"])
    t2.member("m1", *(hgx_node(f"m1-n{i}") for i in range(3)))
    for obj in t.kube.objects["gpujobs"]:
        t2.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()
    for _ in range(2):  # two cycles: the ledger is rebuilt each time, never added to
        await t2.ctrl.scheduler.cycle()
    assert sorted(phases(t2).values()) == ["Pending", "Placed", "Placed"]
    assert t.store.calls.count("place") == 2
    usage = last_queue_status(t2, "team-a")["usage"]
    assert usage == [{"gpuProduct": H100, "nominal": 16, "used": 16, "borrowed": 0}]


async def test_records_without_a_queue_charge_their_jobs_queue_after_a_restart() -> None:
    # Records from before queues, and those the rebuild adopts after a loss of etcd state
    # (docs/design.md §7 item 7), carry no queue: they still count, on their status's product.
    t = team_a_term(16)
    for i in range(3):
        await t.submit(f"j{i}", f"u{i}", gpus=8)
    await t.ctrl.scheduler.cycle()
    await settle()
    for uid, (record, rev) in list(t.store.jobs.items()):
        t.store.jobs[uid] = (record.model_copy(update={"queue": None, "charged": {}}), rev)
    for obj in t.kube.objects["gpujobs"]:  # the statuses the mirror wrote (product, cluster)
        status = t.ctrl.state.jobs[obj["metadata"]["uid"]].status
        obj["status"] = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    t2 = Term(store=t.store, kube=t.kube)
    await t2.ctrl.load()
    t2.ctrl.queues.listed(t.kube.objects["gpuqueues"])
    t2.member("m1", *(hgx_node(f"m1-n{i}") for i in range(3)))
    for obj in t.kube.objects["gpujobs"]:
        t2.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()
    await t2.ctrl.scheduler.cycle()
    assert sorted(phases(t2).values()) == ["Pending", "Placed", "Placed"]
    usage = last_queue_status(t2, "team-a")["usage"]
    assert usage == [{"gpuProduct": H100, "nominal": 16, "used": 16, "borrowed": 0}]


async def test_a_raised_quota_admits_at_the_next_cycle_and_a_lowered_one_admits_nothing_new() -> (
    None
):
    t = team_a_term(16, nodes=4)
    for i in range(3):
        await t.submit(f"j{i}", f"u{i}", gpus=8)
    await t.ctrl.scheduler.cycle()
    assert list(phases(t).values()).count("Placed") == 2
    # raised: the waiting job goes at the next cycle
    t.ctrl.intake._on_event(
        "gpuqueues", WatchEvent("MODIFIED", gpuqueue("team-a", namespaces=("team-a",), nominal=24))
    )
    await t.ctrl.scheduler.cycle()
    assert set(phases(t).values()) == {"Placed"}
    # lowered below usage (24 used): nothing new is admitted, nothing running is touched
    t.ctrl.intake._on_event(
        "gpuqueues", WatchEvent("MODIFIED", gpuqueue("team-a", namespaces=("team-a",), nominal=8))
    )
    await t.submit("j3", "u3", gpus=8)
    await t.ctrl.scheduler.cycle()
    assert phases(t)["u3"] == "Pending"
    assert "team-a uses 24 of 8" in t.ctrl.state.jobs["u3"].status.message
    assert t.store.calls.count("place") == 3
    status = last_queue_status(t, "team-a")
    assert status["usage"] == [{"gpuProduct": H100, "nominal": 8, "used": 24, "borrowed": 16}]
    assert (status["pendingJobs"], status["admittedJobs"]) == (1, 3)


async def test_a_job_that_ends_gives_its_quota_back() -> None:
    t = team_a_term(8)
    s = t.connect("m1")
    await t.submit("a", "ua", gpus=8)
    await t.submit("b", "ub", gpus=8)
    await t.ctrl.scheduler.cycle()
    first = next(u for u, p in phases(t).items() if p == "Placed")
    second = "ub" if first == "ua" else "ua"
    rev = t.store.work[("m1", first)][1]
    t.ctrl.heard(s)
    await t.ctrl.handle(s, WorkloadStatus(job_uid=first, revision=rev, phase="Succeeded"))
    t.ctrl.state.want(second)
    await t.ctrl.scheduler.cycle()
    assert phases(t)[second] == "Placed"


async def test_jobs_of_a_broken_queue_wait_with_its_message_and_the_queue_says_why() -> None:
    t = Term()
    t.kube.objects["gpuqueues"] += [
        gpuqueue("team-a", namespaces=("team-a",), nominal=8, parent="research"),
        gpuqueue("research", nominal=64, parent="team-a"),
    ]
    t.ctrl.queues.listed(t.kube.objects["gpuqueues"])
    t.member("m1", hgx_node("m1-n0"))
    await t.submit("a", "ua", gpus=8)
    await t.ctrl.scheduler.cycle()
    job = t.ctrl.state.jobs["ua"]
    assert job.status.phase == "Pending"
    assert "queue team-a is not active: spec.parent" in job.status.message
    active = last_queue_status(t, "team-a")["conditions"][0]
    assert (active["type"], active["status"], active["reason"]) == (
        "Active",
        "False",
        "InvalidSpec",
    )
    assert active["message"].startswith("spec.parent")


async def test_a_spec_that_does_not_validate_breaks_only_its_queue_naming_the_field() -> None:
    t = Term()
    bad = gpuqueue("team-a", namespaces=("team-a",), nominal=8)
    bad["spec"]["quotas"][0]["nominal"] = -1
    t.kube.objects["gpuqueues"] += [bad, gpuqueue("team-b", namespaces=("team-b",), nominal=8)]
    t.ctrl.queues.listed(t.kube.objects["gpuqueues"])
    assert t.ctrl.queues.tree.broken["team-a"].startswith("spec.quotas[0].nominal:")
    assert "team-b" in t.ctrl.queues.tree.nodes
    t.ctrl.queues.refresh()
    await settle()
    assert last_queue_status(t, "team-b")["conditions"][0]["status"] == "True"
    assert last_queue_status(t, "team-a")["conditions"][0]["status"] == "False"


async def test_a_job_naming_a_queue_that_does_not_list_its_namespace_fails_naming_the_field() -> (
    None
):
    t = Term()
    t.kube.objects["gpuqueues"] += [
        gpuqueue("team-a", namespaces=("team-a",), nominal=8),
        gpuqueue("team-b", namespaces=("team-b",), nominal=8),
    ]
    t.ctrl.queues.listed(t.kube.objects["gpuqueues"])
    t.member("m1", hgx_node("m1-n0"))
    obj_placement = {"queue": "team-b"}
    await t.submit("a", "ua", gpus=8)
    job = t.ctrl.state.jobs["ua"]
    job.obj.spec.placement.queue = obj_placement["queue"]
    await t.ctrl.scheduler.cycle()
    status = t.ctrl.state.jobs["ua"].status
    assert status.phase == "Failed"
    valid = next(c for c in status.conditions if c.type == "Valid")
    assert valid.status == "False"
    assert valid.message.startswith("spec.placement.queue: queue team-b does not list namespace")
    assert "place" not in t.store.calls


async def test_the_queue_status_and_gauges_show_usage_pending_and_fair_share() -> None:
    t = team_a_term(8)
    await t.submit("a", "ua", gpus=8)
    await t.submit("b", "ub", gpus=8)
    await t.ctrl.scheduler.cycle()
    await settle()
    status = last_queue_status(t, "team-a")
    assert status["conditions"][0]["type"] == "Active"
    assert status["conditions"][0]["status"] == "True"
    assert (status["pendingJobs"], status["admittedJobs"]) == (1, 1)
    assert "fairShare" in status
    registry = t.ctrl.metrics.registry
    used = registry.get_sample_value(
        "gpufed_queue_gpus", {"queue": "team-a", "gpu_product": H100, "state": "used"}
    )
    pending = registry.get_sample_value("gpufed_queue_pending_jobs", {"queue": "team-a"})
    assert (used, pending) == (8.0, 1.0)
    # the queue is deleted: its series go
    t.ctrl.intake._on_event("gpuqueues", WatchEvent("DELETED", {"metadata": {"name": "team-a"}}))
    t.ctrl.queues.refresh()
    assert registry.get_sample_value("gpufed_queue_pending_jobs", {"queue": "team-a"}) is None


async def test_fair_share_history_survives_a_new_leader_term() -> None:
    # Decayed usage lived only in the term's memory: a new leader started every queue at 0.
    store = FakeStore()
    t = team_a_term(8, store=store)
    await t.submit("a", "ua", gpus=8)
    await t.ctrl.scheduler.cycle()
    t.ctrl.queues.refresh()
    t.clock.advance(3600)  # one hour of 8 GPUs
    t.ctrl.queues.refresh()
    await t.ctrl.queues.save_history()
    assert store.fair_share is not None
    saved = store.fair_share.values["team-a"]
    assert 8 * 3600 * 0.97 < saved < 8 * 3600  # decays a little within the hour
    t2 = Term(store=store, kube=t.kube)
    await t2.ctrl.load()
    t2.ctrl.queues.listed(t.kube.objects["gpuqueues"])
    assert t2.ctrl.queues.decayed.value("team-a") == saved
    await t2.ctrl.queues.save_history()  # saved again at once by the new term, not zeroed
    assert store.fair_share.values["team-a"] > 0


async def test_a_status_write_coming_back_through_the_watch_does_not_rebuild_the_tree() -> None:
    t = team_a_term(8)
    tree = t.ctrl.queues.tree
    echoed = gpuqueue("team-a", namespaces=("team-a",), nominal=8)
    echoed["status"] = {"pendingJobs": 0}
    assert t.ctrl.queues.on_event("MODIFIED", echoed) is False
    assert t.ctrl.queues.tree is tree


async def test_queue_status_is_written_fenced_at_the_resource_version_it_read() -> None:
    t = team_a_term(8)
    t.ctrl.mirror.start()
    try:
        await t.submit("a", "ua", gpus=8)
        await t.ctrl.scheduler.cycle()
        await settle()
        await t.ctrl.mirror.queues.drained()
        name, written = t.kube.queue_statuses[-1]
        assert name == "team-a"
        assert written["usage"] == [{"gpuProduct": H100, "nominal": 8, "used": 8, "borrowed": 0}]
        assert t.kube.requests["get_queue"] == 1, "the first write of the term reads its rv"
        # someone else wrote the queue since: 409, read again, write again
        t.kube.bump(t.kube.objects["gpuqueues"][0])
        await t.submit("b", "ub", gpus=8)
        await t.ctrl.scheduler.cycle()
        await settle()
        for _ in range(50):
            await t.ctrl.mirror.queues.drained()
            if t.kube.queue_statuses[-1][1].get("pendingJobs") == 1:
                break
            await settle()
        assert t.kube.queue_statuses[-1][1]["pendingJobs"] == 1
    finally:
        await t.ctrl.mirror.stop()


async def test_the_status_keeps_a_days_fair_share_one_sample_per_15_minutes() -> None:
    # issue 30: the console's fair-share plot over the last day, from the hub, not the console
    t = team_a_term(8)
    t.ctrl.queues.refresh()
    assert len(t.ctrl.queues.shown["team-a"].fair_share_history) == 1
    t.clock.advance(600)
    t.ctrl.queues.refresh()
    assert len(t.ctrl.queues.shown["team-a"].fair_share_history) == 1, "one per 15 minutes"
    t.clock.advance(300)
    t.ctrl.queues.refresh()
    history = t.ctrl.queues.shown["team-a"].fair_share_history
    assert len(history) == 2
    for _ in range(200):
        t.clock.advance(900)
        t.ctrl.queues.refresh()
    assert len(t.ctrl.queues.shown["team-a"].fair_share_history) == 96, "a day, bounded"
    # a new leader carries the day on from the status it lists (a bad sample is dropped)
    obj = gpuqueue("team-a", namespaces=("team-a",), nominal=8)
    samples = [
        s.model_dump(by_alias=True) for s in t.ctrl.queues.shown["team-a"].fair_share_history
    ]
    obj["status"] = {"fairShareHistory": [{"time": "yesterday", "value": "1"}, *samples[1:]]}
    t2 = Term(store=t.store, clock=t.clock)
    t2.ctrl.queues.listed([obj])
    t2.ctrl.queues.refresh()
    kept = t2.ctrl.queues.shown["team-a"].fair_share_history
    assert [s.time for s in kept] == [s["time"] for s in samples[1:]], "carried on, not resampled"


async def test_a_pending_job_out_of_the_wanted_set_follows_its_queue_without_a_mark() -> None:
    # A job waiting out a timer (the lifecycle's WaitUntil takes it out of the wanted set) is
    # still pending in its queue; when the GPUQueues are re-listed so that another queue lists
    # its namespace, nothing marks the job, and the next publish still counts it there.
    t = team_a_term(8, nodes=1)
    await t.submit("a", "ua", gpus=8)
    await t.submit("b", "ub", gpus=8)
    await t.ctrl.scheduler.cycle()
    waiting = next(u for u, p in phases(t).items() if p == "Pending")
    t.ctrl.state.wanted.discard(waiting)
    assert t.ctrl.queues.shown["team-a"].pending_jobs == 1
    t.kube.objects["gpuqueues"][:] = [
        gpuqueue("team-a", namespaces=(), nominal=8),
        gpuqueue("team-b", namespaces=("team-a",), nominal=8),
    ]
    t.ctrl.queues.listed(t.kube.objects["gpuqueues"])
    t.ctrl.queues.publish({}, recount=False)
    assert t.ctrl.queues.shown["team-b"].pending_jobs == 1
    assert t.ctrl.queues.shown["team-a"].pending_jobs == 0
