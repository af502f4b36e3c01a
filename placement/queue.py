"""Queue order and the backfill rule of the scheduling loop (pure).

The hub's scheduling loop (and the simulator) call :func:`schedule_pass` whenever the fleet
changes or jobs arrive: it walks the waiting jobs in :func:`pass_key` order and asks the
caller's ``attempt`` callback to place each one (the callback runs ``place()`` and, on
``Placed``, reserves at once, so later jobs in the same pass see the capacity as taken).

Order of a pass (:func:`pass_key`; :func:`order_key` is the plain first-come order): higher
``priority`` first; within a priority, the jobs that have waited ``oldest_first_s`` (default
16 h) or more, oldest first; then the others, fewer GPUs first (``BackfillRule.order``
``smallest-first``, the default, MIG devices counted as their fraction of a GPU and CPU-only
jobs as 0, a size divided by ``1 + waited / BackfillRule.size_aging_s``; ``fifo``: earlier
first whatever their size, arrival order, the old default), then earlier ``submitted_at``;
then job name and UID. Why: a small job that finds
room starts before a big one that would take the same GPUs, which shortens the mean wait; a job
that has waited ``oldest_first_s`` is walked before every job that has not, so its hold (below)
keeps them all off its nodes and it cannot starve.

Backfill rule (docs/placement.md, "Queue and backfill"):

* a job that does not fit does not block the jobs behind it: smaller jobs that fit are placed
  around it (no head-of-line blocking), so it never blocks them forever;
* but once a job has waited ``starvation_s`` (default 30 min) without fitting, it *holds* the
  nodes nearest to fitting it (``hold_for`` callback, :func:`gpufed.placement.hold_for`: in the
  member where they have the most free GPUs, the NVLink domain, rack or block, or the set of
  nodes, that would hold the job once drained): jobs after it in the order may no longer be
  placed on those nodes, so the work running there drains until the starving job fits,
  however many small jobs keep arriving; the rest of the member keeps backfilling. A hold keeps
  off the jobs *after* the holder in the pass order, except the jobs of its priority submitted
  before it (an older job is never held back by a younger job's hold, whatever the order):
  before ``oldest_first_s`` a job's hold binds the younger bigger jobs behind it, after it
  every younger job. A higher-priority job is ahead in the order and therefore also holds
  before lower ones. At most ``max_holds`` jobs that have not waited ``oldest_first_s`` hold
  nodes at once (the first failing starving ones of the order, fleet-wide); a job that has
  waited ``oldest_first_s`` holds whatever the cap (and does not count in it; ``max_holds=0``
  still turns holds off), so its wait is
  bounded by ``oldest_first_s`` plus one drain of its nodes, within a queue (with GPUQueues,
  fair share orders the queues first).
* with ``BackfillRule.carry_holds``, the holds of the previous pass whose holders still wait
  also bind the jobs walked *before* their holder that the holder's hold would bind (younger or
  of lower priority: under ``smallest-first`` the fresh smaller jobs), until the holder is
  walked and holds afresh; a job whose time limit ends by the hold's start may still borrow it.

Within one pass the fleet only loses capacity, so a job whose constraints and pod sets equal
those of a job that already failed in the pass is answered from that failure without calling
``place()`` again (:func:`fit_key`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufed.api.decision import Decision, Outcome
from gpufed.api.labels import GPU_RESOURCE, MIG_RESOURCE_PREFIX
from gpufed.api.request import PlacementRequest
from gpufed.placement.backfill import backfill_note, best_hold, borrowable, ran_inside

#: ``BackfillRule.order`` values
QUEUE_ORDERS = ("smallest-first", "fifo")
QueueOrder = Literal["smallest-first", "fifo"]
#: ``BackfillRule.hold_choice`` values
HOLD_CHOICES = ("earliest-start", "least-idle")
HoldChoice = Literal["earliest-start", "least-idle"]
#: ``BackfillRule.hold_nodes`` values
HOLD_NODES = ("most-free", "earliest-drain", "earliest-drain-multi", "earliest-drain-multi-free")
HoldNodes = Literal[
    "most-free", "earliest-drain", "earliest-drain-multi", "earliest-drain-multi-free"
]
#: defaults of ``BackfillRule.holds_per_shape`` and ``size_aging_s`` (the hub's
#: ``--queue-holds-per-shape`` / ``--queue-size-aging`` and the simulator's flags of the same
#: names): tuned on the contended ITP week (docs/benchmarks.md, issue 29)
DEFAULT_HOLDS_PER_SHAPE = 4
DEFAULT_SIZE_AGING_S = 1800.0
#: default of ``BackfillRule.carry_holds`` (the hub's ``--queue-carry-holds`` and the simulator's)
DEFAULT_CARRY_HOLDS = False
#: default of ``BackfillRule.spare_whole_nodes_s`` (the hub's ``--queue-spare-whole-nodes``, the
#: simulator's), seconds
DEFAULT_SPARE_WHOLE_NODES_S = 5400.0


@dataclass(frozen=True)
class Hold:
    """Nodes of one member kept for a starving job (``nodes`` empty: the whole member).

    ``starts_at``: when the holder is expected to start there (seconds, the pass clock;
    :func:`gpufed.placement.backfill.expected_start`), for a hold the backfill rule took and
    whose start could be estimated; a job with a time limit that ends by then may use the
    nodes (backfill). None: nothing else may use them (a preemptor's hold, suspect nodes, a
    start that depends on a job without a limit).
    """

    cluster: str
    nodes: Set[str]
    reason: str
    starts_at: float | None = None

    def merged(self, other: Hold) -> Hold:
        """Both holds on the same member: the union of their nodes (whole member if either);
        borrowable until the earlier of the two starts (not at all if either is not)."""
        nodes = frozenset() if not self.nodes or not other.nodes else self.nodes | other.nodes
        starts = (
            None
            if self.starts_at is None or other.starts_at is None
            else min(self.starts_at, other.starts_at)
        )
        return Hold(self.cluster, nodes, f"{self.reason}; {other.reason}", starts)


class BackfillRule(BaseModel):
    """Parameters of the backfill rule and the pass order (module docstring).

    ``starvation_s``: seconds a job waits before it may hold nodes; ``max_holds``: starving
    jobs that hold nodes at once, fleet-wide, not counting jobs past ``oldest_first_s``, which
    always may (0: no holds at all); ``oldest_first_s``: seconds a job waits before it is walked
    ahead of every younger job of its priority (oldest first); ``order``: how the other jobs
    are ordered within a priority (``smallest-first``: fewer GPUs first; ``fifo``: earlier
    first, and then ``oldest_first_s`` changes nothing); ``backfill_by_limit``: a job whose
    time limit ends before a hold's expected start may run on the held nodes (:mod:`.backfill`;
    used where the caller estimates starts: ``schedule_pass(hold_start=...)``);
    ``holds_per_shape``: starving jobs of one shape (:func:`fit_key`) that may hold nodes in
    one pass, each other nodes (where the caller gives ``schedule_pass(hold_avoiding=...)``;
    else 1), within ``max_holds`` (default 4; 1: one per shape per pass); ``size_aging_s``:
    with ``smallest-first``, a job's size in the order is divided by ``1 + waited /
    size_aging_s`` (default 1,800 s; 0: not at all), so a bigger job that has waited goes
    ahead of smaller fresh ones before ``oldest_first_s``; ``hold_within_wait``: a starving
    job that has not waited ``oldest_first_s`` takes a hold only when its expected start there
    (``hold_start``) is at most as far ahead as it has waited (no estimate: it holds), so a
    drain longer than the wait so far idles no GPUs yet (default off); ``hold_candidates``:
    with ``hold_avoiding`` and ``hold_start``, a starving job weighs this many node sets
    (``hold_for``'s choice, then the next ones ``hold_avoiding`` names) and holds the one where
    it is expected to start first (Slurm reserves the earliest start; 1: ``hold_for``'s choice);
    ``carry_holds``: the holds the previous pass took (``schedule_pass(carry=...)``, from its
    ``PassResult.taken``) whose holders still wait bind, from the start of the pass, the jobs
    walked before their holder that a hold of that holder would bind (younger or of lower
    priority; a job whose time limit ends by the hold's start, re-estimated now, may still
    borrow it), until the holder is walked and holds afresh; so under ``smallest-first`` the
    fresh small jobs walked first no longer take the GPUs a starving bigger job is draining
    (default off); ``spare_whole_nodes_s``: with ``schedule_pass(spare=...)``, a job smaller
    than a node that has waited less than this (seconds; 0: off; default 5,400: 90 minutes)
    is first tried only on partly used nodes; if it finds no room there it is tried again
    after the whole pass, anywhere: the nodes free from end to end go first to the jobs of
    the pass that need them whole, and a small job gives them up for at most this long
    (never one past ``oldest_first_s``); ``hold_choice``: which of the ``hold_candidates``
    a starving job holds: ``earliest-start`` (the default) or ``least-idle``, the one whose
    GPUs stand idle least until its expected start (``schedule_pass(hold_rank=...)``);
    ``start_accuracy`` (in (0, 1], default 1): the expected start of a hold counts each
    running job as ending at its start plus this fraction of its time limit (not before now)
    rather than at its limit, as users' limits over-estimate runtimes (the callers'
    ``hold_start``; < 1 lends less, never more: a job borrowing must still end, by its own
    limit, before that earlier start);
    ``hold_nodes``: how ``hold_for`` picks a starving job's nodes: ``most-free`` (the default:
    the nodes or group with the most free GPUs now) or ``earliest-drain`` (where the running
    jobs' time limits free them first: ``hold_for``'s ``start_on``, given by the caller) or
    ``earliest-drain-multi`` (so for jobs of several GPU pods; one-pod jobs most-free) or
    ``earliest-drain-multi-free`` (as that, the earliest start's nodes taken most free first:
    ``hold_for``'s ``free_first``); ``oldest_first_one_pod_s`` (seconds, default None: off):
    a job of one GPU pod (:func:`gpu_pods_of`; an 8-GPU job is one whole HGX node) counts as
    past ``oldest_first_s`` once it has waited this long, when that is shorter
    (:meth:`oldest_first_for`): it is walked oldest first and holds whatever the cap, so the
    one-node jobs' tail no longer waits on the cap the starving small jobs take first
    (docs/benchmarks.md, issue 29, ``backfill6``); every job's bound stays
    ``oldest_first_s`` or less; ``hold_busy_nodes`` (default off): a starving job of one
    HGX node may hold a node with no free GPU when every node of the pool is full
    (``hold_for``'s ``busy``; the caller passes it); ``hold_busy_by_drain`` (default off;
    with ``hold_busy_nodes``): that full node is the one where the job is expected to start
    first, not the first by name (``hold_for``'s ``busy_start_on``; the caller passes it);
    ``hold_keep_one_node`` (default off): a starving job of one GPU pod holds again the nodes
    it held in the last pass while they can still take it, the other rules choosing only for
    a new holder (``hold_for``'s ``keep``; the caller passes the last pass's hold, from
    ``PassResult.taken``), so its hold stays on the node draining for it (docs/benchmarks.md,
    issue 29, ``backfill8``); ``spare_draining_s`` (seconds, default 0: off; with
    ``spare_whole_nodes_s``): the partly used nodes whose running jobs all end, by their
    limits, within this long are spared too, from the jobs that would run past that drain
    (the caller's ``spare``; the simulator's :mod:`gpufed.placement.sim.simdrain`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    starvation_s: float = Field(default=1800.0, ge=0)
    max_holds: int = Field(default=4, ge=0)
    oldest_first_s: float = Field(default=57600.0, ge=0)
    order: QueueOrder = "smallest-first"
    backfill_by_limit: bool = True
    holds_per_shape: int = Field(default=DEFAULT_HOLDS_PER_SHAPE, ge=1)
    size_aging_s: float = Field(default=DEFAULT_SIZE_AGING_S, ge=0)
    hold_within_wait: bool = False
    hold_candidates: int = Field(default=1, ge=1, le=16)
    carry_holds: bool = DEFAULT_CARRY_HOLDS
    spare_whole_nodes_s: float = Field(default=DEFAULT_SPARE_WHOLE_NODES_S, ge=0)
    hold_choice: HoldChoice = "earliest-start"
    start_accuracy: float = Field(default=1.0, gt=0, le=1)
    hold_nodes: HoldNodes = "most-free"
    oldest_first_one_pod_s: float | None = Field(default=None, ge=0)
    hold_busy_nodes: bool = False
    hold_busy_by_drain: bool = False
    hold_keep_one_node: bool = False
    spare_draining_s: float = Field(default=0.0, ge=0)

    def oldest_first_for(self, request: PlacementRequest) -> float:
        """Seconds ``request`` waits before it is walked oldest first and holds whatever the
        cap: ``oldest_first_s``, or for a job of one GPU pod the smaller of it and
        ``oldest_first_one_pod_s`` when that is set."""
        if self.oldest_first_one_pod_s is not None and gpu_pods_of(request) == 1:
            return min(self.oldest_first_s, self.oldest_first_one_pod_s)
        return self.oldest_first_s


def order_key(request: PlacementRequest) -> tuple[int, float, str, str]:
    """First-come sort key: priority (high first), submit time, job name, UID (the pass order
    with ``order="fifo"``, and the order of preemption candidates)."""
    return (-request.priority, request.submitted_at, request.job, request.uid)


def gpu_pods_of(request: PlacementRequest) -> int:
    """Pods of the job that request whole GPUs (``nvidia.com/gpu``), all pod sets together."""
    return sum(ps.count for ps in request.pod_sets if ps.requests.get(GPU_RESOURCE, 0) > 0)


def gpus_of(request: PlacementRequest) -> int:
    """Whole GPUs (``nvidia.com/gpu``) the job requests, all pods together."""
    return sum(ps.count * ps.requests.get(GPU_RESOURCE, 0) for ps in request.pod_sets)


#: compute slices of a whole MIG-capable GPU (api/gpus.py: 7 on every MIG product we know)
_GPU_COMPUTE_SLICES = 7


def mig_fraction(resource: str) -> float:
    """Fraction of one GPU that one device of MIG resource ``resource`` takes: its compute
    slices over the GPU's 7 (``nvidia.com/mig-1g.10gb`` -> 1/7, ``mig-3g.40gb`` -> 3/7); a
    profile name without an ``<N>g.`` prefix counts as one slice."""
    profile = resource.removeprefix(MIG_RESOURCE_PREFIX)
    head = profile.split("g.", 1)[0]
    slices = int(head) if head.isdigit() else 1
    return min(slices, _GPU_COMPUTE_SLICES) / _GPU_COMPUTE_SLICES


def gpu_size_of(request: PlacementRequest) -> float:
    """GPUs the job requests, all pods together, counting MIG devices
    (``nvidia.com/mig-<profile>``) as their fraction of a GPU (:func:`mig_fraction`); 0.0 for
    a CPU-only job. The size that ``smallest-first`` sorts by."""
    total = 0.0
    for ps in request.pod_sets:
        for res, n in ps.requests.items():
            if res == GPU_RESOURCE:
                total += ps.count * n
            elif res.startswith(MIG_RESOURCE_PREFIX):
                total += ps.count * n * mig_fraction(res)
    return total


def pass_key(
    now: float, rule: BackfillRule | None = None
) -> Callable[[PlacementRequest], tuple[int, int, float, float, str, str]]:
    """Sort key of a pass at ``now`` (seconds, the clock of ``submitted_at``; module docstring):
    (-priority, 0 if it has waited ``rule.oldest_first_s`` else 1, its GPU size
    (:func:`gpu_size_of`, MIG devices as fractions of a GPU) if it has not and the order is
    ``smallest-first`` else 0, submit time, job name, UID). With ``order="fifo"`` it sorts as
    :func:`order_key`."""
    rule = rule or BackfillRule()
    limit = rule.oldest_first_s
    by_size = rule.order == "smallest-first"

    aging = rule.size_aging_s
    per_job = rule.oldest_first_one_pod_s is not None

    def key(r: PlacementRequest) -> tuple[int, int, float, float, str, str]:
        waited = now - r.submitted_at
        fresh = by_size and waited < (rule.oldest_first_for(r) if per_job else limit)
        size = gpu_size_of(r) if fresh else 0.0
        if fresh and aging > 0 and waited > 0:
            size /= 1.0 + waited / aging
        return (-r.priority, int(fresh), size, r.submitted_at, r.job, r.uid)

    return key


def fit_key(request: PlacementRequest) -> Any:
    """Everything about a request that ``place()`` reads, except its identity and order."""
    sel = request.cluster_selector
    return (
        request.gpu_products,
        None if sel is None else (tuple(sorted(sel.match_labels.items())), sel.match_expressions),
        request.topology,
        request.workload_kind,
        tuple(
            (
                ps.count,
                tuple(sorted(ps.requests.items())),
                tuple(sorted(ps.node_selector.items())),
                ps.tolerations,
            )
            for ps in request.pod_sets
        ),
    )


def queued_fit_key(request: PlacementRequest) -> Any:
    """:func:`fit_key` plus the job's queue: the ``key_of`` of a pass that admits by quota
    (a failure for lack of quota in one queue says nothing about another queue)."""
    return (request.queue, fit_key(request))


@dataclass
class PassResult:
    """What one pass decided: every attempted job's decision, and the members held."""

    decisions: list[tuple[PlacementRequest, Decision]] = field(default_factory=list)
    holds: dict[str, Hold] = field(default_factory=dict)
    #: job UID -> the hold it ran inside as backfill (placed on nodes of a borrowed hold)
    backfilled: dict[str, Hold] = field(default_factory=dict)
    #: every hold the pass took, with its holder, in the order taken (the next pass's ``carry``)
    taken: list[tuple[PlacementRequest, Hold]] = field(default_factory=list)

    @property
    def placed(self) -> list[tuple[PlacementRequest, Decision]]:
        """The decisions that placed their job."""
        return [(r, d) for r, d in self.decisions if d.outcome == Outcome.PLACED]


def schedule_pass(
    queue: Iterable[PlacementRequest],
    now: float,
    attempt: Callable[[PlacementRequest, Mapping[str, Hold]], Decision],
    hold_for: Callable[[PlacementRequest], Hold | None],
    rule: BackfillRule | None = None,
    *,
    presorted: bool = False,
    record_skipped: bool = True,
    key_of: Callable[[PlacementRequest], Any] = fit_key,
    hold_start: Callable[[PlacementRequest, Hold], float | None] | None = None,
    hold_avoiding: Callable[[PlacementRequest, Mapping[str, Hold]], Hold | None] | None = None,
    carry: Sequence[tuple[PlacementRequest, Hold]] = (),
    spare: Callable[[PlacementRequest], Mapping[str, Hold]] | None = None,
    hold_rank: Callable[[PlacementRequest, Hold], float | None] | None = None,
) -> PassResult:
    """Walk ``queue`` in order, placing what fits and applying the backfill rule.

    ``attempt(request, holds)`` places one job keeping off the held nodes (member ->
    :class:`Hold`) and reserves on success. ``hold_for(request)`` names the nodes a starving
    job should hold (or None). ``now``: the same clock as ``submitted_at``. ``presorted``:
    ``queue`` is already in :func:`pass_key` order for ``now`` and ``rule`` (or a fair-share
    order built on it); else it is sorted so. ``record_skipped``: also return a decision (a
    copy of the earlier failure) for jobs answered without calling ``attempt``; the simulator
    turns it off. ``key_of``: :func:`fit_key`, or a cached equivalent. ``hold_start(holder,
    hold)``: when the holder is expected to start on the hold's nodes (None: unknown); with it,
    a job whose ``time_limit_s`` ends by a hold's start may be placed on that hold's nodes
    (backfill, :mod:`.backfill`; its decision's message names the hold; ``PassResult.backfilled``);
    without it, with ``rule.backfill_by_limit`` off, or for a job without a limit, holds bind
    as before. ``hold_avoiding(request,
    holds)``: ``hold_for`` that does not name nodes of the pass's ``holds`` so far
    (:func:`gpufed.placement.hold_for` with ``avoid``); with it, up to
    ``rule.holds_per_shape`` starving jobs of one shape hold nodes in one pass. ``carry``: the
    previous pass's ``PassResult.taken``; with ``rule.carry_holds`` those of holders still in
    ``queue`` bind the jobs walked before their holder (``BackfillRule.carry_holds``).
    ``spare(request)``: the whole free nodes the job would break, as holds (member -> nodes;
    :func:`gpufed.placement.holds.whole_free_nodes`); with ``rule.spare_whole_nodes_s`` a job
    that has waited less than that is first tried off them and, if that fails, once more after the walk (in pass order, its
    failure then the one reported and the one that may take a hold). Holds taken in the pass
    by older jobs (of its priority) bind it then, as every hold binds younger jobs.
    ``hold_rank(holder, hold)``: with ``rule.hold_choice`` ``least-idle``, what candidate holds
    are ranked by (:func:`gpufed.placement.backfill.idle_until_start`; least first).
    """
    rule = rule or BackfillRule()
    out = PassResult()
    failed: dict[Any, tuple[Any, Decision]] = {}
    # jobs of one shape would all name the same nodes: ask once per shape, or up to
    # holds_per_shape times when the caller can name other nodes (hold_avoiding)
    per_shape = rule.holds_per_shape if hold_avoiding is not None else 1
    lend = hold_start is not None and rule.backfill_by_limit  # holds may lend (backfill)
    asked: dict[Any, int] = {}
    # every hold of the pass in the order it was taken: (holder priority, holder submit, hold)
    holders: list[tuple[int, float, Hold]] = []
    capped = 0  # holds taken by jobs that had not waited oldest_first_s (the ones max_holds caps)
    walk = list(queue) if presorted else sorted(queue, key=pass_key(now, rule))
    # the previous pass's holds, by holder not yet walked (BackfillRule.carry_holds)
    carried = _carried(walk, carry, now, hold_start if lend else None) if rule.carry_holds else {}
    deferred: list[PlacementRequest] = []  # jobs that found no room off whole free nodes
    stage = {"spare": rule.spare_whole_nodes_s > 0 and spare is not None}
    spare_until = min(rule.spare_whole_nodes_s, rule.oldest_first_s)  # a job's wait, seconds

    def visit(req: PlacementRequest) -> None:
        key = key_of(req)
        seen, holds = _holds_binding(req, holders, out.holds)
        if carried:
            carried.pop(req.uid, None)  # its own hold: it is walked now and holds afresh
            seen, holds = _carried_binding(req, seen, holds, carried)
        borrowed: list[Hold] = []
        if lend and req.time_limit_s is not None and holds:
            seen, holds, borrowed = borrowable(req, now, seen, holds)
        keep = (
            spare(req)
            if stage["spare"] and spare is not None and now - req.submitted_at < spare_until
            else None
        )
        if keep:  # first only on partly used nodes: whole free ones wait for bigger jobs
            trial = dict(holds)
            for cluster, h in keep.items():
                prior = trial.get(cluster)
                trial[cluster] = prior.merged(h) if prior else h
            prev = failed.get(("spare", key))
            if prev is not None and prev[0] == seen:
                deferred.append(req)
                return
            d = attempt(req, trial)
            if d.outcome == Outcome.UNSCHEDULABLE:
                failed[("spare", key)] = (seen, d)
                deferred.append(req)
                return
        else:
            prev = failed.get(key)
            if prev is not None and prev[0] == seen:
                if not record_skipped:
                    d = prev[1]
                else:
                    d = prev[1].model_copy(
                        update={"job": req.job, "uid": req.uid, "decided_at": now}
                    )
                    out.decisions.append((req, d))
                _hold(req, d, key)
                return
            d = attempt(req, holds)
            if d.outcome == Outcome.UNSCHEDULABLE:
                failed[key] = (seen, d)
        if borrowed and d.outcome == Outcome.PLACED:
            inside = ran_inside(d, borrowed)
            if inside is not None:
                out.backfilled[req.uid] = inside
                d = d.model_copy(update={"message": backfill_note(d, req, now, inside)})
        out.decisions.append((req, d))
        _hold(req, d, key)

    def _hold(req: PlacementRequest, d: Decision, key: Any) -> None:
        nonlocal capped
        waited = now - req.submitted_at
        old = waited >= rule.oldest_first_for(req)
        if (
            d.outcome == Outcome.UNSCHEDULABLE
            and asked.get(key, 0) < per_shape
            and waited >= rule.starvation_s
            and rule.max_holds > 0
            and (old or capped < rule.max_holds)
        ):
            asked[key] = asked.get(key, 0) + 1
            hold = hold_avoiding(req, out.holds) if hold_avoiding is not None else hold_for(req)
            starts = hold_start(req, hold) if hold is not None and hold_start is not None else None
            if hold is not None and hold_start is not None and hold_avoiding is not None:
                hold, starts = best_hold(
                    req,
                    hold,
                    starts,
                    out.holds,
                    rule.hold_candidates,
                    hold_avoiding,
                    hold_start,
                    hold_rank if rule.hold_choice == "least-idle" else None,
                )
            if rule.hold_within_wait and not old and starts is not None and starts - now > waited:
                hold = None  # its nodes would drain longer than it has waited: not yet
            if hold is not None:
                hold = Hold(hold.cluster, hold.nodes, _held_for(req, now), starts if lend else None)
                prior = out.holds.get(hold.cluster)
                out.holds[hold.cluster] = prior.merged(hold) if prior else hold
                holders.append((req.priority, req.submitted_at, hold))
                out.taken.append((req, hold))
                if not old:
                    capped += 1

    for req in walk:
        visit(req)
    stage["spare"] = False
    for req in deferred:  # then, in pass order, anywhere (whole free nodes the others left)
        visit(req)
    return out


def _held_for(req: PlacementRequest, now: float) -> str:
    """A backfill-rule hold's reason (what ``gpufed explain`` shows of held nodes)."""
    return (
        f"held for {req.job} (priority {req.priority}, waiting "
        f"{now - req.submitted_at:.0f} s) by the backfill rule"
    )


def _carried(
    walk: list[PlacementRequest],
    carry: Sequence[tuple[PlacementRequest, Hold]],
    now: float,
    hold_start: Callable[[PlacementRequest, Hold], float | None] | None,
) -> dict[str, tuple[int, float, Hold]]:
    """Holder UID -> (priority, submit time, hold) of the carried holds whose holders are in
    ``walk``; each hold's start re-estimated at ``now`` (None without ``hold_start``: it lends
    nothing)."""
    if not carry:
        return {}
    waiting = {r.uid for r in walk}
    out: dict[str, tuple[int, float, Hold]] = {}
    for holder, h in carry:
        if holder.uid in waiting and holder.uid not in out:
            starts = hold_start(holder, h) if hold_start is not None else None
            hold = Hold(h.cluster, h.nodes, _held_for(holder, now), starts)
            out[holder.uid] = (holder.priority, holder.submitted_at, hold)
    return out


def _carried_binding(
    req: PlacementRequest,
    seen: Any,
    holds: Mapping[str, Hold],
    carried: Mapping[str, tuple[int, float, Hold]],
) -> tuple[Any, Mapping[str, Hold]]:
    """``holds`` (token ``seen``) plus the carried holds that bind ``req``: those of a
    higher-priority holder, or of one of its priority submitted at or before it (as
    :func:`_holds_binding`: an older job is never held back by a younger one's hold)."""
    picked = sorted(
        uid
        for uid, (p, at, _) in carried.items()
        if p > req.priority or (p == req.priority and at <= req.submitted_at)
    )
    if not picked:
        return seen, holds
    out = dict(holds)
    for uid in picked:
        h = carried[uid][2]
        prior = out.get(h.cluster)
        out[h.cluster] = prior.merged(h) if prior else h
    return (seen, tuple(picked)), out


def _holds_binding(
    req: PlacementRequest, holders: list[tuple[int, float, Hold]], merged: dict[str, Hold]
) -> tuple[Any, Mapping[str, Hold]]:
    """The holds of the pass so far that bind ``req``, and a token naming them (equal tokens:
    equal holds, so a failure cached under one token answers a job that sees the same).

    A hold binds every job after its holder in the order except a job of the same priority
    submitted *before* the holder: a younger job's hold never keeps an older one of its
    priority off the nodes (under ``smallest-first`` a small or CPU-only job is walked ahead
    of older bigger ones; its hold must not freeze them)."""
    if all(p != req.priority or at <= req.submitted_at for p, at, _ in holders):
        return len(holders), merged
    picked = tuple(
        i for i, (p, at, _) in enumerate(holders) if p != req.priority or at <= req.submitted_at
    )
    out: dict[str, Hold] = {}
    for i in picked:
        h = holders[i][2]
        prior = out.get(h.cluster)
        out[h.cluster] = prior.merged(h) if prior else h
    return (len(holders), picked), out
