"""The job lifecycle rule: from one job's recorded facts, the steps that come next (pure).

A job's fate is decided here and only here, level-triggered: :func:`decide` reads what is
recorded about the job now (:class:`Facts`: its spec, its etcd record, its copy's work item,
what its member reports, an infrastructure failure not acted on yet) and returns the steps to
take, in order. The hub's :mod:`gpufed.hub.components.lifecycle` gathers the facts under the
job's lock, calls :func:`decide` and carries the steps out; the components that learn
something about a job (acks and reports, inventories, lost members, deletions, preemption)
record it and ask for a reconcile. Calling it again on unchanged facts asks for nothing new
(every step is idempotent or changes the facts it was decided from).

The rules, first match wins (docs/design.md §7 items 3, 6 and 9):

1. **Being deleted**: while its copy may exist in a member that is not lost, delete the copy
   and wait for the member's ``Deleted``; then (or at once when the member is lost, or the job
   was never placed) forget its record, release its reservation and drop the finalizer.
2. **Its copy is being stopped** for a requeue (``record.stopping``): a job that finished
   first stays finished (terminal is final). A lost member fences the copy and the job is
   requeued now. Otherwise the copy is deleted, and the job is requeued once the member
   acknowledged the Delete *and* reports none of its pods (nothing runs twice at once); pods
   on nodes that are not Ready count for a while only, and the job is asked again when that
   hold ends (``pods_held_until``: a wait-until step).
3. **Finished**: a reservation still left is released (the member reported the job done;
   ``reserved``); nothing else (terminal is final).
4. **Its member is lost**: the copy is lost: the job is placed again (``reschedule:
   OnClusterLoss``, the old copy fenced) or ends ``Lost``.
5. **Its member refused the copy** (an Apply acknowledged ``Failed`` and not retryable, or
   retried ``apply_retry_limit`` times in a row): the job fails (``MemberRejected``) and
   whatever part the member accepted is deleted.
6. **An infrastructure failure of its current copy** (classified by the agent,
   :mod:`gpufed.sync.failure`): the nodes it names become suspect when Kubernetes observed
   them; with a re-run left the copy is stopped (rule 2 then requeues it), else the job fails
   with ``RetriesExhausted``. A drain (``EvictionByEvictionAPI``) or the member's own
   preemption (``PreemptionByScheduler``) is not the job's failure: it re-runs without using
   the budget and without a backoff.
6b. **Its time limit** (``spec.placement.timeLimitSeconds``, counted from the workload's start
   in the member): the job fails (``TimeLimitExceeded``) and its copy is deleted once it is
   reached; until then a timer waits for it. A limit reached wins over rule 6: a failure
   reported once the limit is reached (the copy stopped there exits 143, which a job may list
   in ``infrastructureExitCodes``) ends the job ``TimeLimitExceeded``, never a re-run. (A batch/v1 Job's own ``activeDeadlineSeconds`` is
   the member's Job controller's to enforce.)
7. **Waiting**: valid and placed nowhere (and no placement being adopted): the scheduler
   considers it, once the backoff after a re-run (``record.not_before``, :func:`requeued`) has
   passed. In a scheduling cycle the cycle's view of the job's queue and priority is a fact
   too (:class:`QueueView`), and the rule says whether the job goes in its queue
   (:class:`Enqueue`), waits with a reason (:class:`WaitFor`: a namespace no GPUQueue lists
   while the hub refuses such jobs, a PriorityClass that does not exist yet) or fails for good
   (:class:`FailInvalid`, naming the field: a ``spec.placement.queue`` that does not take it, a
   priority above the queue's cap or a system class).

Besides these, a job the hub may place gets the finalizer (:class:`AddFinalizer`), off the
placement path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpufed.api.gpujob import MAX_RESTART_HISTORY, GPUJob, GPUJobStatus, RestartRecord, Retry
from gpufed.api.request import PreemptionPolicy
from gpufed.api.work import FailureCause, WorkloadStatus
from gpufed.hub.rules import status as st
from gpufed.hub.rules.records import (
    MAX_CAUSE_NODES,
    MAX_REQUEUE_HISTORY,
    AckRecord,
    JobRecord,
    RequeueCause,
)
from gpufed.sync.failure import (
    EVICTION_BY_EVICTION_API,
    PREEMPTION_BY_SCHEDULER,
    with_declared_exit_codes,
)

#: The requeue kind (and GPUJob condition type) of a re-run after an infrastructure failure.
INFRASTRUCTURE_FAILURE = "InfrastructureFailure"
#: Infrastructure failure reasons that re-run a job without using its re-run budget and
#: without a backoff: the member's own maintenance (a drain) and its scheduler's preemption.
NO_BUDGET_REASONS: frozenset[str] = frozenset({EVICTION_BY_EVICTION_API, PREEMPTION_BY_SCHEDULER})

#: The copy's work item in the job's member: none (never sent, or the member acknowledged its
#: Delete), an Apply, a Delete, or a Delete fenced after its member was lost.
WorkOp = Literal["none", "apply", "delete", "fenced"]


@dataclass(frozen=True)
class Facts:
    """What is recorded about one job now (the input of :func:`decide`).

    ``cluster``: the member its record places it in (None: placed nowhere); ``stopping``: its
    record's requeue mark; ``work``: its copy's work item in ``cluster``; ``pods_left``: that
    member still reports pods of the job (terminating ones included); ``pods_held_until``: wall
    seconds when the stopped copy's pods on nodes that are not Ready stop counting among them
    (None: none of them counts for a while, or they count until confirmed gone);
    ``member_lost``: that
    member was declared lost; ``failure``: an infrastructure failure of the current copy that
    no step has acted on yet (``failure_cluster`` is where it was observed);
    ``refused``: the member refused the copy's Apply for good (rule 5); ``failure_exempt``: the
    failure is one of :data:`NO_BUDGET_REASONS`; ``limit_at``: wall seconds when the running
    copy reaches the job's time limit (None: no limit, or not started); ``now`` / ``not_before``: wall seconds now and
    the end of the job's backoff (None: none);
    ``retries_left``: re-runs after infrastructure failures left
    (``spec.placement.retry.onInfrastructureFailure`` minus those used); ``reserved``: a
    finished job still has a reservation (rule 3; read for finished jobs only); ``queue``: the
    scheduling cycle's view of the job's queue and priority (None outside a cycle).
    """

    deleting: bool = False
    terminal: bool = False
    valid: bool = True
    claimed: bool = False
    has_record: bool = False
    cluster: str | None = None
    stopping: bool = False
    work: WorkOp = "none"
    pods_left: bool = False
    pods_held_until: float | None = None
    member_lost: bool = False
    refused: bool = False
    failure_cluster: str | None = None
    failure_exempt: bool = False
    limit_at: float | None = None
    now: float = 0.0
    not_before: float | None = None
    retries_left: int = 0
    reschedule_on_loss: bool = False
    has_finalizer: bool = True
    reserved: bool = False
    queue: QueueView | None = None


@dataclass(frozen=True)
class QueueView:
    """How a scheduling cycle sees a waiting job's queue and priority now (a fact of rule 7).

    ``queue``: the GPUQueue its request goes in; ``priority`` / ``preemption_policy``: what its
    PriorityClass resolves to there. What may keep it out, each a message naming the fix
    (None: not so): ``unlisted``: its namespace is listed by no GPUQueue and the hub refuses
    such jobs (``--unlisted-namespaces reject``); ``queue_error``: its
    ``spec.placement.queue`` names a queue that does not take it; ``priority_refused`` (at
    ``priority_field``): its priority may not be used in that queue (above the queue's cap, a
    system class); ``priority_missing``: its PriorityClass does not exist (yet).
    """

    queue: str = ""
    priority: int = 0
    preemption_policy: PreemptionPolicy = "PreemptLowerPriority"
    unlisted: str | None = None
    queue_error: str | None = None
    priority_refused: str | None = None
    priority_field: str = "spec.placement.priorityClassName"
    priority_missing: str | None = None


# --- the steps ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeleteCopy:
    """Turn the copy's work item into a Delete (``fenced``: its member is lost; deleted when
    it returns) and send it."""

    fenced: bool = False


@dataclass(frozen=True)
class Forget:
    """The job is deleted and nothing of it is left in a reachable member: forget its etcd
    record, release its reservation, drop the finalizer."""


@dataclass(frozen=True)
class Requeue:
    """The stopped copy is gone: the record back in the queue (:func:`requeued`), the
    reservation released, the job Pending with its cause's condition, placed again."""


@dataclass(frozen=True)
class Release:
    """The job finished: release the reservation it still has (rule 3)."""


@dataclass(frozen=True)
class Lose:
    """The job's member was lost: placed again (``reschedule``, the copy fenced) or ``Lost``."""

    reschedule: bool


@dataclass(frozen=True)
class FailRefused:
    """The member refused the copy for good: ``Failed`` (``Dispatched=False``,
    ``MemberRejected``), the reservation released."""


@dataclass(frozen=True)
class FailTimeLimit:
    """The running copy reached the job's time limit: ``Failed`` (``TimeLimitExceeded``), the
    reservation released."""


@dataclass(frozen=True)
class MarkSuspects:
    """Mark the nodes an infrastructure failure names suspect (when Kubernetes observed them)."""


@dataclass(frozen=True)
class StopForRerun:
    """Write the record's ``stopping`` mark for an infrastructure failure (a re-run is left);
    the next reconcile deletes the copy (rule 2)."""


@dataclass(frozen=True)
class FailForGood:
    """Infrastructure failed under the job and no re-run is left: ``Failed``, final."""


@dataclass(frozen=True)
class Want:
    """Hand the job to the scheduler (placed nowhere and placeable)."""


@dataclass(frozen=True)
class WaitUntil:
    """The job waits for a time (its backoff, its time limit, the end of the hold of its
    stopped copy's pods on nodes that are not Ready): ask again at ``at`` (wall seconds)."""

    at: float


@dataclass(frozen=True)
class Enqueue:
    """In a scheduling cycle: the job's request goes in GPUQueue ``queue`` at ``priority``
    with ``preemption_policy`` (this cycle's pass considers it)."""

    queue: str
    priority: int
    preemption_policy: PreemptionPolicy


@dataclass(frozen=True)
class WaitFor:
    """In a scheduling cycle: the job waits for something other than capacity (Pending with
    ``reason`` and ``message``, an Event, a Warning when ``warning``); each cycle asks again."""

    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class FailInvalid:
    """The job can never be placed as written: ``Failed``, ``Valid=False`` naming ``field``,
    a Warning Event."""

    field: str
    message: str


@dataclass(frozen=True)
class AddFinalizer:
    """Add the hub's finalizer to the GPUJob (off the placement path)."""


Step = (
    DeleteCopy
    | Forget
    | Requeue
    | Release
    | Lose
    | FailRefused
    | FailTimeLimit
    | MarkSuspects
    | StopForRerun
    | FailForGood
    | Want
    | WaitUntil
    | Enqueue
    | WaitFor
    | FailInvalid
)
Steps = tuple[Step | AddFinalizer, ...]


def decide(f: Facts) -> Steps:
    """The steps that come next for a job with facts ``f``, in order (module docstring)."""
    return (*_fate(f), *_finalizer(f))


def _fate(f: Facts) -> tuple[Step, ...]:
    placed = f.cluster is not None
    if f.deleting:
        if placed and f.work != "none":
            # A lost member deletes the copy when it returns; nothing waits for it.
            return (DeleteCopy(), Forget()) if f.member_lost else (DeleteCopy(),)
        return (Forget(),)
    if f.stopping and placed:
        if f.terminal:
            return ()
        if f.member_lost:
            return ((DeleteCopy(fenced=True),) if f.work != "none" else ()) + (Requeue(),)
        if f.work == "apply":
            return (DeleteCopy(),)
        if f.work == "none" and not f.pods_left:
            return (Requeue(),)
        if f.work == "none" and f.pods_held_until is not None:
            # judged again when the hold ends, if no inventory change comes first
            return (WaitUntil(f.pods_held_until),)
        return ()
    if f.terminal:
        return (Release(),) if f.reserved else ()
    if placed and f.member_lost:
        return (Lose(reschedule=f.reschedule_on_loss),)
    if placed and f.refused:
        return (FailRefused(), DeleteCopy())
    if placed and f.limit_at is not None and f.now >= f.limit_at:
        # 6b before 6: a copy stopped at its limit may report a failure (exit code 143 from
        # the member's activeDeadlineSeconds), which must not turn into a re-run
        return (FailTimeLimit(), DeleteCopy())
    if placed and f.failure_cluster == f.cluster:
        rerun = f.failure_exempt or f.retries_left > 0
        return (MarkSuspects(), StopForRerun() if rerun else FailForGood())
    if placed and f.limit_at is not None:
        return (WaitUntil(f.limit_at),)
    if f.valid and not placed and not f.claimed:
        if f.not_before is not None and f.now < f.not_before:
            return (WaitUntil(f.not_before),)
        return (Want(),) if f.queue is None else (_admission(f.queue),)
    return ()


def _admission(q: QueueView) -> Enqueue | WaitFor | FailInvalid:
    """Rule 7 in a scheduling cycle: in its queue, waiting with a reason, or failed."""
    if q.unlisted is not None:
        return WaitFor("NamespaceNotListed", q.unlisted, warning=True)
    if q.queue_error is not None:
        return FailInvalid("spec.placement.queue", q.queue_error)
    if q.priority_refused is not None:
        return FailInvalid(q.priority_field, q.priority_refused)
    if q.priority_missing is not None:
        return WaitFor("PriorityClassNotFound", q.priority_missing)
    return Enqueue(q.queue, q.priority, q.preemption_policy)


def _finalizer(f: Facts) -> tuple[AddFinalizer, ...]:
    needs = f.has_record or (f.valid and not f.terminal)
    if needs and not f.has_finalizer and not f.deleting:
        return (AddFinalizer(),)
    return ()


# --- the record transforms of a requeue ----------------------------------------------------------


def marked(record: JobRecord, cause: RequeueCause) -> JobRecord:
    """``record`` with its current copy being stopped for ``cause`` (pure)."""
    return record.model_copy(update={"stopping": cause})


def rerun_delay(n: int, *, base_s: float, max_s: float) -> float:
    """Seconds to wait before the ``n``-th budgeted re-run (n >= 1): ``base_s`` doubling per
    re-run, at most ``max_s`` (Kueue's ``requeuingStrategy`` shape)."""
    if n < 1 or base_s <= 0:
        return 0.0
    return float(min(max_s, base_s * 2.0 ** min(n - 1, 32)))


def budgeted(cause: RequeueCause) -> bool:
    """Whether a requeue for ``cause`` uses the job's re-run budget (and waits a backoff)."""
    return cause.kind == INFRASTRUCTURE_FAILURE and cause.reason not in NO_BUDGET_REASONS


def requeued(
    record: JobRecord, *, now: float = 0.0, base_s: float = 0.0, max_s: float = 0.0
) -> JobRecord:
    """``record`` back in the queue after its copy is gone (pure): no cluster, no
    ``stopping``; the cause appended to ``requeues`` (bounded) and counted by kind; a
    budgeted re-run (:func:`budgeted`) counted in ``budget_used`` and, with ``base_s`` > 0,
    not placed before ``now`` + :func:`rerun_delay`. The ``attempt`` is unchanged: the next
    placement writes ``attempt + 1``."""
    cause = record.stopping
    if cause is None:
        return record
    counts = dict(record.requeue_counts)
    counts[cause.kind] = counts.get(cause.kind, 0) + 1
    used = record.budget_used + (1 if budgeted(cause) else 0)
    delay = rerun_delay(used, base_s=base_s, max_s=max_s) if budgeted(cause) else 0.0
    return record.model_copy(
        update={
            "cluster": None,
            "stopping": None,
            "requeues": (*record.requeues, cause)[-MAX_REQUEUE_HISTORY:],
            "requeue_counts": counts,
            "budget_used": used,
            "not_before": now + delay if delay > 0 else None,
        }
    )


def refusal(ack: AckRecord | None, revision: int, failures: int, limit: int) -> str | None:
    """Why the member refused the Apply at ``revision`` for good (rule 5): its ``ack``
    ``Failed`` and not retryable, or ``limit`` retryable failures in a row (``failures``);
    None while it has not."""
    if ack is None or ack.revision != revision or ack.result != "Failed":
        return None
    if not ack.retryable:
        return ack.message
    if failures >= limit:
        return f"gave up after {failures} attempts: {ack.message}"
    return None


# --- infrastructure failures (rule 5) -----------------------------------------------------------


def retry_of(job: GPUJob) -> Retry:
    """The job's ``spec.placement.retry`` (its defaults when absent)."""
    return job.spec.placement.retry or Retry()


def infrastructure_cause(job: GPUJob, report: WorkloadStatus) -> FailureCause | None:
    """The infrastructure failure a workload report shows, after the job's declared exit codes
    (``spec.placement.retry.infrastructureExitCodes``); None when it shows none (no cause, an
    ``Application`` cause: the report is mirrored as usual, or a success)."""
    if report.failure is None or report.phase == "Succeeded":
        return None
    cause = with_declared_exit_codes(report.failure, retry_of(job).infrastructure_exit_codes)
    return cause if cause.kind == "Infrastructure" else None


def infrastructure_failed(
    status: GPUJobStatus, cause: FailureCause, *, cluster: str, used: int, now: str
) -> GPUJobStatus:
    """Final: infrastructure failed under the job and no re-run is left (phase Failed,
    condition ``InfrastructureFailure`` True, reason ``RetriesExhausted``)."""
    if st.is_terminal(status):
        return status
    message = (
        f"infrastructure failure in {cluster}: {cause.reason}: {cause.message}; no re-run left "
        f"({used} used, spec.placement.retry.onInfrastructureFailure)"
    )
    conds = st.set_condition(
        status.conditions,
        INFRASTRUCTURE_FAILURE,
        "True",
        reason="RetriesExhausted",
        message=message,
        now=now,
    )
    conds = st.set_condition(
        conds, "Restarting", "False", reason="RetriesExhausted", message=message, now=now
    )
    return status.model_copy(
        update={"phase": "Failed", "message": message, "conditions": conds, "completion_time": now}
    )


def requeued_status(
    status: GPUJobStatus, cause: RequeueCause, *, record: JobRecord, now: str
) -> GPUJobStatus:
    """The job's copy in ``cause.cluster`` is gone and it waits to be placed again (rule 2;
    ``record``: its record back in the queue, :func:`requeued`): phase Pending, no cluster,
    condition ``cause.kind`` True with the cause's reason and message, ``Placed=False``; the
    member's conditions and counts go; the requeues of that kind so far counted
    (``status.preemptions`` for ``Preempted``; for a re-run :func:`restart_update`); with a
    backoff, ``nextAttemptAt`` and the message say when. A terminal status is returned
    unchanged."""
    if st.is_terminal(status):
        return status
    count = record.requeue_counts.get(cause.kind, 0)
    conds = st.set_condition(
        status.conditions, cause.kind, "True", reason=cause.reason, message=cause.message, now=now
    )
    conds = st.set_condition(
        conds, "Placed", "False", reason=cause.reason, message=cause.message, now=now
    )
    if cause.kind == INFRASTRUCTURE_FAILURE:
        conds = st.set_condition(
            conds, "Restarting", "True", reason=cause.reason, message=cause.message, now=now
        )
    conds = [c for c in conds if c.type in st.HUB_CONDITIONS and c.type != "Dispatched"]
    update: dict[str, object] = {
        "phase": "Pending",
        "cluster": None,
        "message": f"{cause.message}; waiting to be placed again",
        "conditions": conds,
        "active": None,
        "ready": None,
        "succeeded": None,
        "failed": None,
        "pod_issues": [],
        "start_time": None,
        "workload": None,
    }
    if cause.kind == "Preempted":
        update["preemptions"] = count
    else:  # issue 13: a re-run after an infrastructure failure
        update.update(restart_update(status, cause, count=count, now=now))
    if record.not_before is not None:
        at = st.rfc3339(record.not_before)
        used = record.budget_used
        update["next_attempt_at"] = at
        update["message"] = (
            f"{update['message']} at {at} (backoff after {used} re-run{'s' if used != 1 else ''})"
        )
    return status.model_copy(update=update)


def restart_update(
    status: GPUJobStatus, cause: RequeueCause, *, count: int, now: str
) -> dict[str, object]:
    """The status fields for one more re-run after ``cause``: ``restarts`` = ``count`` (the
    job's infrastructure requeues so far) and ``restartHistory`` with this one appended (the
    attempt that failed is ``status.attempt``; at most :data:`MAX_RESTART_HISTORY`, newest
    last)."""
    entry = RestartRecord(
        attempt=status.attempt or 1,
        cluster=cause.cluster,
        nodes=list(cause.nodes)[:MAX_CAUSE_NODES],
        reason=cause.reason,
        message=cause.message,
        time=now or None,
    )
    history = [*status.restart_history, entry][-MAX_RESTART_HISTORY:]
    return {"restarts": count, "restart_history": history}


def restarting(status: GPUJobStatus, cause: RequeueCause, *, now: str) -> GPUJobStatus:
    """A re-run starts: its copy is being stopped (condition ``Restarting`` True, the phase
    unchanged until the copy is gone)."""
    return status.model_copy(
        update={
            "message": f"{cause.message}; restarting",
            "conditions": st.set_condition(
                status.conditions,
                "Restarting",
                "True",
                reason=cause.reason,
                message=cause.message,
                now=now,
            ),
        }
    )


def time_limit_exceeded(status: GPUJobStatus, *, limit_s: int, now: str) -> GPUJobStatus:
    """Final: the running copy reached ``spec.placement.timeLimitSeconds`` (phase Failed,
    condition ``TimeLimitExceeded`` True, reason ``DeadlineExceeded`` as a Job's own)."""
    if st.is_terminal(status):
        return status
    message = (
        f"stopped at its time limit: ran {limit_s} s since it started "
        "(spec.placement.timeLimitSeconds)"
    )
    conds = st.set_condition(
        status.conditions,
        "TimeLimitExceeded",
        "True",
        reason="DeadlineExceeded",
        message=message,
        now=now,
    )
    return status.model_copy(
        update={"phase": "Failed", "message": message, "conditions": conds, "completion_time": now}
    )
