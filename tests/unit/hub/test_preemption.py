"""Preemption at the hub (gpufed.hub.components.preemption) through a real leader term over typed fakes:
the cheapest block is freed, the plan is committed in one etcd transaction before any Delete,
the freed GPUs are held for the preemptor until it is placed there, the victims come back
Pending with ``Preempted``, and a hub killed between the commit and the Deletes resumes them
without preempting twice."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpufed.api.inventory import NodeInventory
from gpufed.api.stream import InventoryDelta
from gpufed.api.work import WorkAck
from gpufed.cli.jobs import explain_text
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.adapters.sessions import AgentSession
from gpufed.hub.components.config import HubConfig
from tests.unit.hub.builders import batch_job, gpujob_obj, hgx_node
from tests.unit.hub.fakes import FakeStore
from tests.unit.hub.term import Term, sent, settle
from tests.unit.hub.test_priorities import priorityclass

LOW, HIGH = 100, 1000


def node(name: str, **jobs: int) -> NodeInventory:
    """An 8-GPU HGX node running ``jobs`` (uid -> GPUs)."""
    base = hgx_node(name)
    req = {"nvidia.com/gpu": sum(jobs.values())} if jobs else {}
    return base.model_copy(
        update={
            "requested": req,
            "job_requests": {u: {"nvidia.com/gpu": g} for u, g in jobs.items()},
        }
    )


class Fleet:
    """A term with member m1 (nodes m1-n0, m1-n1) and its agent's stream."""

    def __init__(self, t: Term) -> None:
        self.t = t
        self.seq = 1
        t.ctrl.state.priorities.listed(
            [priorityclass("low", LOW), priorityclass("high", HIGH, policy="PreemptLowerPriority")]
        )
        t.member("m1", node("m1-n0"), node("m1-n1"))
        self.s: AgentSession = t.connect("m1")
        sent(self.s)

    def report(self, *nodes: NodeInventory) -> None:
        self.seq += 1
        self.t.ctrl.members.on_delta(
            self.t.ctrl.state.members["m1"], InventoryDelta(seq=self.seq, upserts=nodes)
        )

    async def submit(self, name: str, uid: str, gpus: int, cls: str) -> None:
        obj: dict[str, Any] = gpujob_obj(name, uid, template=batch_job(gpus))
        obj["spec"]["placement"] = {"priorityClassName": cls}
        self.t.kube.objects["gpujobs"].append(obj)
        self.t.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
        await settle()

    async def ack(self, op: str, result: str) -> list[str]:
        """Ack every ``op`` item sent since the last call with ``result``; their job uids."""
        uids = []
        for kind, uid, rev in sent(self.s):
            if kind == op:
                await self.t.ctrl.handle(self.s, WorkAck(job_uid=uid, revision=rev, result=result))
                uids.append(uid)
        await settle()
        return sorted(uids)


async def full_member(t: Term) -> Fleet:
    """m1 full of low-priority 4-GPU jobs: l0, l1 on m1-n0 (started first: more work to
    lose), l2, l3 on m1-n1 (started 100 s later)."""
    f = Fleet(t)
    for i in range(4):
        await f.submit(f"l{i}", f"l{i}", 4, "low")
    await t.ctrl.scheduler.cycle()
    placed = {u: t.store.jobs[u][0].cluster for u in ("l0", "l1", "l2", "l3")}
    assert placed == dict.fromkeys(placed, "m1")
    items = sent(f.s)
    by_node = {u: json.loads(t.store.reservations[u])["nodes"] for u in placed}
    n0 = sorted(u for u, n in by_node.items() if "m1-n0" in n)
    n1 = sorted(u for u, n in by_node.items() if "m1-n1" in n)
    assert len(n0) == len(n1) == 2
    for first in (n0, n1):
        for _kind, uid, rev in items:
            if uid in first:
                await t.ctrl.handle(f.s, WorkAck(job_uid=uid, revision=rev, result="Applied"))
        await settle()
        t.clock.advance(100)
    f.n0, f.n1 = n0, n1
    f.report(node("m1-n0", **dict.fromkeys(n0, 4)), node("m1-n1", **dict.fromkeys(n1, 4)))
    await settle()
    return f


async def test_a_high_priority_job_frees_the_cheapest_node_and_runs_there() -> None:
    t = Term()
    f = await full_member(t)
    await f.submit("hi", "uh", 8, "high")
    await t.ctrl.scheduler.cycle()
    await settle()
    # One transaction: the hold on m1-n1 and both victims' marks, before any Delete.
    assert t.store.calls.count("preempt") == 1
    assert t.store.calls.index("preempt") < len(t.store.calls) - 1
    assert json.loads(t.store.reservations["uh"])["nodes"] == {"m1-n1": {"nvidia.com/gpu": 8}}
    for v in f.n1:
        cause = t.store.jobs[v][0].stopping
        assert cause is not None
        assert (cause.by_uid, cause.cluster) == ("uh", "m1")
    for keep in f.n0:
        assert t.store.jobs[keep][0].stopping is None
    hi = t.ctrl.state.jobs["uh"]
    assert hi.status.phase == "Pending"
    assert hi.status.preemption is not None
    assert sorted(v.job for v in hi.status.preemption.victims) == [f"team-a/{v}" for v in f.n1]
    assert hi.status.preemption.nodes == ["m1-n1"]
    assert t.ctrl.metrics.preemptions.labels("m1", "priority")._value.get() == 2
    assert await f.ack("delete", "Deleted") == f.n1, "only the victims' copies are deleted"
    # Deleted, pods still terminating: the GPUs are not free, the preemptor waits.
    await t.ctrl.scheduler.cycle()
    assert hi.status.phase == "Pending"
    assert t.store.calls.count("preempt") == 1, "never preempts twice"
    # The pods are gone: the freed node is held for the preemptor, no one else sees it.
    f.report(node("m1-n1"))
    await settle()
    assert t.ctrl.snapshot.free("m1", "m1-n1") == 0
    for v in f.n1:
        job = t.ctrl.state.jobs[v]
        assert job.status.phase == "Pending"
        assert job.status.preemptions == 1
        cond = next(c for c in job.status.conditions if c.type == "Preempted")
        assert cond.status == "True"
        assert "team-a/hi" in cond.message
        assert "m1-n1" in cond.message
    await t.ctrl.scheduler.cycle()
    assert hi.status.phase == "Placed"
    assert hi.status.placement is not None
    assert [sorted(ps.nodes) for ps in hi.status.placement.pod_sets] == [["m1-n1"]]
    assert hi.status.preemption is not None, "kept for gpufed explain"
    raw = {**t.kube.objects["gpujobs"][-1], "status": hi.status.model_dump(by_alias=True)}
    text = explain_text(raw)
    assert "preempted 2 job(s) in m1 to free node:m1-n1" in text
    for v in f.n1:
        assert f"team-a/{v}  priority {LOW}" in text
    for v in f.n1:  # nowhere to go: they wait, and do not preempt (equal priority)
        assert t.ctrl.state.jobs[v].status.phase == "Pending"
    assert t.store.calls.count("preempt") == 1


async def test_a_never_policy_and_equal_priority_preempt_nothing() -> None:
    t = Term()
    f = await full_member(t)
    t.ctrl.state.priorities.listed(
        [priorityclass("low", LOW), priorityclass("polite", HIGH, policy="Never")]
    )
    await f.submit("peer", "up", 8, "low")
    await f.submit("polite", "uq", 8, "polite")
    await t.ctrl.scheduler.cycle()
    assert "preempt" not in t.store.calls
    assert "preempting nothing" in t.ctrl.state.jobs["up"].status.message


async def test_preemption_off_in_the_config_preempts_nothing() -> None:
    t = Term(config=HubConfig(insecure=True, preemption=False))
    f = await full_member(t)
    await f.submit("hi", "uh", 8, "high")
    await t.ctrl.scheduler.cycle()
    assert "preempt" not in t.store.calls


async def test_a_minimum_runtime_keeps_young_jobs_running() -> None:
    t = Term(config=HubConfig(insecure=True, preemption_min_runtime_s=3600))
    f = await full_member(t)
    await f.submit("hi", "uh", 8, "high")
    await t.ctrl.scheduler.cycle()
    assert "preempt" not in t.store.calls
    assert "not eligible" in t.ctrl.state.jobs["uh"].status.message


class KilledError(Exception):
    """The hub process dies here."""


async def test_a_hub_killed_between_the_commit_and_the_deletes_resumes_them() -> None:
    store = FakeStore()
    t = Term(store=store)
    f = await full_member(t)
    await f.submit("hi", "uh", 8, "high")

    async def die(*_: object, **__: object) -> None:
        raise KilledError

    t.ctrl.dispatch.ensure_delete = die  # type: ignore[method-assign]
    with pytest.raises(KilledError):
        await t.ctrl.scheduler.cycle()
    assert store.calls.count("preempt") == 1
    assert all(store.work[("m1", v)][0].op == "Apply" for v in f.n1), "nothing deleted yet"
    # A new leader over the same etcd and hub API.
    t2 = Term(store=store, kube=t.kube)
    await t2.ctrl.load()
    f2 = Fleet(t2)
    f2.report(node("m1-n0", **dict.fromkeys(f.n0, 4)), node("m1-n1", **dict.fromkeys(f.n1, 4)))
    for obj in t.kube.objects["gpujobs"]:
        t2.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()
    assert t2.ctrl.snapshot.reservation("uh") is not None, "the hold survived"
    assert all(store.work[("m1", v)][0].op == "Delete" for v in f.n1), "deletes resumed"
    await t2.ctrl.scheduler.cycle()
    assert store.calls.count("preempt") == 1, "never preempts twice"
    assert await f2.ack("delete", "Deleted") == f.n1
    f2.report(node("m1-n1"))
    await settle()
    await t2.ctrl.scheduler.cycle()
    hi = t2.ctrl.state.jobs["uh"]
    assert hi.status.phase == "Placed"
    assert store.jobs["uh"][0].cluster == "m1"
    assert all(t2.ctrl.state.jobs[v].status.phase == "Pending" for v in f.n1)


async def team_b_borrows(
    t: Term, *, team_a: int, jobs: tuple[str, ...], cls: str, free: tuple[str, ...] = ()
) -> tuple[Fleet, dict[str, str]]:
    """GPUQueues org over team-a (nominal ``team_a``) and team-b (nominal 8); m1 (plus the
    free nodes ``free``) runs team-b's 8-GPU ``jobs`` of class ``cls``, one a node, reported
    by the member; returns the fleet and each job's node."""
    from tests.unit.hub.test_queues import gpuqueue

    t.ctrl.intake.namespaces.seen("team-b", {})
    t.kube.objects["gpuqueues"] += [
        gpuqueue("org"),
        gpuqueue("team-a", namespaces=("team-a",), nominal=team_a, parent="org"),
        gpuqueue("team-b", namespaces=("team-b",), nominal=8, parent="org"),
    ]
    t.ctrl.queues.listed(t.kube.objects["gpuqueues"])
    f = Fleet(t)
    if free:
        f.report(*(node(n) for n in free))
    for uid in jobs:
        obj: dict[str, Any] = gpujob_obj(uid, uid, template=batch_job(8))
        obj["metadata"]["namespace"] = "team-b"
        obj["spec"]["placement"] = {"priorityClassName": cls}
        t.kube.objects["gpujobs"].append(obj)
        t.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()
    await t.ctrl.scheduler.cycle()
    assert {t.store.jobs[u][0].cluster for u in jobs} == {"m1"}, "team-b borrows"
    await f.ack("apply", "Applied")
    nodes = {u: next(iter(json.loads(t.store.reservations[u])["nodes"])) for u in jobs}
    f.report(*(node(n, **{u: 8}) for u, n in nodes.items()))
    await settle()
    return f, nodes


async def test_a_queue_below_its_nominal_reclaims_from_a_borrowing_queue() -> None:
    # team-b borrows team-a's unused 8 GPUs; team-a's job (same priority) reclaims them.
    t = Term()
    f, _ = await team_b_borrows(t, team_a=8, jobs=("b0", "b1"), cls="low")
    await f.submit("a", "ua", 8, "low")
    await t.ctrl.scheduler.cycle()
    stopping = {u: t.store.jobs[u][0].stopping for u in ("b0", "b1")}
    reclaimed = [c for c in stopping.values() if c is not None]
    assert len(reclaimed) == 1, stopping
    assert (reclaimed[0].reason, reclaimed[0].by_uid) == ("Reclaimed", "ua")
    assert t.ctrl.metrics.preemptions.labels("m1", "reclaim")._value.get() == 1


async def test_two_preemptors_of_one_cycle_each_free_their_own_node() -> None:
    # The cycle's second plan never counts the GPUs freed for the first (never over-frees).
    f = await full_member(Term())
    t = f.t
    await f.submit("hi1", "uh1", 8, "high")
    await f.submit("hi2", "uh2", 8, "high")
    await t.ctrl.scheduler.cycle()
    assert t.store.calls.count("preempt") == 2
    held = [set(json.loads(t.store.reservations[u])["nodes"]) for u in ("uh1", "uh2")]
    assert sorted(map(sorted, held)) == [["m1-n0"], ["m1-n1"]]
    assert sum(1 for r, _ in t.store.jobs.values() if r.stopping is not None) == 4


async def test_a_job_that_found_no_plan_is_searched_again_only_after_a_pause() -> None:
    # A full fleet is not searched in every cycle for the same hopeless job.
    t = Term(config=HubConfig(insecure=True, preemption_min_runtime_s=3600))
    f = await full_member(t)
    await f.submit("hi", "uh", 8, "high")
    await t.ctrl.scheduler.cycle()
    planning = t.ctrl.metrics.preemption_planning_seconds

    def plans() -> float:
        return next(s.value for s in planning.collect()[0].samples if s.name.endswith("_count"))

    assert plans() == 1
    message = t.ctrl.state.jobs["uh"].status.message
    assert "preempting nothing" in message
    t.ctrl.state.want("uh")
    await t.ctrl.scheduler.cycle()
    assert plans() == 1, "not searched again at once"
    assert t.ctrl.state.jobs["uh"].status.message == message, "its answer stands meanwhile"
    t.clock.advance(31)
    t.ctrl.state.want("uh")
    await t.ctrl.scheduler.cycle()
    assert plans() == 2


async def test_running_rows_carry_each_job_s_submit_time_on_the_started_at_clock() -> None:
    # withinQueue LowerOrNewerEqualPriority orders equal-priority victims by submit time: the
    # hub's Running rows must carry the request's submitted_at (creationTimestamp, wall s).
    t = Term()
    await full_member(t)
    rows = {r.uid: r for r in t.ctrl.scheduler._preemption.running()}
    assert sorted(rows) == ["l0", "l1", "l2", "l3"]
    created = 1_767_225_600.0  # the builders' creationTimestamp, 2026-01-01T00:00:00Z
    for uid, row in rows.items():
        request = t.ctrl.state.jobs[uid].request
        assert request is not None
        assert row.submitted_at == request.submitted_at == created
        assert row.started_at >= row.submitted_at, "the same clock as started_at"


async def test_a_hold_outlives_its_ttl_while_its_victims_stop() -> None:
    # issue 23: a victim's grace period may outlast the reservation TTL; the freed GPUs stay
    # the preemptor's until its victims are gone, whatever the TTL.
    t = Term(config=HubConfig(insecure=True, reservation_ttl_s=60))
    f = await full_member(t)
    await f.submit("hi", "uh", 8, "high")
    await t.ctrl.scheduler.cycle()
    assert await f.ack("delete", "Deleted") == f.n1
    stopping = {u for u, (r, _) in t.store.jobs.items() if r.stopping is not None}
    t.clock.advance(300)  # the victims' pods are still terminating, long past the TTL
    await t.ctrl.scheduler.cycle()
    held = t.ctrl.reservations.held("uh")
    assert held is not None, "the hold expired under its victims"
    # the same hold (the first plan's node), not a second preemption after it expired
    assert set(held.nodes) == {"m1-n1"}, "the hold expired and the preemptor preempted again"
    assert {u for u, (r, _) in t.store.jobs.items() if r.stopping is not None} == stopping
    # the console shows these GPUs as held for a preemptor (the blocks endpoint's "held")
    assert sum(t.ctrl.held_gpus("m1").values()) == 8
    f.report(node("m1-n1"))
    await settle()
    await t.ctrl.scheduler.cycle()
    hi = t.ctrl.state.jobs["uh"]
    assert hi.status.phase == "Placed"


async def test_a_victim_whose_pods_go_first_does_not_take_the_reclaimed_quota_back() -> None:
    # The e2e sequence (tests/e2e/test_8_guarantees.py): the reclaimer needs two victims'
    # nodes; the first victim's pods go first and it is requeued while the reclaimer still
    # waits for the second. It must not be admitted on another free node with the quota its
    # queue just lost.
    t = Term()
    f, nodes = await team_b_borrows(
        t, team_a=16, jobs=("b0", "b1", "b2"), cls="high", free=("m1-n2",)
    )
    obj = gpujob_obj("a", "ua", template=batch_job(8, parallelism=2, completions=2))
    obj["spec"]["placement"] = {"priorityClassName": "low"}
    t.kube.objects["gpujobs"].append(obj)
    t.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()
    await t.ctrl.scheduler.cycle()
    victims = sorted(u for u in nodes if t.store.jobs[u][0].stopping is not None)
    assert len(victims) == 2, "team-b borrowed 16: two 8-GPU jobs go"
    first, second = victims
    # while the victims' copies run they charge team-b; the reclaimer's hold is charged to
    # team-a for what they do not (nothing yet), between cycles too (the GPUQueue status)
    t.ctrl.queues.refresh()
    assert sum(t.ctrl.queues.usage.own("team-b").values()) == 24
    assert sum(t.ctrl.queues.usage.own("team-a").values()) == 0
    f.report(node("m1-n3"))  # a free node elsewhere
    assert await f.ack("delete", "Deleted") == victims
    f.report(node(nodes[first]))  # the first victim's pods are gone, the second's are not
    await settle()
    await t.ctrl.scheduler.cycle()
    assert t.ctrl.state.jobs[first].status.phase == "Pending", "it took the quota back"
    # the first victim's quota is now the hold's: team-a is charged it
    assert sum(t.ctrl.queues.usage.own("team-b").values()) == 16
    assert sum(t.ctrl.queues.usage.own("team-a").values()) == 8, "the hold is team-a's usage"
    f.report(node(nodes[second]))
    await settle()
    await t.ctrl.scheduler.cycle()
    a = t.ctrl.state.jobs["ua"]
    assert a.status.phase == "Placed", a.status.message


async def test_a_victim_still_stopping_keeps_its_queue_s_quota_until_its_copy_is_gone() -> None:
    # issue 26 (chaos soak, quota overrun): a borrowing job preempted while its member could
    # not delete it at once still ran, yet its queue was charged nothing for it, and another
    # job of that queue was admitted into its quota: the queue ran above nominal + borrowing.
    from tests.unit.hub.test_queues import gpuqueue

    t = Term()
    t.ctrl.intake.namespaces.seen("team-b", {})
    t.kube.objects["gpuqueues"] += [
        gpuqueue("org", nominal=40),
        gpuqueue("team-a", namespaces=("team-a",), nominal=16, parent="org"),
        gpuqueue("team-b", namespaces=("team-b",), nominal=8, parent="org", borrowing=8),
    ]
    t.ctrl.queues.listed(t.kube.objects["gpuqueues"])
    f = Fleet(t)

    async def submit_b(uid: str) -> None:
        obj: dict[str, Any] = gpujob_obj(uid, uid, template=batch_job(8))
        obj["metadata"]["namespace"] = "team-b"
        obj["spec"]["placement"] = {"priorityClassName": "low"}
        t.kube.objects["gpujobs"].append(obj)
        t.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
        await settle()

    for uid in ("b0", "b1"):
        await submit_b(uid)
    await t.ctrl.scheduler.cycle()
    await f.ack("apply", "Applied")
    nodes = {u: next(iter(json.loads(t.store.reservations[u])["nodes"])) for u in ("b0", "b1")}
    f.report(*(node(n, **{u: 8}) for u, n in nodes.items()))
    await settle()
    # team-b at its cap (8 nominal + 8 borrowed); team-a's high job needs a node: one goes
    await f.submit("a", "ua", 8, "high")
    await t.ctrl.scheduler.cycle()
    [victim] = [u for u in nodes if t.store.jobs[u][0].stopping is not None]
    # the victim's copy is not gone (its member has not deleted it yet); two nodes free up
    f.report(node("m1-n2"), node("m1-n3"))
    await submit_b("b2")
    await t.ctrl.scheduler.cycle()
    await t.ctrl.scheduler.cycle()
    b2 = t.ctrl.state.jobs["b2"]
    assert b2.status.phase == "Pending", "team-b admitted above its cap while its victim runs"
    assert "borrowing limit" in b2.status.message, b2.status.message
    # the ledger (and the GPUQueue status) counts what runs: team-b 16, no more
    assert sum(t.ctrl.queues.usage.own("team-b").values()) == 16
    # the victim's copy is gone: team-b stays at its cap (the requeued victim, older, takes
    # a free node before b2)
    assert await f.ack("delete", "Deleted") == [victim]
    f.report(node(nodes[victim]))
    await settle()
    await t.ctrl.scheduler.cycle()
    assert t.ctrl.state.jobs["ua"].status.phase == "Placed"
    placed_b = sorted(
        u for u in ("b0", "b1", "b2") if t.ctrl.state.jobs[u].status.phase in ("Placed", "Running")
    )
    assert len(placed_b) == 2, placed_b
    assert sum(t.ctrl.queues.usage.own("team-b").values()) == 16


async def test_reclaim_plans_count_victims_being_stopped_as_gone() -> None:
    # The seed-1 soak on this branch: with victims still charged to their queue while they
    # stop, the next reclaimer saw that queue above its nominal and preempted more of it than
    # it borrowed (then the other queue reclaimed back: churn, and the drain never ended).
    t = Term()
    f, nodes = await team_b_borrows(
        t, team_a=16, jobs=("b0", "b1", "b2"), cls="low", free=("m1-n2",)
    )

    async def reclaim(name: str) -> set[str]:
        await f.submit(name, f"u{name}", 8, "low")
        obj = t.kube.objects["gpujobs"][-1]
        assert obj["metadata"]["namespace"] == "team-a"
        await t.ctrl.scheduler.cycle()
        await settle()
        return {u for u in nodes if t.store.jobs[u][0].stopping is not None}

    assert len(await reclaim("a1")) == 1, "team-b borrows 16: one 8-GPU job goes"
    assert len(await reclaim("a2")) == 2, "and a second"
    # team-b is at its nominal once its two victims are gone: nothing more to reclaim
    assert len(await reclaim("a3")) == 2, "team-b lost more than it borrowed"
    # admission still counts the victims while they stop (the quota overrun fix)
    assert sum(t.ctrl.queues.usage.own("team-b").values()) == 24
    assert sum(t.ctrl.queues.planning_usage.own("team-b").values()) == 8


async def test_a_preemptor_whose_victims_are_gone_is_placed_on_its_hold_next_cycle() -> None:
    # issue 26 (30-minute soak, seed 1): soak-a/soak-1-0003 reclaimed a node from soak-b, its
    # victim was gone within a second, yet it waited 5.5 minutes with the node held and idle.
    # Another soak-a job of the same shape, ahead of it in the pass, was refused first (it
    # sees the preemptor's hold as taken GPUs and quota), and the pass answered the preemptor
    # with a copy of that refusal, never trying it with its own hold lifted.
    t = Term()
    f, nodes = await team_b_borrows(t, team_a=8, jobs=("b0", "b1"), cls="low")
    await f.submit("a", "ua", 8, "low")  # team-a below its nominal: reclaims a node
    await t.ctrl.scheduler.cycle()
    [victim] = [u for u in nodes if t.store.jobs[u][0].stopping is not None]
    held = t.ctrl.reservations.held("ua")
    assert held is not None
    assert set(held.nodes) == {nodes[victim]}
    assert await f.ack("delete", "Deleted") == [victim]
    f.report(node(nodes[victim]))  # the victim's pods are gone: it is Pending again
    await settle()
    assert t.ctrl.state.jobs[victim].status.phase == "Pending"
    # a job of the same queue and shape, walked ahead of the preemptor (higher priority)
    await f.submit("x", "ux", 8, "high")
    await t.ctrl.scheduler.cycle()
    a = t.ctrl.state.jobs["ua"]
    assert a.status.phase == "Placed", a.status.message
    assert a.status.placement is not None
    assert [sorted(ps.nodes) for ps in a.status.placement.pod_sets] == [[nodes[victim]]]
    assert t.ctrl.state.jobs["ux"].status.phase == "Pending"
    assert t.ctrl.state.jobs[victim].status.phase == "Pending", "it took the quota back"


async def test_a_preemptor_that_cannot_be_admitted_on_its_hold_lets_it_go() -> None:
    # The guarantee behind the soak's fix: once its victims are gone, a preemptor is placed
    # on its hold in the next cycle or lets the hold go, saying so; a held node never sits
    # idle while its holder cannot be admitted (here its queue's quota was cut meanwhile).
    from tests.unit.hub.test_queues import gpuqueue

    t = Term()
    f, nodes = await team_b_borrows(t, team_a=8, jobs=("b0", "b1"), cls="low")
    await f.submit("a", "ua", 8, "low")
    await t.ctrl.scheduler.cycle()
    [victim] = [u for u in nodes if t.store.jobs[u][0].stopping is not None]
    t.kube.objects["gpuqueues"] = [
        gpuqueue("team-a", namespaces=("team-a",), nominal=0, parent="org")
        if q["metadata"]["name"] == "team-a"
        else q
        for q in t.kube.objects["gpuqueues"]
    ]
    t.ctrl.queues.listed(t.kube.objects["gpuqueues"])
    # while the victim still stops, the hold stays
    await t.ctrl.scheduler.cycle()
    assert t.ctrl.reservations.held("ua") is not None
    assert await f.ack("delete", "Deleted") == [victim]
    f.report(node(nodes[victim]))
    await settle()
    await t.ctrl.scheduler.cycle()
    a = t.ctrl.state.jobs["ua"]
    assert a.status.phase == "Pending"
    assert t.ctrl.reservations.held("ua") is None, "the held node sits idle"
    assert f"let go of its preemption hold on m1 ({nodes[victim]})" in a.status.message
    assert t.ctrl.snapshot.free("m1", nodes[victim]) == 8
