"""Rule 7 in a scheduling cycle (gpufed.hub.rules.lifecycle.decide with a QueueView): whether a
waiting job goes in its queue, waits with a reason or fails for good.

Checked over every combination of the cycle's view (namespace listed or not, the queue taken or
refused, the priority resolved, missing or refused) and of the job's other facts (deleted,
finished, placed, adopted, invalid, in backoff) against a reference written as the table of
what each combination means (:func:`expected`), never with decide() itself:

- the view matters only for a job that waits to be placed: for any other job decide() answers
  as without it;
- a waiting job gets exactly one of Enqueue (with the view's queue and priority), WaitFor (the
  reason and message, a Warning for an unlisted namespace) or FailInvalid (naming the field);
- the namespace comes first (without a GPUQueue for it no queue can be named), then the queue,
  then the priority.

Each rule broken on purpose (:data:`MUTANTS`) is caught.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import pytest

from gpufed.hub.rules import lifecycle as lc

PRIORITY_FIELD = "spec.template.spec.priorityClassName"
#: the view's parts: namespace listed?, queue refused?, priority: ok | missing | refused
VIEWS = list(itertools.product((False, True), (False, True), ("ok", "missing", "refused")))
#: the job's other facts: (name, facts) — a waiting job first, then each way of not waiting
JOBS: list[tuple[str, lc.Facts]] = [
    ("waiting", lc.Facts(now=100.0)),
    ("waiting after its backoff", lc.Facts(now=100.0, has_record=True, not_before=50.0)),
    ("in backoff", lc.Facts(now=100.0, has_record=True, not_before=150.0)),
    ("invalid", lc.Facts(now=100.0, valid=False)),
    ("adopted", lc.Facts(now=100.0, claimed=True)),
    ("placed", lc.Facts(now=100.0, has_record=True, cluster="m1", work="apply")),
    ("finished", lc.Facts(now=100.0, terminal=True)),
    ("deleted", lc.Facts(now=100.0, deleting=True)),
]


def view(unlisted: bool, queue_refused: bool, priority: str) -> lc.QueueView:
    return lc.QueueView(
        queue="team-a",
        priority=700,
        preemption_policy="Never",
        unlisted="namespace dev is listed by no GPUQueue" if unlisted else None,
        queue_error="GPUQueue other does not list dev" if queue_refused else None,
        priority_refused="above the cap" if priority == "refused" else None,
        priority_field=PRIORITY_FIELD,
        priority_missing="PriorityClass high does not exist" if priority == "missing" else None,
    )


def expected(job: str, unlisted: bool, queue_refused: bool, priority: str) -> object:
    """The reference: what a cycle must do with this job and view (None: the view does not
    matter, decide() answers as without it)."""
    if job not in ("waiting", "waiting after its backoff"):
        return None
    if unlisted:
        return ("wait", "NamespaceNotListed", True)
    if queue_refused:
        return ("fail", "spec.placement.queue")
    if priority == "refused":
        return ("fail", PRIORITY_FIELD)
    if priority == "missing":
        return ("wait", "PriorityClassNotFound", False)
    return ("enqueue", "team-a", 700, "Never")


def observed(steps: lc.Steps) -> object:
    admission = [s for s in steps if isinstance(s, lc.Enqueue | lc.WaitFor | lc.FailInvalid)]
    if len(admission) != 1:
        return ("steps", steps)
    (s,) = admission
    match s:
        case lc.Enqueue():
            return ("enqueue", s.queue, s.priority, s.preemption_policy)
        case lc.WaitFor():
            return ("wait", s.reason, s.warning)
        case lc.FailInvalid():
            return ("fail", s.field)


def violations(decide: Callable[[lc.Facts], lc.Steps]) -> list[str]:
    out = []
    for (name, facts), parts in itertools.product(JOBS, VIEWS):
        want = expected(name, *parts)
        steps = decide(replace(facts, queue=view(*parts)))
        if want is None:
            if steps != decide(facts):
                out.append(f"{name} {parts}: {steps} differs from {decide(facts)} without a view")
        elif (got := observed(steps)) != want:
            out.append(f"{name} {parts}: {got}, expected {want}")
        elif want[0] == "wait" and not any(isinstance(s, lc.WaitFor) and s.message for s in steps):
            out.append(f"{name} {parts}: a wait without its message")
    return out


def test_rule_7_in_a_cycle_matches_the_reference_for_every_combination() -> None:
    assert violations(lc.decide) == []


def test_without_a_view_a_waiting_job_is_handed_to_the_scheduler() -> None:
    assert lc.decide(lc.Facts(now=1.0)) == (lc.Want(),)


def _unlisted_after_queue(q: lc.QueueView) -> lc.Enqueue | lc.WaitFor | lc.FailInvalid:
    if q.queue_error is not None:
        return lc.FailInvalid("spec.placement.queue", q.queue_error)
    return ORIGINAL(q)


def _queue_error_waits(q: lc.QueueView) -> lc.Enqueue | lc.WaitFor | lc.FailInvalid:
    if q.unlisted is None and q.queue_error is not None:
        return lc.WaitFor("QueueRefused", q.queue_error)
    return ORIGINAL(q)


def _missing_class_fails(q: lc.QueueView) -> lc.Enqueue | lc.WaitFor | lc.FailInvalid:
    got = ORIGINAL(q)
    if isinstance(got, lc.WaitFor) and got.reason == "PriorityClassNotFound":
        return lc.FailInvalid(q.priority_field, got.message)
    return got


def _refused_priority_enqueued(q: lc.QueueView) -> lc.Enqueue | lc.WaitFor | lc.FailInvalid:
    return ORIGINAL(replace(q, priority_refused=None))


def _priority_dropped(q: lc.QueueView) -> lc.Enqueue | lc.WaitFor | lc.FailInvalid:
    got = ORIGINAL(q)
    return replace(got, priority=0) if isinstance(got, lc.Enqueue) else got


def _quiet_unlisted(q: lc.QueueView) -> lc.Enqueue | lc.WaitFor | lc.FailInvalid:
    got = ORIGINAL(q)
    return replace(got, warning=False) if isinstance(got, lc.WaitFor) else got


ORIGINAL = lc._admission
MUTANTS = [
    _unlisted_after_queue,
    _queue_error_waits,
    _missing_class_fails,
    _refused_priority_enqueued,
    _priority_dropped,
    _quiet_unlisted,
]


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.__name__)
def test_each_broken_rule_is_caught(
    mutant: Callable[[lc.QueueView], lc.Enqueue | lc.WaitFor | lc.FailInvalid],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lc, "_admission", mutant)
    assert violations(lc.decide) != []


def test_a_view_given_to_a_job_that_does_not_wait_is_caught() -> None:
    def everyone_enqueued(f: lc.Facts) -> lc.Steps:
        if f.queue is not None and f.queue.unlisted is None and f.queue.queue_error is None:
            return (lc.Enqueue(f.queue.queue, f.queue.priority, f.queue.preemption_policy),)
        return lc.decide(f)

    assert violations(everyone_enqueued) != []
