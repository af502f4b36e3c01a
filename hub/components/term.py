"""One leader term: what every component of it shares — configuration, the two ports, the
term's state, metrics, clocks — and its background tasks, with the one rule for what ends it.

:class:`Term` is built once by :class:`gpufed.hub.components.core.Controller` and handed to each
component's constructor together with the peers that component calls (the arrows of
docs/design.md §9). Every component of a :class:`gpufed.hub.components.core.Controller` starts its loops and its off-path
work (an ack to persist, an Event to emit) through :meth:`TermTasks.spawn`; a task that fails
ends the term, never silently: another leader in etcd (:class:`NotLeaderError`), etcd gone
past the store's retry budget (:class:`StoreUnavailableError`) or a bug of ours stop the
controller with the reason, and :mod:`gpufed.hub.edge.app` campaigns again.

**The term's state** (:class:`HubState`): job, work and member state, and the queries over
them. Every component of the term reads and changes it (intake adds jobs, scheduling places
them, dispatch tracks work items, members track inventories and streams). It holds no I/O:
what is durable is written by the component that owns the change (etcd through
:mod:`gpufed.hub.adapters.store`, the hub API through :mod:`gpufed.hub.components.mirror`).
Concurrency: one asyncio loop; every read-modify-write of one job runs under that job's lock
(:meth:`HubState.lock`, kopf's "one serial worker per object"), many jobs in parallel.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple

import structlog

from gpufed.api.gpujob import TERMINAL_PHASES, GPUJob, GPUJobStatus, StatusCondition
from gpufed.api.inventory import NodeInventory
from gpufed.api.membercluster import MemberClusterSpec
from gpufed.api.request import PlacementRequest
from gpufed.api.stream import HeldJob
from gpufed.api.work import FailureCause, PodSecurityLevel, WorkItem
from gpufed.hub.adapters.ports import HubAPI, StateStore
from gpufed.hub.adapters.sessions import AgentSession
from gpufed.hub.adapters.store import NotLeaderError, StoreUnavailableError
from gpufed.hub.components.config import HubConfig
from gpufed.hub.components.metrics import HubMetrics
from gpufed.hub.rules import status as st
from gpufed.hub.rules.admission import PriorityClasses, PrioritySource
from gpufed.hub.rules.health import MemberHealth
from gpufed.hub.rules.records import AckRecord, JobRecord, MemberMeta, WorkRecord

log = structlog.get_logger("gpufed.hub.components.core")

#: The :class:`JobState` attributes whose change may change what the job charges its queue or
#: how it runs as a possible victim: assigning any of them marks the job touched
#: (:meth:`HubState.touch`). Everything they hold is immutable (frozen records, models that are
#: replaced, never changed in place), so an assignment is the only way they change.
FOLLOWED: Final = frozenset({"record", "status", "request", "obj", "claim"})


class Claim(NamedTuple):
    """A placement to adopt: ``cluster``, the ``attempt`` it was, and where that came from
    (``status``: the GPUJob status; ``agent``: the agent that holds the job)."""

    cluster: str
    attempt: int
    source: str


def claim_of(
    record: JobRecord | None, status: GPUJobStatus, held_on: Collection[str]
) -> Claim | None:
    """The rule of :mod:`gpufed.hub.components.rebuild` (docs/design.md §7 item 7): which
    placement a GPUJob holds when etcd's record is missing or older, checked at intake.
    ``held_on``: members whose agent reports holding the job.

    - a status that names a member wins over no record, and over a record of a lower attempt
      (a restore from an old backup); on an equal or higher record attempt the record wins
      (it is the durable commit, written before the status);
    - with no record and no member in the status, exactly one agent holding the job wins;
    - otherwise nothing is adopted (the job is placed as usual, or the record stands).
    """
    if status.cluster is not None:
        attempt = status.attempt or 1
        if record is None:
            return Claim(status.cluster, attempt, "status")
        if record.cluster != status.cluster and attempt > record.attempt:
            return Claim(status.cluster, attempt, "status")
        return None
    if record is None and len(held_on) == 1:
        return Claim(next(iter(held_on)), 1, "agent")
    return None


@dataclass
class JobState:
    """What the leader knows about one GPUJob (keyed by UID).

    ``request``: its placement request (None when invalid: ``error`` and ``error_field`` say
    why); ``record``/``record_rev``: its etcd job record and that key's revision (None: never
    placed); ``seen_mono``/``decided_mono``: monotonic seconds of intake and of the latest
    placement (for the latency metrics); ``last_unschedulable``: the last "not placed" answer
    written, so an unchanged one is not written again; ``last_warning``: the reason of the last
    Warning Event about not being placed (``Unschedulable``, ``Rejected``; None once placed), so
    a job that keeps waiting gets one Event per reason change, not one per new message;
    ``pod_security``: the Pod Security level
    of its hub namespace seen at intake (sent with its work, so the agent labels a member
    namespace it creates alike); ``priority``: where its priority comes from (its
    PriorityClass, resolved each cycle while it waits: :mod:`gpufed.hub.rules.admission`).
    """

    uid: str
    obj: GPUJob
    status: GPUJobStatus
    seen_mono: float
    request: PlacementRequest | None = None
    error: str | None = None
    error_field: str | None = None
    record: JobRecord | None = None
    record_rev: int | None = None
    decided_mono: float | None = None
    last_unschedulable: Any = None
    last_warning: str | None = None
    pod_security: PodSecurityLevel | Literal[""] = ""
    priority: PrioritySource = field(default_factory=PrioritySource)
    #: a placement to adopt from what survived a loss of etcd state (:func:`claim_of`, adopted
    #: by gpufed.hub.components.rebuild); while set the job is never placed
    claim: Claim | None = None
    #: an infrastructure failure of the current copy not acted on yet: (member, cause), recorded
    #: by reports and acted on by the lifecycle (gpufed.hub.rules.lifecycle, rule 5)
    failure: tuple[str, FailureCause] | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        # A job in a HubState's table (``_touch`` set by :class:`JobTable`) reports every
        # change of a :data:`FOLLOWED` attribute, whichever path makes it.
        object.__setattr__(self, name, value)
        if name in FOLLOWED:
            touch = self.__dict__.get("_touch")
            if touch is not None:
                touch(self.uid)

    @property
    def key(self) -> str:
        return self.obj.key

    @property
    def deleting(self) -> bool:
        return self.obj.metadata.deletion_timestamp is not None

    @property
    def terminal(self) -> bool:
        return self.status.phase in TERMINAL_PHASES  # st.is_terminal, read without a call

    @property
    def placed_cluster(self) -> str | None:
        return self.record.cluster if self.record is not None else None

    @property
    def started_at(self) -> float | None:
        """Wall seconds the member started its workload (``status.startTime``); None when it
        has not or the value does not parse."""
        if not self.status.start_time:
            return None
        try:
            return st.parse_rfc3339(self.status.start_time)
        except ValueError:
            return None

    @property
    def time_limit_at(self) -> float | None:
        """Wall seconds when the running copy reaches ``spec.placement.timeLimitSeconds``
        (from the workload's start in the member); None without a limit or a start."""
        limit = self.obj.spec.placement.time_limit_seconds
        start = self.started_at
        if limit is None or start is None or self.status.phase != "Running":
            return None
        return start + limit

    def backing_off(self, now: float) -> bool:
        """Waiting out the backoff before a re-run at wall seconds ``now``
        (``record.not_before``)."""
        nb = self.record.not_before if self.record is not None else None
        return nb is not None and now < nb

    @property
    def wants_placement(self) -> bool:
        """Valid, not finished, not being deleted, and placed nowhere now."""
        return (
            self.request is not None
            and not self.terminal
            and not self.deleting
            and self.claim is None
            and (self.record is None or self.record.cluster is None)
        )


@dataclass
class WorkState:
    """One work item in the outbox, with the member's latest ack.

    ``revision``: the etcd revision of the work record (the work item's revision);
    ``sent_at``: monotonic seconds of the last send (None: not in flight); ``retry_at``: when a
    retryable failure may be sent again; ``failures``: retryable failures of this revision in
    a row (kept in memory only: a new leader starts counting again).
    """

    cluster: str
    record: WorkRecord
    revision: int
    ack: AckRecord | None = None
    sent_at: float | None = None
    retry_at: float | None = None
    failures: int = 0

    @property
    def applied_before(self) -> bool:
        return self.ack is not None and self.ack.applied

    def item(self) -> WorkItem:
        """The protocol work item this entry sends: its record at ``revision``."""
        rec = self.record
        return WorkItem(
            job_uid=rec.job_uid,
            job=rec.job,
            revision=self.revision,
            op=rec.op,
            namespace=rec.namespace,
            manifests=rec.manifests if rec.op == "Apply" else (),
            applied_before=self.applied_before,
            pod_security=rec.pod_security,
        )

    @property
    def settled(self) -> bool:
        """The member acknowledged this revision (Applied for Apply, Deleted for Delete)."""
        if self.ack is None or self.ack.revision < self.revision:
            return False
        want = "Applied" if self.record.op == "Apply" else "Deleted"
        return self.ack.result == want


@dataclass
class MemberState:
    """What the leader knows about one member cluster.

    ``spec`` is None until its MemberCluster is seen (and again after it is deleted);
    ``nodes``: the last good inventory; ``session``: its open agent stream, if any;
    ``last_heard``/``last_heard_wall``: monotonic and wall seconds of its agent's last
    message; ``outbox``/``queued``: job uids waiting to be sent to it, in order;
    ``dirty_nodes``/``removed_nodes``: inventory changes not yet written to etcd.
    """

    name: str
    spec: MemberClusterSpec | None = None
    #: the MemberCluster's metadata.uid ("" until seen; the Events about it name it)
    uid: str = ""
    meta: MemberMeta = field(default_factory=MemberMeta)
    nodes: dict[str, NodeInventory] = field(default_factory=dict)
    session: AgentSession | None = None
    last_heard: float | None = None
    last_heard_wall: float | None = None
    #: conditions of the MemberCluster as last read (keeps transition times across restarts)
    conditions_seen: list[StatusCondition] = field(default_factory=list)
    #: the lastHeartbeatTime written into the MemberCluster status (advances in steps)
    heartbeat_shown: float | None = None
    health: MemberHealth = "Ready"
    outbox: collections.deque[str] = field(default_factory=collections.deque)
    queued: set[str] = field(default_factory=set)
    dirty_nodes: set[str] = field(default_factory=set)
    removed_nodes: set[str] = field(default_factory=set)
    #: serialises node writes, so a settle waits for a flush already in flight
    nodes_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: serialises snapshot applications (each takes many turns of the event loop)
    snapshot_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    meta_dirty: bool = False
    #: what the agent's last heartbeat said about its member's API server ("": reachable)
    member_api_error: str = ""
    #: job uid -> what the agent's latest Hello said it holds (at most MAX_HELD_JOBS)
    held: dict[str, HeldJob] = field(default_factory=dict)

    @property
    def lost(self) -> bool:
        return self.meta.lost_at is not None


class JobTable(dict[str, JobState]):
    """``HubState.jobs``: job UID -> :class:`JobState`, a dict that marks a job touched when
    it enters or leaves the table, and hands each job it holds the mark, so every later change
    of the job's :data:`FOLLOWED` attributes marks it too (``touch(uid)``). Reads are a plain
    dict's."""

    def __init__(self, touch: Callable[[str], None]) -> None:
        super().__init__()
        self._touch = touch

    def __setitem__(self, uid: str, job: JobState) -> None:
        object.__setattr__(job, "_touch", self._touch)
        super().__setitem__(uid, job)
        self._touch(uid)

    def __delitem__(self, uid: str) -> None:
        super().__delitem__(uid)
        self._touch(uid)

    def pop(self, uid: str, *default: Any) -> Any:
        job = super().pop(uid, *default)
        self._touch(uid)
        return job

    def _refused(self, *_: Any, **__: Any) -> Any:
        raise TypeError("HubState.jobs changes one job at a time ([uid] = job, pop, del)")

    # the bulk changes would bypass the marks
    clear = popitem = setdefault = update = __ior__ = _refused


class HubState:
    """Jobs by UID, work items by (cluster, job UID), members by name, per-job locks, and where
    the term's components meet: the jobs that want placement (:meth:`want`, read by the
    scheduler), the scheduler's wake-up (:meth:`kick`), whether the term's first GPUJob list
    is in (``jobs_listed``), and the hub cluster's PriorityClasses (``priorities``: intake
    feeds them, each scheduling cycle resolves the waiting jobs' priorities from them)."""

    def __init__(self) -> None:
        #: the sets :meth:`touch` adds to (one per follower, :meth:`follow`)
        self._followers: list[set[str]] = []
        #: the sets :meth:`nodes_changed` adds to (one per follower, :meth:`follow_nodes`)
        self._node_followers: list[set[tuple[str, str]]] = []
        #: jobs whose placement or record may have changed since the queues' usage last read
        #: them (the incremental charges, gpufed.hub.components.usage, read and clear it)
        self.touched: set[str] = self.follow()
        self.jobs: dict[str, JobState] = JobTable(self.touch)
        #: the jobs whose record is being stopped now (kept by :meth:`touch`)
        self._stopping: dict[str, JobState] = {}
        self.work: dict[tuple[str, str], WorkState] = {}
        self.members: dict[str, MemberState] = {}
        self._locks: dict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        #: jobs that may want placement (the scheduler checks each again in its next cycle)
        self.wanted: set[str] = set()
        #: set to ask for a scheduling cycle soon (the scheduler clears it)
        self.cycle_due = asyncio.Event()
        #: set once this term's first GPUJob list is in (intake sets it)
        self.jobs_listed = asyncio.Event()
        #: the hub cluster's PriorityClasses (a cache of what intake lists and watches)
        self.priorities = PriorityClasses()

    def follow(self) -> set[str]:
        """A new set that every later :meth:`touch` adds to: the follower reads the jobs in it
        and clears it (or takes out what it read)."""
        out: set[str] = set()
        self._followers.append(out)
        return out

    def follow_nodes(self) -> set[tuple[str, str]]:
        """A new set that every later :meth:`nodes_changed` adds (member, node name) to: the
        follower reads the nodes in it and takes out what it read."""
        out: set[tuple[str, str]] = set()
        self._node_followers.append(out)
        return out

    def nodes_changed(self, member: str, names: Iterable[str]) -> None:
        """Nodes ``names`` of ``member`` were set or removed in place in its
        ``MemberState.nodes`` (an inventory delta). A whole new ``nodes`` dict (a snapshot, a
        restore) is not marked: a follower sees the new dict object."""
        if self._node_followers:
            marks = [(member, name) for name in names]
            for s in self._node_followers:
                s.update(marks)

    def touch(self, uid: str) -> None:
        """Job ``uid`` may have changed: what it charges, whether and how it runs. Called for
        every job entering or leaving :attr:`jobs` and every change of a :data:`FOLLOWED`
        attribute of a job in it (:class:`JobTable`), and by the dispatch for every work item
        it queues (an ack's start time)."""
        for s in self._followers:
            s.add(uid)
        j = self.jobs.get(uid)
        if j is not None and j.record is not None and j.record.stopping is not None:
            self._stopping[uid] = j
        else:
            self._stopping.pop(uid, None)

    def kick(self) -> None:
        """Ask for a scheduling cycle soon (something changed that may let a job fit)."""
        self.cycle_due.set()

    def want(self, uid: str) -> None:
        """Job ``uid`` may want placement: the next scheduling cycle considers it (and comes
        soon)."""
        self.wanted.add(uid)
        self.cycle_due.set()

    def stopping(self) -> list[JobState]:
        """The jobs whose copy is being stopped for a requeue now (by UID). O(stopping jobs):
        kept by :meth:`touch` (every change of a job's record marks it)."""
        return [self._stopping[uid] for uid in sorted(self._stopping)]

    def stopping_for(self) -> set[str]:
        """The preemptors whose victims are still being stopped (UIDs): their holds last
        whatever their TTL, and none of them plans again meanwhile. O(stopping jobs)."""
        return {
            r.stopping.by_uid
            for j in self._stopping.values()
            if (r := j.record) is not None and r.stopping is not None and r.stopping.by_uid
        }

    def lock(self, uid: str) -> asyncio.Lock:
        """The lock that serialises every read-modify-write of job ``uid``."""
        return self._locks[uid]

    def member(self, name: str) -> MemberState:
        """The state of member ``name``, created empty the first time it is named."""
        m = self.members.get(name)
        if m is None:
            m = self.members[name] = MemberState(name)
        return m

    def work_of(self, cluster: str) -> list[WorkState]:
        """The work items of one member, oldest revision first."""
        return sorted(
            (ws for (c, _), ws in self.work.items() if c == cluster), key=lambda w: w.revision
        )

    def work_elsewhere(self, uid: str, cluster: str) -> str | None:
        """The member other than ``cluster`` that job ``uid`` is assigned to, if any."""
        for c, u in self.work:
            if u == uid and c != cluster:
                return c
        job = self.jobs.get(uid)
        if job is not None and job.placed_cluster not in (None, cluster):
            return job.placed_cluster
        return None

    def held_on(self, uid: str) -> list[str]:
        """Members whose agent's latest Hello listed job ``uid`` as held."""
        return sorted(m.name for m in self.members.values() if uid in m.held)

    def registered_members(self) -> list[MemberState]:
        """Members whose MemberCluster exists on the hub."""
        return [m for m in self.members.values() if m.spec is not None]

    def fleet_complete(self) -> bool:
        """Every member the hub knows has reported an inventory (a Rejected is then final)."""
        known = self.registered_members()
        return bool(known) and all(m.nodes for m in known)

    def awaiting_inventory(self) -> list[str]:
        """Names of registered members that have not reported an inventory yet."""
        return sorted(m.name for m in self.registered_members() if not m.nodes)


class TermTasks:
    """Spawns tasks whose failure calls ``stop(reason)``; :meth:`cancel_all` at term end."""

    def __init__(self, stop: Callable[[str], None]) -> None:
        self._stop = stop
        self._bg: set[asyncio.Task[Any]] = set()

    async def supervise(self, coro: Awaitable[Any]) -> None:
        """Await ``coro``; translate what ends the term into ``stop(reason)``."""
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except NotLeaderError as exc:
            self._stop(str(exc))
        except StoreUnavailableError as exc:
            log.warning("hub.etcd.unavailable", error=str(exc))
            self._stop(f"etcd unavailable: {exc}")
        except Exception as exc:
            log.exception("hub.controller.crashed", error=str(exc))
            self._stop(f"internal error: {exc}")

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run ``coro`` in the background under :meth:`supervise`. A coroutine whose task is
        cancelled before it first ran (the term ended at once) is closed, not left for the
        garbage collector to warn about ("coroutine ... was never awaited")."""
        task = asyncio.ensure_future(self.supervise(coro))
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)
        if inspect.iscoroutine(coro):
            task.add_done_callback(lambda _: coro.close())  # a no-op once it ran

    def cancel_all(self) -> None:
        """Cancel every background task still running (the term ended)."""
        for t in list(self._bg):
            t.cancel()


def always_leading() -> bool:
    """The lease of a hub that runs without an election (tests, a single replica)."""
    return True


@dataclass(frozen=True)
class Term:
    """The shared context of one leader term.

    ``store``/``kube``: the two ports (:mod:`gpufed.hub.adapters.ports`); ``mono``/``wall``: the
    monotonic and wall clocks (seconds) every timer and status time reads; ``started``:
    ``mono()`` when the term began (member timers count from it); ``tasks``: where background
    work runs (:meth:`spawn`); ``lease``: True while the leader lease is known to be held;
    ``stopped``: set once the term ends (together: :meth:`leading`).
    """

    config: HubConfig
    store: StateStore
    kube: HubAPI
    metrics: HubMetrics
    state: HubState
    tasks: TermTasks
    mono: Callable[[], float]
    wall: Callable[[], float]
    started: float
    lease: Callable[[], bool]
    stopped: asyncio.Event

    def leading(self) -> bool:
        """True while this term may write to the hub API: not stopped, and the leader lease
        known to be held (:meth:`gpufed.hub.edge.leader.LeaderElector.holds`). Cheap."""
        return not self.stopped.is_set() and self.lease()

    def check_fence(self) -> None:
        """Right before a write to the hub API: raise :class:`NotLeaderError` unless this term
        still leads (the controller runs and the leader lease is known to be held: see
        :meth:`gpufed.hub.edge.leader.LeaderElector.holds`). Cheap: no request."""
        if not self.leading():
            raise NotLeaderError("not the leader any more: hub API writes are fenced")

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run ``coro`` in the background; its failure ends the term."""
        self.tasks.spawn(coro)

    async def persist_meta(self, m: MemberState) -> None:
        """Write member ``m``'s latest meta record to etcd now (clearing ``meta_dirty``; set
        again when the write fails, so the flush loop tries again)."""
        m.meta_dirty = False
        try:
            await self.store.put_member_meta(m.name, m.meta)  # the latest meta, not a copy
        except BaseException:
            m.meta_dirty = True
            raise
