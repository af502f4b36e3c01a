"""The running jobs preemption chooses from, kept across cycles (gpufed.hub.components.running),
equal a recount written here, and plan the same preemptions as an index built from scratch.

A real leader term over the typed fakes is driven by random job events (submit, scheduling
cycle, a job's pods reported bound on their nodes or gone from them, a node joining or leaving
a shared NVLink domain (re-filed in the snapshot), its work acknowledged
Applied, a job running,
succeeding, failing for the infrastructure or its application, its GPUJob deleted, its copy
stopped for a requeue or a preemptor, the stopped copy's Delete acknowledged, the holds of
pods never reported expiring, the clock moving past the recount). After each event the kept jobs are updated the incremental way and compared
with a recount from the etcd records the fake store holds and the pods the test reported: a
record placed in a member, not being stopped, whose GPUJob is known and not finished, runs
with the GPUs its pods hold per node (else those its reservation names), from its Applied ack's
time (else its placement's). The kept index must
file the same jobs in the same blocks at every level as an index built from scratch, a
preemptor must get the same plan from both, and the drift counter stays 0. A change path that
does not mark its job touched fails here.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpufed.api.inventory import NodeInventory
from gpufed.api.stream import InventoryDelta
from gpufed.api.work import WorkAck
from gpufed.hub.components.config import HubConfig
from gpufed.hub.components.running import HeldGPUs
from gpufed.hub.components.term import MemberState
from gpufed.hub.components.usage import RECOUNT_S
from gpufed.placement.preemptcycle import PreemptionCycle
from gpufed.placement.preemption import Preemptor
from gpufed.placement.runindex import LEVELS, RunningIndex
from tests.unit.hub.builders import hgx_node
from tests.unit.hub.term import Term, settle
from tests.unit.hub.test_queue_charges import JOB_EVENTS, job_event

JOBS = 6
NODES = 4
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, JOBS - 1), st.sampled_from([1, 2, 4, 8])),
        st.tuples(st.just("cycle"), st.just(0), st.just(0)),
        st.tuples(st.just("bind"), st.integers(0, JOBS - 1), st.just(0)),
        st.tuples(st.just("bind"), st.integers(0, JOBS - 1), st.just(0)),
        st.tuples(st.just("unbind"), st.integers(0, JOBS - 1), st.just(0)),
        st.tuples(st.just("unbind"), st.integers(0, JOBS - 1), st.just(0)),
        st.tuples(st.just("succeed"), st.integers(0, JOBS - 1), st.just(0)),
        st.tuples(st.just("run"), st.integers(0, JOBS - 1), st.just(0)),
        st.tuples(st.just("fail"), st.integers(0, JOBS - 1), st.integers(0, 1)),
        st.tuples(st.just("delete"), st.integers(0, JOBS - 1), st.just(0)),
        st.tuples(st.just("stop"), st.integers(0, JOBS - 1), st.integers(-1, JOBS - 1)),
        st.tuples(st.just("gone"), st.integers(0, JOBS - 1), st.just(0)),
        st.tuples(st.just("recount"), st.just(0), st.just(0)),
        st.tuples(st.just("expire"), st.just(0), st.just(0)),
        st.tuples(st.just("applied"), st.integers(0, JOBS - 1), st.just(0)),
        st.tuples(st.just("relabel"), st.integers(0, NODES - 1), st.just(0)),
    ),
    min_size=1,
    max_size=25,
)


def node(name: str, pods: dict[str, dict[str, int]], domain: str = "") -> NodeInventory:
    """HGX node ``name`` with the pods of ``pods`` (uid -> node -> GPUs) on it, in NVLink
    domain ``domain`` (default: its own)."""
    base = hgx_node(name)
    jobs = {u: {"nvidia.com/gpu": g[name]} for u, g in sorted(pods.items()) if name in g}
    used = sum(r["nvidia.com/gpu"] for r in jobs.values())
    return base.model_copy(
        update={
            "requested": {"nvidia.com/gpu": used} if used else {},
            "job_requests": jobs,
            "nvlink_domain": domain or base.nvlink_domain,
        }
    )


def reference(t: Term, pods: dict[str, dict[str, int]]) -> dict[str, tuple[Any, ...]]:
    """uid -> (cluster, priority, GPUs per node, start) of every job that runs, from the store
    (its start: the Applied ack the store holds for its work item's revision, else its
    placement)."""
    out: dict[str, tuple[Any, ...]] = {}
    for uid, (rec, _) in sorted(t.store.jobs.items()):
        job = t.ctrl.state.jobs.get(uid)
        if rec.cluster is None or rec.stopping is not None or job is None:
            continue
        if job.status.phase in ("Succeeded", "Failed") or job.deleting:
            continue
        gpus = pods.get(uid)
        if not gpus:
            res = t.ctrl.snapshot.reservation(uid)
            gpus = {n: a["nvidia.com/gpu"] for n, a in res.nodes.items()} if res else {}
        ack = t.store.acks.get((rec.cluster, uid))
        work = t.store.work.get((rec.cluster, uid))
        if ack is None or ack.applied_at is None or work is None or ack.revision != work[1]:
            start = rec.placed_at  # no Applied ack of the work item as it is now
        else:
            start = ack.applied_at
        if gpus:
            out[uid] = (rec.cluster, rec.priority or 0, dict(gpus), start)
    return out


def filed(index: RunningIndex) -> dict[tuple[str, Any, str], dict[str, int]]:
    """(level, pool, block) -> uid -> GPUs, at every level."""
    out: dict[tuple[str, Any, str], dict[str, int]] = {}
    for cluster in index.members:
        c = index.snapshot.cluster(cluster)
        for level in LEVELS:
            for pool in c.pools_sorted():
                for b in index.blocks(cluster, level, pool.key):
                    out[(level, pool.key, b.key)] = {u: g for u, (_, g) in b.runs.items()}
    return out


def drift(t: Term) -> float:
    return float(t.ctrl.metrics.incremental_drift.labels("running")._value.get())


async def scenario(sizes: list[int], events: list[tuple[str, int, int]]) -> None:
    t = Term()
    t.member("m1", *(hgx_node(f"m1-n{i}") for i in range(NODES)))
    s = t.connect("m1")
    t.ctrl.heard(s)
    pods: dict[str, dict[str, int]] = {}
    domains: dict[str, str] = {}  # node -> its NVLink domain when not its own
    seq = 1
    for i, gpus in enumerate(sizes):
        await t.submit(f"j{i}", f"u{i}", gpus=gpus)
    await t.ctrl.scheduler.cycle()
    preemption = t.ctrl.scheduler._preemption
    kept = preemption._running
    for kind, i, arg in events:
        uid = f"u{i}"
        job = t.ctrl.state.jobs.get(uid)
        if kind == "submit" and job is None:
            await t.submit(f"j{i}", uid, gpus=arg)
        elif kind == "cycle":
            await t.ctrl.scheduler.cycle()
        elif kind in ("bind", "unbind", "relabel"):
            res = t.ctrl.snapshot.reservation(uid)
            if kind == "relabel":  # the node joins a shared NVLink domain, or leaves it
                name = f"m1-n{i}"
                if domains.pop(name, None) is None:
                    domains[name] = "shared"
            elif kind == "bind" and res is not None:
                pods[uid] = {n: a["nvidia.com/gpu"] for n, a in res.nodes.items()}
            elif kind == "unbind" and uid in pods:
                del pods[uid]
            else:
                continue
            seq += 1
            ms = t.ctrl.state.members["m1"]
            ups = tuple(node(f"m1-n{n}", pods, domains.get(f"m1-n{n}", "")) for n in range(NODES))
            t.ctrl.members.on_delta(ms, InventoryDelta(seq=seq, upserts=ups))
        elif kind in JOB_EVENTS:
            await job_event(t, s, kind, uid, arg)
        elif kind == "applied":
            ws = t.ctrl.state.work.get(("m1", uid))
            if ws is not None and ws.record.op == "Apply":
                t.clock.advance(1)  # a start later than the placement
                await t.ctrl.handle(s, WorkAck(job_uid=uid, revision=ws.revision, result="Applied"))
        elif kind == "recount":
            t.clock.advance(RECOUNT_S)
        elif kind == "expire":
            # the holds of pods never reported expire (wall clock only: no recount meanwhile)
            t.clock.wall_s += t.ctrl.config.reservation_ttl_s + 1
            await t.ctrl.scheduler.cycle()
        await settle()
        index = kept.update()
        want = reference(t, pods)
        got = {r.uid: (r.cluster, r.priority, dict(r.gpus), r.started_at) for r in index}
        assert got == want, (kind, uid)
        fresh = RunningIndex(t.ctrl.snapshot, sorted(index, key=lambda r: r.uid))
        assert filed(index) == filed(fresh), (kind, uid)
        assert drift(t) == 0, (kind, uid)
        # preemptors of 1 to NODES whole nodes get the same plan from the kept index as from
        # a new one
        for pods_n in range(1, NODES + 1):
            model = t.ctrl.state.jobs.get("u0")
            if model is None or model.request is None:
                break
            ps = model.request.pod_sets[0].model_copy(
                update={
                    "count": pods_n,
                    "requests": {**model.request.pod_sets[0].requests, "nvidia.com/gpu": 8},
                }
            )
            req = model.request.model_copy(
                update={"uid": "pre", "priority": 10**6, "pod_sets": (ps,)}
            )
            plans = [
                PreemptionCycle(
                    t.ctrl.snapshot, t.ctrl.scheduler._policy, t.clock.wall() + 3600, ix
                ).plan(Preemptor(req))
                for ix in (index, fresh)
            ]
            assert repr(plans[0]) == repr(plans[1]), (kind, uid, pods_n)
    t.clock.advance(RECOUNT_S)
    kept.update()
    assert kept.recounted
    assert drift(t) == 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from([1, 2, 4, 8]), max_size=JOBS - 2), EVENTS)
# found by Hypothesis (the event helper read a work record the Delete ack had removed)
@example([1, 1, 1], [("bind", 2, 0), ("fail", 2, 0), ("gone", 2, 0), ("succeed", 2, 0)])
def test_kept_running_jobs_equal_a_recount_and_plan_as_a_new_index(
    sizes: list[int], events: list[tuple[str, int, int]]
) -> None:
    asyncio.run(scenario(sizes, events))


def test_a_change_behind_the_table_is_counted_as_running_drift_and_corrected() -> None:
    async def run() -> None:
        t = Term()
        t.member("m1", hgx_node("m1-n0"))
        await t.submit("j", "u1", gpus=8)
        await t.ctrl.scheduler.cycle()
        ms = t.ctrl.state.members["m1"]
        bound = hgx_node("m1-n0", requested=8, job_uid="u1")  # its pods: not read from a hold
        t.ctrl.members.on_delta(ms, InventoryDelta(seq=2, upserts=(bound,)))
        kept = t.ctrl.scheduler._preemption._running
        assert [r.uid for r in kept.update()] == ["u1"]
        assert [r.uid for r in kept.update()] == ["u1"]
        job = t.ctrl.state.jobs["u1"]
        other: Any = job.record.model_copy(update={"priority": 7})  # type: ignore[union-attr]
        object.__setattr__(job, "record", other)  # behind the table's back: no touch
        assert [r.priority for r in kept.update()] == [0], "u1 is not read again"
        t.clock.advance(RECOUNT_S)
        assert [r.priority for r in kept.update(recount=False)] == [0], "planning never recounts"
        await t.ctrl.scheduler.refresh_preemption()  # the status loop's refresh: recounts
        assert kept.recounted
        assert kept.index is not None
        assert [r.priority for r in kept.index] == [7]
        assert drift(t) == 1

    asyncio.run(run())


def test_a_job_that_changes_while_the_recount_reads_is_not_drift() -> None:
    """The recount runs in a worker thread while the event loop goes on: a job touched, or
    whose pods moved, between the incremental step and the full read differs between the two
    by timing, not by a missed change path (``gpufed bench scale`` at 100 x 5,000 counted 12)."""

    async def run() -> None:
        t = Term()
        t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
        for i in (1, 2):
            await t.submit(f"j{i}", f"u{i}", gpus=8)
        await t.ctrl.scheduler.cycle()
        ms = t.ctrl.state.members["m1"]
        nodes = {
            t.ctrl.snapshot.reservation(u).nodes.keys().__iter__().__next__(): u  # type: ignore[union-attr]
            for u in ("u1", "u2")
        }
        bound = tuple(hgx_node(n, requested=8, job_uid=u) for n, u in nodes.items())
        t.ctrl.members.on_delta(ms, InventoryDelta(seq=2, upserts=bound))
        kept = t.ctrl.scheduler._preemption._running
        assert sorted(r.uid for r in kept.update()) == ["u1", "u2"]
        apply = kept._apply

        def apply_then_the_loop_goes_on(moved: set[str]) -> None:
            apply(moved)
            # the loop, meanwhile: u1's record changes (and is touched, as JobTable does);
            # u2's pods are gone from its node (a new inventory object)
            job = t.ctrl.state.jobs["u1"]
            object.__setattr__(job, "record", job.record.model_copy(update={"priority": 7}))  # type: ignore[union-attr]
            t.ctrl.state.touch("u1")
            gone = next(n for n, u in nodes.items() if u == "u2")
            ms.nodes[gone] = hgx_node(gone)

        kept._apply = apply_then_the_loop_goes_on  # type: ignore[method-assign]
        t.clock.advance(RECOUNT_S)
        index = kept.update()
        assert kept.recounted
        assert {r.uid: r.priority for r in index} == {"u1": 7}
        assert drift(t) == 0
        kept._apply = apply  # type: ignore[method-assign]
        # what the race left is read again next time, and a later recount finds nothing
        t.clock.advance(RECOUNT_S)
        kept.update()
        assert drift(t) == 0

    asyncio.run(run())


def test_with_preemption_off_the_marks_do_not_pile_up() -> None:
    async def run() -> None:
        t = Term(config=HubConfig(insecure=True, preemption=False))
        t.member("m1", hgx_node("m1-n0"))
        await t.submit("j", "u1", gpus=8)
        await t.ctrl.scheduler.cycle()
        kept = t.ctrl.scheduler._preemption._running
        assert kept._touched == {"u1"}
        t.ctrl.scheduler.refresh_preemption_soon()  # the status loop's turn
        assert kept._touched == set()
        assert kept.index is None

    asyncio.run(run())


def test_held_gpus_read_a_member_by_its_marked_nodes_and_a_new_dict_whole() -> None:
    # Cost per change (issue 25): after the first read, a member whose nodes dict is the same
    # object is read only at the nodes an inventory delta marked; a change nobody marked is not
    # seen (so the update did not walk the member's nodes), a marked one is, and a whole new
    # dict (a snapshot) is read node by node without marks.
    marks: set[tuple[str, str]] = set()
    m = MemberState("m1")
    m.nodes = {"n0": node("n0", {"u1": {"n0": 8}}), "n1": node("n1", {})}
    held = HeldGPUs(marks)
    assert held.update({"m1": m}) == {"u1"}
    assert held.map == {("m1", "u1"): {"n0": 8}}
    m.nodes["n1"] = node("n1", {"u2": {"n1": 4}})
    assert held.update({"m1": m}) == set()
    marks.add(("m1", "n1"))
    assert held.update({"m1": m}) == {"u2"}
    assert held.map == {("m1", "u1"): {"n0": 8}, ("m1", "u2"): {"n1": 4}}
    assert marks == set()
    del m.nodes["n0"]
    marks.add(("m1", "n0"))
    assert held.update({"m1": m}) == {"u1"}
    m.nodes = {"n1": node("n1", {"u3": {"n1": 2}})}
    assert held.update({"m1": m}) == {"u2", "u3"}
    assert held.map == {("m1", "u3"): {"n1": 2}}
    assert held.update({}) == {"u3"}
    assert held.map == {}
