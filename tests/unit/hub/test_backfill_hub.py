"""Backfill by time limit at the hub (gpufed.hub.components.backfill), on the fake clock: a
job's end at the latest comes from its recorded start (the mirrored status.startTime, else the
record's placed_at), so a new leader estimates the same hold start and lends the same nodes;
``gpufed explain`` says which hold a backfilled job borrowed."""

from __future__ import annotations

import sys
from collections.abc import Awaitable
from types import FrameType
from typing import Any

from gpufed.api.stream import InventoryDelta
from gpufed.api.work import WorkAck, WorkloadStatus
from gpufed.cli.jobs import explain_text
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.adapters.sessions import AgentSession
from gpufed.hub.components.backfill import end_of
from gpufed.hub.components.config import HubConfig
from gpufed.hub.rules import status as st
from tests.unit.hub.builders import batch_job, gpujob_obj, hgx_node
from tests.unit.hub.term import Term, sent, settle

#: The starvation age and the oldest-first age of these tests' hubs, seconds.
STARVE_S = 60


def _hub() -> Term:
    cfg = HubConfig(insecure=True, queue_starvation_s=STARVE_S, queue_oldest_first_s=STARVE_S)
    return Term(config=cfg)


async def _submit(
    t: Term, name: str, gpus: int, limit_s: int | None = None, *, pods: int = 1
) -> None:
    """GPUJob ``name`` (UID ``u<name>``) of ``pods`` pods of ``gpus`` GPUs, created now (its
    wait counts from its creation), with ``spec.placement.timeLimitSeconds`` ``limit_s``."""
    obj = gpujob_obj(name, f"u{name}", template=batch_job(gpus, parallelism=pods, completions=pods))
    obj["metadata"]["creationTimestamp"] = st.rfc3339(t.clock.wall())
    if limit_s is not None:
        obj["spec"]["placement"] = {"timeLimitSeconds": limit_s}
    t.kube.objects["gpujobs"].append(obj)
    t.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()


async def _running(t: Term, s: AgentSession, uid: str, rev: int, started: float) -> None:
    """The member acknowledged job ``uid``'s Apply and reports it Running since ``started``."""
    await t.ctrl.handle(s, WorkAck(job_uid=uid, revision=rev, result="Applied"))
    running = WorkloadStatus(
        job_uid=uid,
        revision=rev,
        kind="Job.batch",
        name=uid,
        phase="Running",
        start_time=st.rfc3339(started),
    )
    await t.ctrl.handle(s, running)
    await settle()


def _published(t: Term) -> None:
    """Every job's status on its GPUJob object, as the mirror's writers put it there (they do
    not run on the fake term)."""
    for obj in t.kube.objects["gpujobs"]:
        status = t.ctrl.state.jobs[obj["metadata"]["uid"]].status
        obj["status"] = status.model_dump(by_alias=True, mode="json", exclude_none=True)


def _raw(t: Term, uid: str) -> dict[str, object]:
    """The GPUJob object as the hub API serves it once the mirror wrote its status."""
    _published(t)
    [obj] = [o for o in t.kube.objects["gpujobs"] if o["metadata"]["uid"] == uid]
    return obj


async def test_a_jobs_end_is_its_placement_then_its_start_plus_its_limit() -> None:
    t = _hub()
    t.member("m1", hgx_node("m1-n0"))
    s = t.connect("m1")
    sent(s)
    await _submit(t, "a", 4, 1000)
    await _submit(t, "n", 4)
    placed_at = t.clock.wall()
    await t.ctrl.scheduler.cycle()
    a, n = t.ctrl.state.jobs["ua"], t.ctrl.state.jobs["un"]
    assert {a.status.phase, n.status.phase} == {"Placed"}
    assert end_of(a) == placed_at + 1000, "not started yet: its placement + its limit"
    assert end_of(n) is None, "no limit: its nodes drain at an unknown time"
    assert end_of(None) is None, "GPUs of a job the hub does not know"
    [rev] = [r for op, u, r in sent(s) if op == "apply" and u == "ua"]
    t.clock.advance(300)
    started = t.clock.wall() - 30  # the member started it 30 s ago
    await _running(t, s, "ua", rev, started)
    assert end_of(a) == started + 1000, "started: the member's start + its limit"


async def test_a_new_leader_lends_the_same_hold_until_the_same_expected_start() -> None:
    """a (4 GPUs, 1,000 s) runs and b (8 GPUs, 2,000 s) is placed on the two nodes; c (16 GPUs)
    starves and holds both; d (2 GPUs, 500 s) runs there as backfill, e (2 GPUs, no limit)
    waits though 2 GPUs stay free. After a leader change the successor estimates the same ends
    and the same start from etcd and the hub API alone, still keeps e out, lends the hold to f
    (2 GPUs, 500 s), and `gpufed explain` names the hold on both leaders' backfilled jobs."""
    t = _hub()
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
    s = t.connect("m1")
    sent(s)
    t0 = t.clock.wall()
    await _submit(t, "a", 4, 1000)
    await _submit(t, "b", 8, 2000)
    await t.ctrl.scheduler.cycle()
    [rev_a] = [r for op, u, r in sent(s) if op == "apply" and u == "ua"]
    t.ctrl.members.on_delta(
        t.ctrl.state.members["m1"],
        InventoryDelta(seq=2, upserts=(hgx_node("m1-n0", requested=4, job_uid="ua"),)),
    )
    a_start = t0 + 10
    await _running(t, s, "ua", rev_a, a_start)
    await _submit(t, "c", 8, pods=2)  # both nodes
    await t.ctrl.scheduler.cycle()
    t.clock.advance(STARVE_S + 1)  # c starves: it holds the nodes that will fit it
    await t.ctrl.scheduler.cycle()
    await _submit(t, "d", 2, 500)
    await _submit(t, "e", 2)
    await t.ctrl.scheduler.cycle()
    jobs = t.ctrl.state.jobs
    assert jobs["ud"].status.phase == "Placed", jobs["ud"].status.message
    assert jobs["ue"].status.phase == "Pending", "a job without a limit never runs in a hold"
    assert jobs["uc"].status.phase == "Pending"
    ends = {u: end_of(jobs[u]) for u in ("ua", "ub", "ud")}
    d_at = t.clock.wall()
    assert ends == {"ua": a_start + 1000, "ub": t0 + 2000, "ud": d_at + 500}
    text = explain_text(_raw(t, "ud"))
    assert "backfill: runs on nodes held for team-a/c" in text, text
    # c needs 16: 2 free after a, b, d; d's 2 (d_at+500 = t0+561), a's 4 (t0+1010) and b's 8
    # (t0+2000) come back in that order: 16 at b's end.
    assert f"(in {t0 + 2000 - d_at:.0f} s)" in text, text

    await t.ctrl.members.flush()
    _published(t)
    t.clock.advance(5)
    t2 = Term(config=t.config, store=t.store, kube=t.kube, clock=t.clock)
    await t2.ctrl.load()
    t2.member(
        "m1",
        hgx_node("m1-n0", requested=4, job_uid="ua"),
        hgx_node("m1-n1"),
    )
    s2 = t2.connect("m1")
    for obj in t.kube.objects["gpujobs"]:
        t2.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()
    await t2.ctrl.scheduler.cycle()
    sent(s2)
    jobs2 = t2.ctrl.state.jobs
    assert {u: end_of(jobs2[u]) for u in ("ua", "ub", "ud")} == ends, "the same ends"
    assert jobs2["ue"].status.phase == "Pending"
    await _submit(t2, "f", 2, 500)
    await t2.ctrl.scheduler.cycle()
    assert jobs2["uf"].status.phase == "Placed", jobs2["uf"].status.message
    assert jobs2["ue"].status.phase == "Pending"
    assert jobs2["uc"].status.phase == "Pending"
    text2 = explain_text(_raw(t2, "uf"))
    assert "backfill: runs on nodes held for team-a/c" in text2, text2
    assert f"(in {t0 + 2000 - t.clock.wall():.0f} s)" in text2, "the same expected start"


async def test_a_job_whose_limit_ends_after_the_expected_start_waits() -> None:
    """d's limit (3,000 s) ends after c's expected start (b's end, 2,000 s after it was
    placed): it does not run inside the hold."""
    t = _hub()
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
    s = t.connect("m1")
    sent(s)
    await _submit(t, "a", 4, 1000)
    await _submit(t, "b", 8, 2000)
    await t.ctrl.scheduler.cycle()
    await _submit(t, "c", 8, pods=2)  # both nodes
    await t.ctrl.scheduler.cycle()
    t.clock.advance(STARVE_S + 1)
    await t.ctrl.scheduler.cycle()
    await _submit(t, "d", 4, 3000)
    await t.ctrl.scheduler.cycle()
    d = t.ctrl.state.jobs["ud"]
    assert d.status.phase == "Pending", d.status.message


async def _two_starving_eights(holds_per_shape: int) -> Term:
    """Two nodes each 6 of 8 GPUs busy (jobs without limits), two starving 8-GPU jobs of one
    shape past the oldest-first age, then a fresh 2-GPU job without a limit."""
    cfg = HubConfig(
        insecure=True,
        queue_starvation_s=STARVE_S,
        queue_oldest_first_s=STARVE_S,
        queue_holds_per_shape=holds_per_shape,
    )
    t = Term(config=cfg)
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
    for name in ("a", "b"):
        await _submit(t, name, 6)
        await t.ctrl.scheduler.cycle()
    for name in ("c1", "c2"):
        await _submit(t, name, 8)
    await t.ctrl.scheduler.cycle()
    t.clock.advance(STARVE_S + 1)
    await _submit(t, "d", 2)
    await t.ctrl.scheduler.cycle()
    return t


async def test_the_hub_lets_several_starving_jobs_of_one_shape_hold_different_nodes() -> None:
    """--queue-holds-per-shape reaches the pass (hold_avoiding): with the default (4) both
    starving 8-GPU jobs hold a node each, so the 2-GPU job fits nowhere; with 1 only the first
    holds one, and the 2-GPU job runs on the other node."""
    assert HubConfig(insecure=True).queue_holds_per_shape == 4
    held = await _two_starving_eights(4)
    phases = {u: held.ctrl.state.jobs[u].status.phase for u in ("ua", "ub", "uc1", "uc2", "ud")}
    assert phases == {
        "ua": "Placed",
        "ub": "Placed",
        "uc1": "Pending",
        "uc2": "Pending",
        "ud": "Pending",
    }, phases
    assert "held for team-a/c" in held.ctrl.state.jobs["ud"].status.message
    one = await _two_starving_eights(1)
    assert one.ctrl.state.jobs["ud"].status.phase == "Placed"
    assert one.ctrl.state.jobs["uc2"].status.phase == "Pending"


async def _fresh_small_beside_a_starving_eight(carry: bool) -> Term:
    """One node, 6 of 8 GPUs busy (a job without a limit); c (8 GPUs) starves and holds it; then
    a fresh 2-GPU job d without a limit, walked before c (smallest-first, before the
    oldest-first age)."""
    cfg = HubConfig(insecure=True, queue_starvation_s=STARVE_S, queue_carry_holds=carry)
    t = Term(config=cfg)
    t.member("m1", hgx_node("m1-n0"))
    await _submit(t, "a", 6)
    await t.ctrl.scheduler.cycle()
    await _submit(t, "c", 8)
    await t.ctrl.scheduler.cycle()
    t.clock.advance(STARVE_S + 1)
    await t.ctrl.scheduler.cycle()  # c holds m1-n0 (it cannot start before a ends)
    await _submit(t, "d", 2)
    await t.ctrl.scheduler.cycle()
    return t


async def test_the_hub_carries_a_starving_jobs_hold_to_the_fresh_jobs_walked_before_it() -> None:
    """--queue-carry-holds reaches the pass (carry): the hold c took in the last pass keeps the
    younger d, walked first, off the node c drains; without it d takes 2 of the GPUs c waits for.
    """
    held = await _fresh_small_beside_a_starving_eight(True)
    d = held.ctrl.state.jobs["ud"]
    assert d.status.phase == "Pending"
    assert "held for team-a/c" in d.status.message, d.status.message
    free = await _fresh_small_beside_a_starving_eight(False)
    assert free.ctrl.state.jobs["ud"].status.phase == "Placed"


async def test_the_hub_spares_a_whole_free_node_for_the_job_that_needs_it_whole() -> None:
    """--queue-spare-whole-nodes reaches the pass (spare): m1-n0 has 1 GPU free, m1-n1 all 8;
    the 2-GPU d is walked before the 8-GPU e. Spared, e gets m1-n1 and d waits; without it d
    breaks m1-n1 and e waits."""
    for spare, placed in ((True, "ue"), (False, "ud")):
        cfg = HubConfig(insecure=True, queue_spare_whole_nodes_s=3600.0 if spare else 0.0)
        t = Term(config=cfg)
        t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
        await _submit(t, "a", 7)
        await t.ctrl.scheduler.cycle()
        await _submit(t, "e", 8)
        t.clock.advance(1)
        await _submit(t, "d", 2)
        await t.ctrl.scheduler.cycle()
        phases = {u: t.ctrl.state.jobs[u].status.phase for u in ("ud", "ue")}
        assert phases == {u: "Placed" if u == placed else "Pending" for u in phases}, phases


async def _backfill_calls(cycle: Awaitable[None]) -> list[str]:
    """The functions of hub/components/backfill.py entered while ``cycle`` runs (a profile
    hook, so the count is the interpreter's, not the module's own)."""
    entered: list[str] = []

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.endswith("hub/components/backfill.py"):
            entered.append(frame.f_code.co_name)

    before = sys.getprofile()
    sys.setprofile(hook)
    try:
        await cycle
    finally:
        sys.setprofile(before)
    return entered


async def test_a_cycle_enters_backfill_only_when_it_weighs_a_hold() -> None:
    """The pass's backfill callbacks are bound, not built (issue 22, the walk): a cycle that
    places what fits, holding nothing, enters backfill.py not at all; one where a starving job
    weighs a hold on the full node estimates its start there (hold_start) and, with the default
    4 holds per shape, names its nodes there (hold_avoiding)."""
    t = _hub()
    t.member("m1", hgx_node("m1-n0"))
    await _submit(t, "a", 6)
    assert await _backfill_calls(t.ctrl.scheduler.cycle()) == []
    assert t.ctrl.state.jobs["ua"].status.phase == "Placed"
    await _submit(t, "c", 8)
    await t.ctrl.scheduler.cycle()
    t.clock.advance(STARVE_S + 1)
    weighed = await _backfill_calls(t.ctrl.scheduler.cycle())
    assert {"hold_start", "hold_avoiding"} <= set(weighed), weighed
    assert t.ctrl.state.jobs["uc"].status.phase == "Pending"
