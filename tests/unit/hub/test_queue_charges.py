"""Queue usage kept incrementally (gpufed.hub.components.usage) equals a brute-force recount.

A real leader term over the typed fakes is driven by random job events (submit, scheduling
cycle, a job running, succeeding, failing for the infrastructure (requeued, re-run) or for
its application, its GPUJob deleted, its copy stopped for a requeue or for a preemptor, the
stopped copy's Delete acknowledged, the clock moving past the recount). The charges follow
only the jobs marked touched (gpufed.hub.components.term.JobTable), so a change path that
did not mark its job fails here (the recount below reads the store, not the hub's code). After
each event the queues' ledgers and the GPUQueue status are rebuilt the incremental way, and
compared with a recount written here from the etcd records the fake store holds and the holds
the scheduler passed: a record placed in a member charges its queue its ``charged`` amounts
unless its GPUJob has finished; the admission ledger counts a victim still stopping, the
planning ledger does not; a waiting preemptor's hold charges its queue, in full for planning
and less what its stopping victims charge for admission; the status counts pending and
admitted jobs. The drift counters (queue_usage, queue_jobs, queue_ledger) stay 0.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufed.api.work import FailureCause, WorkAck, WorkloadStatus
from gpufed.hub.components.usage import RECOUNT_S
from gpufed.hub.rules.records import RequeueCause
from tests.unit.hub.builders import hgx_node
from tests.unit.hub.term import Term, settle
from tests.unit.hub.test_queues import H100, gpuqueue

JOBS = 6
#: how a copy fails: infrastructure (requeued and run again) or the application (final)
FAILURES = (
    FailureCause(kind="Infrastructure", reason="NodeLost", message="gone", nodes=("m1-n0",)),
    FailureCause(kind="Application", reason="BackoffLimitExceeded", exit_codes=(1,)),
)
EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.integers(0, JOBS - 1), st.sampled_from([1, 2, 4, 8])),
        st.tuples(st.just("cycle"), st.just(0), st.just(0)),
        st.tuples(st.just("cycle"), st.just(0), st.just(0)),
        st.tuples(st.just("succeed"), st.integers(0, JOBS - 1), st.just(0)),
        st.tuples(st.just("run"), st.integers(0, JOBS - 1), st.just(0)),
        st.tuples(st.just("fail"), st.integers(0, JOBS - 1), st.integers(0, 1)),
        st.tuples(st.just("delete"), st.integers(0, JOBS - 1), st.just(0)),
        st.tuples(st.just("stop"), st.integers(0, 3), st.integers(-1, JOBS - 1)),
        st.tuples(st.just("stop"), st.integers(0, 3), st.integers(-1, JOBS - 1)),
        st.tuples(st.just("gone"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("recount"), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=25,
)


def recount(
    t: Term, gpus_of: dict[str, int]
) -> tuple[Counter[tuple[str, str]], Counter[tuple[str, str]]]:
    """(admission, planning) usage per (queue, key) from the store's records and the holds the
    scheduler last passed (each job here is of namespace team-a, so of queue team-a, and has
    one pod of ``gpus_of[uid]`` GPUs)."""
    admission: Counter[tuple[str, str]] = Counter()
    planning: Counter[tuple[str, str]] = Counter()
    stopping_for: Counter[tuple[str, str]] = Counter()  # (preemptor, key) -> its victims' GPUs
    for uid, (rec, _) in t.store.jobs.items():
        if rec.cluster is None or rec.queue is None:
            continue
        job = t.ctrl.state.jobs.get(uid)
        if job is not None and job.status.phase in ("Succeeded", "Failed"):
            continue
        by = rec.stopping.by_uid if rec.stopping is not None else ""
        for key, amount in rec.charged.items():
            admission[(rec.queue, key)] += amount
            if by:
                stopping_for[(by, key)] += amount
            else:
                planning[(rec.queue, key)] += amount
    for uid, product in t.ctrl.queues._holds:
        job = t.ctrl.state.jobs.get(uid)
        if product is None or job is None or job.status.phase != "Pending" or job.deleting:
            continue
        if job.record is not None and job.record.cluster is not None:
            continue
        gpus = gpus_of[uid]
        planning[("team-a", product)] += gpus
        admission[("team-a", product)] += max(0, gpus - stopping_for[(uid, product)])
    return +admission, +planning


def job_counts(t: Term, gpus_of: dict[str, int]) -> tuple[int, int]:
    """(pending, admitted) jobs of queue team-a: admitted when its record charges (placed, not
    finished) or its hold charges more than its stopping victims do; pending when it waits
    to be placed (Pending, not being deleted, placed nowhere) and is not admitted."""
    charging: set[str] = set()
    stopping_for: Counter[str] = Counter()
    for uid, (rec, _) in t.store.jobs.items():
        job = t.ctrl.state.jobs.get(uid)
        if rec.cluster is None or job is None or job.status.phase in ("Succeeded", "Failed"):
            continue
        charging.add(uid)
        if rec.stopping is not None and rec.stopping.by_uid:
            stopping_for[rec.stopping.by_uid] += sum(rec.charged.values())
    waiting = {
        uid
        for uid, job in t.ctrl.state.jobs.items()
        if job.status.phase == "Pending"
        and not job.deleting
        and (job.record is None or job.record.cluster is None)
    }
    held = {
        uid
        for uid, product in t.ctrl.queues._holds
        if product is not None and uid in waiting and gpus_of[uid] > stopping_for[uid]
    }
    return len(waiting - held), len(charging | held)


def ledger(t: Term, planning: bool) -> Counter[tuple[str, str]]:
    usage = t.ctrl.queues.planning_usage if planning else t.ctrl.queues.usage
    out: Counter[tuple[str, str]] = Counter()
    for q in ("team-a", "default"):
        for key, amount in usage.own(q).items():
            out[(q, key)] += amount
    return +out


def drift(t: Term, kind: str = "queue_usage") -> float:
    return float(t.ctrl.metrics.incremental_drift.labels(kind)._value.get())


#: the events of one job that :func:`job_event` makes
JOB_EVENTS = ("succeed", "run", "fail", "delete", "stop", "gone")


async def job_event(t: Term, s: Any, kind: str, uid: str, arg: int) -> None:
    """One event of job ``uid`` over agent session ``s`` of member m1 (nothing when it does
    not apply): its copy succeeding, running, failing (``FAILURES[arg]``), its GPUJob deleted,
    its copy stopped for a requeue (``arg`` < 0) or for preemptor ``u{arg}``, the stopped
    copy's Delete acknowledged (``gone``)."""
    job = t.ctrl.state.jobs.get(uid)
    rec = job.record if job is not None else None
    if job is None:
        return
    if kind == "delete":
        t.ctrl.lifecycle.job_gone(uid)
    elif kind == "gone":
        ws = t.ctrl.state.work.get(("m1", uid))
        if ws is not None and ws.record.op == "Delete":
            await t.ctrl.handle(s, WorkAck(job_uid=uid, revision=ws.revision, result="Deleted"))
    elif rec is None or rec.cluster is None:
        return
    elif kind == "stop":
        by = f"u{arg}" if arg >= 0 else None
        cause = RequeueCause(
            kind="Preempted" if by else "InfrastructureFailure",
            reason="Test",
            message="stopped by the test",
            at=t.clock.wall(),
            cluster=rec.cluster,
            by_uid=by or "",
            by=f"team-a/j{arg}" if by else "",
        )
        async with t.ctrl.state.lock(uid):
            await t.ctrl.lifecycle.stop(job, cause)
    else:
        work = t.store.work.get((rec.cluster, uid))
        if work is None:
            # its copy was stopped (record.stopping) and the Delete acked while the job waits
            # for its pods to leave the node (the record keeps its cluster until then): no
            # copy is left to report on
            return
        rev = work[1]
        if kind == "run":
            report = WorkloadStatus(job_uid=uid, revision=rev, phase="Running", active=1)
        elif kind == "succeed":
            report = WorkloadStatus(job_uid=uid, revision=rev, phase="Succeeded")
        else:
            report = WorkloadStatus(
                job_uid=uid, revision=rev, phase="Failed", failure=FAILURES[arg]
            )
        await t.ctrl.handle(s, report)


async def scenario(sizes: list[int], events: list[tuple[str, int, int]]) -> None:
    t = Term()
    t.kube.objects["gpuqueues"].append(gpuqueue("team-a", namespaces=("team-a",), nominal=24))
    t.ctrl.queues.listed(t.kube.objects["gpuqueues"])
    t.member("m1", *(hgx_node(f"m1-n{i}") for i in range(4)))
    s = t.connect("m1")
    t.ctrl.heard(s)
    gpus_of: dict[str, int] = {}
    for i, gpus in enumerate(sizes):  # a busy start: jobs submitted and placed
        gpus_of[f"u{i}"] = gpus
        await t.submit(f"j{i}", f"u{i}", gpus=gpus)
    await t.ctrl.scheduler.cycle()
    for kind, i, arg in events:
        uid = f"u{i}"
        if kind == "submit" and uid not in gpus_of:
            gpus_of[uid] = arg
            await t.submit(f"j{i}", uid, gpus=arg)
        elif kind == "cycle":
            await t.ctrl.scheduler.cycle()
        elif kind in JOB_EVENTS:
            await job_event(t, s, kind, uid, arg)
        elif kind == "recount":
            t.clock.advance(RECOUNT_S)
        await settle()
        t.ctrl.queues.refresh()  # the ledgers and the GPUQueue status
        admission, planning = recount(t, gpus_of)
        assert ledger(t, planning=False) == admission, (kind, uid)
        assert ledger(t, planning=True) == planning, (kind, uid)
        shown = t.ctrl.queues.shown["team-a"]
        assert (shown.pending_jobs, shown.admitted_jobs) == job_counts(t, gpus_of), (kind, uid)
        assert drift(t) == drift(t, "queue_jobs") == drift(t, "queue_ledger") == 0
        # the jobs being stopped, kept by the marks, equal a scan of every job
        scan = sorted(
            u for u, j in t.ctrl.state.jobs.items() if j.record and j.record.stopping is not None
        )
        assert [j.uid for j in t.ctrl.state.stopping()] == scan, (kind, uid)
    # a last full recount finds nothing the incremental charges missed
    t.clock.advance(RECOUNT_S)
    t.ctrl.queues.refresh()
    assert drift(t) == drift(t, "queue_jobs") == drift(t, "queue_ledger") == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from([1, 2, 4, 8]), max_size=JOBS - 2), EVENTS)
def test_incremental_queue_usage_equals_a_recount_of_the_records(
    sizes: list[int], events: list[tuple[str, int, int]]
) -> None:
    asyncio.run(scenario(sizes, events))


def test_a_change_behind_the_table_is_counted_as_drift_at_the_recount_and_corrected() -> None:
    async def run() -> None:
        t = Term()
        t.member("m1", hgx_node("m1-n0"))
        await t.submit("j", "u1", gpus=8)
        await t.ctrl.scheduler.cycle()
        t.ctrl.queues.rebuild_usage()
        assert dict(t.ctrl.queues.usage.own("default")) == {H100: 8}
        job = t.ctrl.state.jobs["u1"]
        half: Any = job.record.model_copy(update={"charged": {H100: 4}})  # type: ignore[union-attr]
        # through the table: the next update reads the job (no recount needed)
        job.record = half
        t.ctrl.queues.rebuild_usage(recount=False)
        assert dict(t.ctrl.queues.usage.own("default")) == {H100: 4}
        # behind the table's back (no touch): the incremental count keeps what it had...
        object.__setattr__(job, "record", half.model_copy(update={"charged": {H100: 2}}))
        t.ctrl.queues.rebuild_usage()
        assert dict(t.ctrl.queues.usage.own("default")) == {H100: 4}, "u1 is not read again"
        # ...until the next full recount finds and fixes it
        t.clock.advance(RECOUNT_S)
        t.ctrl.queues.rebuild_usage(recount=False)
        assert dict(t.ctrl.queues.usage.own("default")) == {H100: 4}, "a cycle never recounts"
        t.ctrl.queues.rebuild_usage()
        assert dict(t.ctrl.queues.usage.own("default")) == {H100: 2}
        assert drift(t) == 1

    asyncio.run(run())
