"""The job lifecycle rule (gpufed.hub.rules.lifecycle.decide) against a model of the outside
world: one job, two members, copies of the job in them (objects and pods), and events arriving
in any order (acks, pods terminating, members lost and back, deletion, preemption, failures,
the job finishing). The steps decide() returns are carried out on the model, and what must hold
is checked on the model's copies alone, never with decide():

- nothing runs twice: a job is placed again only when no copy of it is alive in a reachable
  member (alive: its objects are still applied, or its pods still run);
- a deleted job lets go (its finalizer dropped) only once every copy's Delete was sent and a
  reachable member acknowledged it (its pods may still terminate: the member deletes them; a
  lost member deletes what it holds when it returns);
- terminal is final: a finished job is never placed, requeued or re-run again, and once the
  world is quiet it holds no reservation (the hub's ledger would keep its GPUs from others);
- a requeue waits for the copy: the job turns Pending only after its copy's Delete was
  acknowledged and its pods are gone (or its member is lost; pods on a node that is not Ready
  count until their hold ends, and only a copy held so waits for a time);
- progress: once the world stops changing, reconciling reaches a fixed point in a few rounds,
  and no job is left placed in a lost member.

The sequences Hypothesis found when a rule was broken on purpose are kept as examples below.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hypothesis import settings
from hypothesis import strategies as hs
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gpufed.hub.rules import lifecycle as lc
from gpufed.hub.rules.records import JobRecord, RequeueCause

MEMBERS = ("m1", "m2")
#: when an unready-pod hold ends (the model has no clock: only that a time is asked for)
HOLD_END = 300.0


@dataclass
class Copy:
    """The job's objects and pods in one member."""

    work: str = "apply"  # apply | delete | fenced | none (Delete acknowledged)
    pods: bool = True
    #: fenced after its member was lost: what still runs there when the member returns is
    #: accepted (``reschedule: OnClusterLoss`` is opt-in; docs/design.md §7 item 5), and the
    #: agent deletes it before it takes any new work
    fenced: bool = False
    #: its pods are on a node that is not Ready and count only until their hold ends (the
    #: kubelet never confirms them gone)
    unready: bool = False

    @property
    def alive(self) -> bool:
        return self.work == "apply" or self.pods


@dataclass
class World:
    cluster: str | None = None
    has_record: bool = False
    stopping: bool = False
    deleting: bool = False
    terminal: bool = False
    finalizer: bool = False
    failure: str | None = None
    retries_left: int = 2
    reschedule: bool = True
    wanted: bool = False
    copies: dict[str, Copy] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)
    pending_after_requeue: bool = False
    #: the finalizer was dropped: the API server removes the GPUJob and the hub forgets it
    gone: bool = False
    #: the member refused the current copy's Apply for good (in that member)
    refused_in: str | None = None
    #: the job's reservation in the hub's ledger: taken when it is placed, settled once its
    #: pods show up in the member's inventory, released by the steps that end a copy
    reserved: bool = False

    def facts(self) -> lc.Facts:
        c = self.copies.get(self.cluster) if self.cluster else None
        return lc.Facts(
            deleting=self.deleting,
            terminal=self.terminal,
            valid=True,
            claimed=False,
            has_record=self.has_record,
            cluster=self.cluster,
            stopping=self.stopping,
            work="none" if c is None else c.work,  # type: ignore[arg-type]
            pods_left=c is not None and c.pods,
            pods_held_until=HOLD_END if c is not None and c.pods and c.unready else None,
            member_lost=self.cluster in self.lost,
            refused=c is not None and c.work == "apply" and self.refused_in == self.cluster,
            failure_cluster=self.failure,
            retries_left=self.retries_left,
            reschedule_on_loss=self.reschedule,
            has_finalizer=self.finalizer,
            reserved=self.reserved,
        )

    def runs_reachable(self) -> bool:
        """The current copy is applied and its pods run, in a member that is not lost."""
        c = self.copies.get(self.cluster) if self.cluster else None
        return c is not None and c.work == "apply" and c.pods and self.cluster not in self.lost

    def alive_reachable(self) -> list[str]:
        return [
            m for m, c in self.copies.items() if c.alive and not c.fenced and m not in self.lost
        ]


class LifecycleModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.w = World()
        self.w.wanted = False
        self.reconcile()

    # --- the hub: reconcile and the scheduler ------------------------------------------------------

    @rule()
    def reconcile(self) -> None:
        w = self.w
        if w.gone:
            return
        for step in lc.decide(w.facts()):
            self.apply(step)

    def apply(self, step: lc.Step | lc.AddFinalizer) -> None:
        w = self.w
        match step:
            case lc.DeleteCopy(fenced=fenced):
                assert w.cluster is not None
                c = w.copies.get(w.cluster)
                if c is not None and c.work != "none":
                    c.work = "fenced" if fenced else "delete"
                    c.fenced = c.fenced or fenced
            case lc.Forget():
                assert w.deleting, "only a deleted job is forgotten"
                assert not [m for m, c in w.copies.items() if c.work == "apply"], (
                    "let go while a copy's Delete was never sent"
                )
                current = w.copies.get(w.cluster) if w.cluster else None
                assert w.cluster in w.lost or current is None or current.work == "none", (
                    "let go before a reachable member acknowledged the Delete"
                )
                w.has_record = False
                w.cluster = None
                w.gone = True
                w.reserved = False
            case lc.Requeue():
                assert not w.terminal, "terminal is final"
                assert not w.alive_reachable(), "requeued while the copy may still run"
                w.cluster, w.stopping = None, False
                w.pending_after_requeue = True
                w.reserved = False
            case lc.Lose(reschedule=reschedule):
                assert w.cluster in w.lost
                w.reserved = False
                if reschedule:
                    c = w.copies.get(w.cluster)
                    if c is not None and c.work != "none":
                        c.work, c.fenced = "fenced", True
                    w.cluster = None
                else:
                    w.terminal = True
            case lc.FailRefused():
                assert w.refused_in == w.cluster
                w.terminal, w.reserved = True, False
            case lc.MarkSuspects():
                assert w.failure is not None
            case lc.StopForRerun():
                assert w.retries_left > 0
                assert not w.terminal
                w.stopping, w.failure = True, None
                w.retries_left -= 1
            case lc.FailForGood():
                assert w.retries_left == 0
                w.terminal, w.failure, w.reserved = True, None, False
            case lc.Release():
                assert w.terminal, "only a finished job's reservation is released here"
                assert w.reserved, "released a reservation that is not there"
                w.reserved = False
            case lc.WaitUntil(at=at):
                c = w.copies.get(w.cluster) if w.cluster else None
                assert w.stopping, "only a stopped copy's job waits for a time here"
                assert c is not None
                assert c.work == "none", "waits before the member acknowledged the Delete"
                assert c.pods, "waits for pods that are gone"
                assert c.unready, "waits for pods whose node is Ready"
                assert at == HOLD_END
            case lc.Want():
                assert not w.terminal, "terminal is final"
                assert not w.deleting
                w.wanted = True
            case lc.AddFinalizer():
                assert not w.deleting
                w.finalizer = True

    @rule(member=hs.sampled_from(MEMBERS))
    def place(self, member: str) -> None:
        w = self.w
        if not w.wanted or w.cluster is not None or w.deleting or w.terminal or member in w.lost:
            return
        assert not w.alive_reachable(), "placed while another copy runs"
        assert not w.terminal
        w.wanted = False
        w.cluster, w.has_record, w.pending_after_requeue = member, True, False
        w.copies[member] = Copy()
        w.reserved = True
        w.refused_in = None

    # --- the members -------------------------------------------------------------------------------

    @rule(member=hs.sampled_from(MEMBERS))
    def ack_delete(self, member: str) -> None:
        c = self.w.copies.get(member)
        if c is not None and c.work in ("delete", "fenced") and member not in self.w.lost:
            c.work = "none"

    @rule()
    def pods_bound(self) -> None:
        # the member's inventory shows the copy's pods: the reservation is settled
        if self.w.runs_reachable():
            self.w.reserved = False

    @rule(member=hs.sampled_from(MEMBERS))
    def pods_terminate(self, member: str) -> None:
        c = self.w.copies.get(member)
        if c is not None and c.work != "apply":
            c.pods = False

    @rule(member=hs.sampled_from(MEMBERS))
    def node_not_ready(self, member: str) -> None:
        c = self.w.copies.get(member)
        if c is not None and c.pods:
            c.unready = True

    @rule(member=hs.sampled_from(MEMBERS))
    def unready_hold_ends(self, member: str) -> None:
        # the pods are never confirmed gone; past the hold the hub no longer counts them
        c = self.w.copies.get(member)
        if c is not None and c.unready and c.work != "apply":
            c.pods = False

    @rule(member=hs.sampled_from(MEMBERS))
    def member_lost(self, member: str) -> None:
        self.w.lost.add(member)

    @rule(member=hs.sampled_from(MEMBERS))
    def member_back(self, member: str) -> None:
        self.w.lost.discard(member)
        c = self.w.copies.get(member)
        if c is not None and c.work in ("delete", "fenced"):
            c.work = "none"  # the desired set first: the agent deletes what it must not hold

    # --- the user and the job ------------------------------------------------------------------------

    @rule()
    def delete(self) -> None:
        self.w.deleting = True

    @precondition(lambda self: self.w.cluster is not None and not self.w.stopping)
    @rule()
    def finish(self) -> None:
        if self.w.runs_reachable():
            self.w.terminal = True

    @rule()
    def infrastructure_failure(self) -> None:
        w = self.w
        if w.cluster is not None and not w.terminal and not w.deleting and not w.stopping:
            c = w.copies.get(w.cluster)
            if c is not None and c.work == "apply":
                w.failure = w.cluster

    @rule()
    def member_refuses(self) -> None:
        w = self.w
        c = w.copies.get(w.cluster) if w.cluster else None
        if c is not None and c.work == "apply" and w.cluster not in w.lost and not w.terminal:
            w.refused_in, c.pods = w.cluster, False  # nothing of it started

    @rule()
    def preempt(self) -> None:
        w = self.w
        if w.cluster is not None and not w.stopping and not w.terminal and not w.deleting:
            w.stopping = True

    @rule(reschedule=hs.booleans())
    def reschedule_policy(self, reschedule: bool) -> None:
        self.w.reschedule = reschedule

    # --- what must hold ------------------------------------------------------------------------------

    @invariant()
    def at_most_one_copy_alive_in_reachable_members(self) -> None:
        assert len(self.w.alive_reachable()) <= 1

    @invariant()
    def a_fixed_point_is_reached_once_the_world_is_quiet(self) -> None:
        # Copy the world, deliver what members would do on their own, and reconcile: a handful
        # of rounds must settle (no step is asked for twice forever).
        saved = self.w
        self.w = World(**{k: v for k, v in vars(saved).items()})
        self.w.copies = {m: replace(c) for m, c in saved.copies.items()}
        self.w.lost = set(saved.lost)
        try:
            for _ in range(6):
                for m in MEMBERS:
                    self.ack_delete(m)
                    self.pods_terminate(m)
                self.reconcile()
            if self.w.gone:
                return
            before = lc.decide(self.w.facts())
            self.reconcile()
            assert lc.decide(self.w.facts()) == before, "reconcile keeps changing a quiet world"
            assert all(not isinstance(s, lc.Requeue | lc.Forget) for s in before), before
            w = self.w
            assert w.terminal or w.deleting or w.cluster not in w.lost, (
                "a job is left placed in a lost member"
            )
            assert not (w.terminal and w.reserved), "a finished job keeps its reservation"

            refused = w.copies.get(w.refused_in) if w.refused_in else None
            if refused is not None and w.cluster == w.refused_in and w.refused_in not in w.lost:
                assert w.terminal or w.deleting or w.stopping, "a refused job does not fail"
                assert refused.work != "apply", "a refused copy is not deleted"
        finally:
            self.w = saved


LifecycleModel.TestCase.settings = settings(max_examples=400, stateful_step_count=20, deadline=None)
test_lifecycle_model = LifecycleModel.TestCase


def test_a_job_being_deleted_waits_for_its_copy_in_a_reachable_member() -> None:
    f = lc.Facts(deleting=True, has_record=True, cluster="m1", work="apply")
    assert lc.decide(f) == (lc.DeleteCopy(),)
    assert lc.decide(lc.Facts(deleting=True, has_record=True, cluster="m1", work="delete")) == (
        lc.DeleteCopy(),
    )
    assert lc.decide(lc.Facts(deleting=True, has_record=True, cluster="m1")) == (lc.Forget(),)


def test_a_finished_job_being_stopped_stays_finished() -> None:
    f = lc.Facts(terminal=True, has_record=True, cluster="m1", stopping=True, work="none")
    assert lc.decide(f) == ()


def test_an_infrastructure_failure_reruns_while_retries_last() -> None:
    f = lc.Facts(has_record=True, cluster="m1", work="apply", failure_cluster="m1")
    assert lc.decide(f.__class__(**{**vars(f), "retries_left": 1})) == (
        lc.MarkSuspects(),
        lc.StopForRerun(),
    )
    assert lc.decide(f) == (lc.MarkSuspects(), lc.FailForGood())
    # A failure seen on a copy the job has left behind is not this copy's.
    assert lc.decide(f.__class__(**{**vars(f), "failure_cluster": "m2"})) == ()


def _run(*steps: tuple[str, str | None]) -> LifecycleModel:
    m = LifecycleModel()
    for name, arg in steps:
        getattr(m, name)(*(() if arg is None else (arg,)))
    return m


def test_a_stopped_copy_is_requeued_only_once_its_pods_are_gone() -> None:
    m = _run(("place", "m1"), ("preempt", None), ("reconcile", None), ("ack_delete", "m1"))
    m.reconcile()
    assert m.w.cluster == "m1", "requeued while its pods still terminate"
    m.pods_terminate("m1")
    m.reconcile()
    assert m.w.cluster is None
    assert m.w.pending_after_requeue


def test_pods_on_a_node_not_ready_hold_the_requeue_until_their_hold_ends() -> None:
    m = _run(("place", "m1"), ("preempt", None), ("reconcile", None), ("ack_delete", "m1"))
    m.node_not_ready("m1")
    m.reconcile()  # the model's Requeue asserts no copy may still run; a wait is checked too
    assert m.w.cluster == "m1", "requeued while pods on a node not Ready still count"
    m.unready_hold_ends("m1")
    m.reconcile()
    assert m.w.cluster is None
    assert m.w.pending_after_requeue


def test_a_copy_being_stopped_in_a_member_that_is_lost_is_requeued_at_once() -> None:
    m = _run(("place", "m1"), ("preempt", None), ("reconcile", None), ("member_lost", "m1"))
    m.reconcile()
    assert m.w.pending_after_requeue, "requeued for its own cause, not lost"
    assert m.w.copies["m1"].fenced


def test_the_backoff_doubles_from_the_base_up_to_the_cap() -> None:
    # Kueue's requeuingStrategy shape with gpufed's defaults: 60 s doubling, 3,600 s at most.
    got = [lc.rerun_delay(n, base_s=60, max_s=3600) for n in range(1, 9)]
    assert got == [60, 120, 240, 480, 960, 1920, 3600, 3600]
    assert lc.rerun_delay(10_000, base_s=60, max_s=3600) == 3600
    assert lc.rerun_delay(1, base_s=0, max_s=3600) == 0


def test_a_job_in_backoff_waits_and_is_wanted_once_it_passed() -> None:
    f = lc.Facts(has_record=True, now=100.0, not_before=160.0)
    assert lc.decide(f) == (lc.WaitUntil(160.0),)
    assert lc.decide(lc.Facts(has_record=True, now=160.0, not_before=160.0)) == (lc.Want(),)


def test_a_drain_re_runs_without_budget_or_backoff() -> None:
    # No re-run left, but the member drained the node: not the job's failure.
    f = lc.Facts(
        has_record=True, cluster="m1", work="apply", failure_cluster="m1", failure_exempt=True
    )
    assert lc.decide(f) == (lc.MarkSuspects(), lc.StopForRerun())
    drained = JobRecord(uid="u", job="ns/j", cluster="m1", stopping=_cause("EvictionByEvictionAPI"))
    after = lc.requeued(drained, now=100.0, base_s=60, max_s=3600)
    assert (after.budget_used, after.not_before) == (0, None)
    lost = JobRecord(uid="u", job="ns/j", cluster="m1", stopping=_cause("NodeLost"))
    after = lc.requeued(lost, now=100.0, base_s=60, max_s=3600)
    assert (after.budget_used, after.not_before) == (1, 160.0)
    again = lc.requeued(
        after.model_copy(update={"cluster": "m1", "stopping": _cause("NodeLost")}),
        now=1000.0,
        base_s=60,
        max_s=3600,
    )
    assert (again.budget_used, again.not_before) == (2, 1120.0)


def _cause(reason: str) -> RequeueCause:
    return RequeueCause(
        kind="InfrastructureFailure", reason=reason, message="m", at=1.0, cluster="m1"
    )


def test_a_stopped_copy_held_by_pods_on_unready_nodes_is_asked_again_when_the_hold_ends() -> None:
    held = lc.Facts(has_record=True, cluster="m1", stopping=True, pods_left=True)
    assert lc.decide(held) == ()  # pods on Ready nodes (or held until confirmed gone)
    hold = replace(held, pods_held_until=400.0)
    assert lc.decide(hold) == (lc.WaitUntil(400.0),)
    assert lc.decide(replace(hold, work="delete")) == ()  # the Delete not acknowledged yet
    assert lc.decide(replace(hold, pods_left=False)) == (lc.Requeue(),)
