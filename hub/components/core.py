"""One leader term: the Controller wires the hub's components, runs their loops, routes what
agents send, and ends when leadership must end.

One :class:`Controller` exists while this replica leads (:mod:`gpufed.hub.edge.app` creates it after
winning the election and drops it when leadership is lost). It starts from etcd
(:meth:`Controller.load`) and the hub API server (list+watch), so a restart or a failover
resumes where the previous leader stopped and creates nothing twice (docs/design.md §7 item 4).

The components, each in its own module (docs/design.md §9 walks a job through them):

==========================  ==================================================================
:mod:`~gpufed.hub.components.intake`   list+watch of GPUJobs, MemberClusters, Namespaces, GPUQueues; admission
:mod:`~gpufed.hub.components.lifecycle` a job's next step: one level-triggered reconcile (deletion, requeue, re-runs, lost members, orphans)
:mod:`~gpufed.hub.components.queues`   GPUQueues: the queue tree, the quota-usage ledger, fair share, queue status
:mod:`~gpufed.hub.components.scheduling`  the scheduling cycle and the placement commit (one etcd txn)
:mod:`~gpufed.hub.components.reservations`  the one owner of reservations
:mod:`~gpufed.hub.components.dispatch` the per-member work outbox, resends, desired set on (re)connect
:mod:`~gpufed.hub.components.reports`  acks and workload status from members
:mod:`~gpufed.hub.components.finalizers` the hub's finalizer on GPUJobs
:mod:`~gpufed.hub.components.members`  member registry, inventory, health, lost members
:mod:`~gpufed.hub.components.tokens`   join tokens (watched Secrets), the agents' credential check
:mod:`~gpufed.hub.components.mirror`   GPUJob / MemberCluster / GPUQueue status writes and Events
:mod:`~gpufed.hub.components.managed`  plain Jobs/JobSets with managedBy gpufed.io/hub: their GPUJobs and status
:mod:`~gpufed.hub.components.term`     the term they share: its state (jobs, work, members), tasks, clocks
==========================  ==================================================================

Concurrency: one asyncio loop; every read-modify-write of one job runs under that job's lock,
many jobs in parallel. A background task that finds another leader in etcd, loses etcd or
hits a bug ends this controller (:class:`gpufed.hub.components.term.TermTasks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable

import structlog

from gpufed.api.labels import GPU_RESOURCE
from gpufed.api.stream import (
    AgentEvent,
    AgentHello,
    Heartbeat,
    InventoryDelta,
    InventorySnapshot,
    ResyncRequest,
)
from gpufed.api.work import WorkAck, WorkloadStatus
from gpufed.hub.adapters.ports import HubAPI, StateStore
from gpufed.hub.adapters.sessions import AgentSession, StreamClosedError
from gpufed.hub.components.config import HubConfig
from gpufed.hub.components.dispatch import Dispatch
from gpufed.hub.components.finalizers import Finalizers
from gpufed.hub.components.intake import (
    GPUJOBS,
    GPUQUEUES,
    MEMBERCLUSTERS,
    NAMESPACES,
    PRIORITYCLASSES,
    Intake,
)
from gpufed.hub.components.lifecycle import Lifecycle
from gpufed.hub.components.managed import ManagedWorkloads
from gpufed.hub.components.members import Members
from gpufed.hub.components.metrics import HubMetrics
from gpufed.hub.components.mirror import Mirror
from gpufed.hub.components.queues import Queues
from gpufed.hub.components.rebuild import Rebuild
from gpufed.hub.components.reports import Reports
from gpufed.hub.components.reservations import Reservations, SuspectNodes
from gpufed.hub.components.scheduling import Scheduler
from gpufed.hub.components.term import HubState, Term, TermTasks, WorkState, always_leading
from gpufed.hub.components.tokens import Credentials, JoinTokens
from gpufed.hub.rules.records import (
    MAX_RECENT_NODE_RECORDS,
    Loaded,
    RecentNodeRecord,
    RecentNodesRecord,
)
from gpufed.placement import FleetSnapshot
from gpufed.placement.recent import RecentNodes

log = structlog.get_logger("gpufed.hub.components.core")

_TICK_S = 0.5


class Controller:
    """One leader term (see the module docstring).

    ``store``/``kube``: the term's two ports (:mod:`gpufed.hub.adapters.ports`); ``mono``/``wall``: the
    monotonic and wall clocks every timer and status time reads (tests pass fake ones);
    ``leading``: True while the leader lease is known to be held
    (:meth:`gpufed.hub.edge.leader.LeaderElector.holds`); with the controller not stopped, it
    fences every hub API write of the term (:meth:`gpufed.hub.components.term.Term.check_fence`).
    """

    def __init__(
        self,
        config: HubConfig,
        store: StateStore,
        kube: HubAPI,
        metrics: HubMetrics,
        *,
        mono: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        leading: Callable[[], bool] = always_leading,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self._mono = mono
        self._wall = wall
        self.started = mono()
        self._stopped = asyncio.Event()
        self.stop_reason = ""
        self.state = HubState()
        self.snapshot = FleetSnapshot()
        # nodes that left or shrank within the hour: "could ever hold" counts them too (saved
        # in etcd, so a new leader knows them: wall clock)
        self.snapshot.recent = RecentNodes(wall)
        self._recent_saved = 0
        term = Term(
            config=config,
            store=store,
            kube=kube,
            metrics=metrics,
            state=self.state,
            tasks=TermTasks(self.stop),
            mono=mono,
            wall=wall,
            started=self.started,
            lease=leading,
            stopped=self._stopped,
        )
        self._term = term
        # Built in dependency order (docs/design.md §9): each takes the peers it calls; they
        # also meet through the term's state (HubState: wanted jobs, kicks, the first list).
        self.mirror = Mirror(term)
        self.tokens = JoinTokens(term)
        self.reservations = Reservations(term, self.snapshot)
        self.dispatch = Dispatch(term)
        self.finalizers = Finalizers(term)
        self.suspects = SuspectNodes(term.config.suspect_node_cooldown_s)
        self.lifecycle = Lifecycle(
            term, self.dispatch, self.reservations, self.mirror, self.finalizers, self.suspects
        )
        self.queues = Queues(term, self.mirror, self.lifecycle)
        self.scheduler = Scheduler(
            term,
            self.snapshot,
            self.reservations,
            self.dispatch,
            self.mirror,
            self.queues,
            self.lifecycle,
        )
        self.members = Members(
            term,
            self.snapshot,
            self.reservations,
            self.dispatch,
            self.lifecycle,
            self.mirror,
            self.tokens,
        )
        self.reports = Reports(term, self.dispatch, self.mirror, self.lifecycle)
        self.rebuild = Rebuild(term, self.scheduler, self.dispatch, self.mirror)
        self.intake = Intake(
            term,
            self.members,
            self.lifecycle,
            self.mirror,
            self.rebuild,
            self.queues,
        )
        self.managed = ManagedWorkloads(term)
        #: the hub state epoch (set by :meth:`load`; "" until then)
        self.epoch = ""

    # --- the term ------------------------------------------------------------------------------------

    async def load(self) -> None:
        """Read the previous leader's state from etcd; restart every timer from now."""
        loaded = await self._term.store.load()
        self.restore(loaded)
        self.epoch = loaded.epoch or await self._term.store.ensure_epoch(uuid.uuid4().hex)
        log.info(
            "hub.state.loaded",
            epoch=self.epoch,
            new_epoch=loaded.epoch is None,
            jobs=len(loaded.jobs),
            work=len(loaded.work),
            reservations=len(loaded.reservations),
            members=len(set(loaded.members) | set(loaded.nodes)),
        )

    def restore(self, loaded: Loaded) -> None:
        """Take over what etcd holds: members, work items, job records, reservations."""
        if loaded.recent_nodes is not None and self.snapshot.recent is not None:
            # before the members' nodes: a node present again is forgotten as it joins
            self.snapshot.recent.restore(
                (r.cluster, r.node, r.left_at) for r in loaded.recent_nodes.nodes
            )
            self._recent_saved = self.snapshot.recent.version
        self.members.restore(loaded.members, loaded.nodes)
        for name, meta in loaded.members.items():
            self.suspects.restore(name, meta.suspects, mono=self._mono(), wall=self._wall())
        for (cluster, uid), (record, rev) in loaded.work.items():
            self.state.work[(cluster, uid)] = WorkState(
                cluster, record, rev, ack=loaded.acks.get((cluster, uid))
            )
        self.lifecycle.restore(loaded.jobs, loaded.job_revisions)
        self.reservations.restore(loaded.reservations, self._wall())
        self.queues.restore_history(loaded.fair_share)

    async def run(self) -> str:
        """Run until leadership must end (returns the reason) or the task is cancelled."""
        self.mirror.start()
        self.metrics.is_leader.set(1)
        self.tokens.start()
        loops = [
            self.intake.list_watch(MEMBERCLUSTERS),
            self.intake.list_watch(NAMESPACES),
            self.intake.list_watch(GPUQUEUES),
            self.intake.list_watch(PRIORITYCLASSES),
            self.intake.list_watch(GPUJOBS),
            self.scheduler.run(),
            self._tick_loop(),
            self._flush_loop(),
            self._resync_loop(),
            *self.managed.loops(),
        ]
        tasks = [asyncio.create_task(self._term.tasks.supervise(c)) for c in loops]
        try:
            await self.reservations.persist_restarted()
            await self._stopped.wait()
            return self.stop_reason
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            await self.shutdown(self.stop_reason or "hub stopping")

    async def shutdown(self, reason: str) -> None:
        """Close every agent stream and stop the writers (leadership ends)."""
        self.metrics.leadership_ended()
        for m in self.state.members.values():
            if m.session is not None:
                m.session.close(
                    "UNAVAILABLE", f"hub {self.config.hub_id} stopped leading: {reason}"
                )
        self._term.tasks.cancel_all()
        await self.mirror.stop()

    def stop(self, reason: str) -> None:
        """Ask :meth:`run` to return (e.g. a write found another leader)."""
        if not self._stopped.is_set():
            self.stop_reason = reason
            log.warning("hub.controller.stopping", reason=reason)
            self._stopped.set()

    @property
    def stopped(self) -> bool:
        """True once :meth:`stop` was called: this term accepts nothing any more."""
        return self._stopped.is_set()

    def held_gpus(self, member: str) -> dict[str, int]:
        """Per node of ``member``, the whole GPUs held for waiting preemptors now (their
        confirmed holds; the console's "held for a preemptor")."""
        out: dict[str, int] = {}
        for res in self.reservations.confirmed_holds(self.state.wanted):
            job = self.state.jobs.get(res.job_uid)
            if res.cluster != member or job is None or not job.wants_placement:
                continue
            for node, amounts in res.nodes.items():
                out[node] = out.get(node, 0) + amounts.get(GPU_RESOURCE, 0)
        return out

    @property
    def members_synced(self) -> asyncio.Event:
        """Set once the first MemberCluster list of this term is in (agents wait for it)."""
        return self.intake.members_synced

    @property
    def ready(self) -> bool:
        """Both initial lists are done (the leader's ``/readyz`` and ``/leaderz``)."""
        return self.intake.members_synced.is_set() and self.state.jobs_listed.is_set()

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(_TICK_S)
            await self.members.check_health()
            await self.lifecycle.due()
            self.dispatch.resend_due(self._mono())
            if self.suspects.expire(self._mono()):
                self.state.kick()  # nodes back in the fleet: waiting jobs may fit now

    async def _flush_loop(self) -> None:
        """Persist changed inventories and member facts; refresh member and queue status and
        metrics."""
        last_status = 0.0
        while True:
            await asyncio.sleep(min(self.config.inventory_flush_s, self.config.status_interval_s))
            await self.flush_inventories()
            now = self._mono()
            if now - last_status >= self.config.status_interval_s:
                last_status = now
                self.members.write_all_statuses()
                if self.queues.synced.is_set():
                    self.queues.refresh()
                    await self.queues.save_history()
                self.scheduler.refresh_preemption_soon()

    async def flush_inventories(self) -> None:
        """Write the nodes that left or shrank (when they changed), then the changed
        inventories: a node's departure reaches etcd only after it is remembered there, so a
        leader that dies in between leaves its successor either the node (whose departure it
        sees again when the agent reports) or the memory of it, never neither (issue 26)."""
        await self._save_recent_nodes()
        await self.members.flush()

    async def _save_recent_nodes(self) -> None:
        """Write the nodes that left or shrank within the hour when they changed (the newest
        :data:`MAX_RECENT_NODE_RECORDS`)."""
        recent = self.snapshot.recent
        if recent is None or recent.version == self._recent_saved:
            return
        recent.by_cluster()  # drop what the window let go
        version = recent.version
        rows = [
            RecentNodeRecord(cluster=c, node=inv, left_at=at) for c, inv, at in recent.entries()
        ]
        await self._term.store.put_recent_nodes(
            RecentNodesRecord(nodes=rows[-MAX_RECENT_NODE_RECORDS:])
        )
        self._recent_saved = version

    async def _resync_loop(self) -> None:
        """Level-triggered status: every ``status_resync_s``, write again each GPUJob and
        MemberCluster status the hub API shows differently from what this term computed."""
        while True:
            await asyncio.sleep(self.config.status_resync_s)
            self.mirror.resync_jobs()
            self.mirror.resync_members()

    # --- agent streams -------------------------------------------------------------------------------

    def _refuse_if_stopped(self) -> None:
        if self._stopped.is_set():
            raise StreamClosedError(
                "UNAVAILABLE", f"hub {self.config.hub_id} stopped leading: {self.stop_reason}"
            )

    async def authenticate(self, creds: Credentials, timeout_s: float = 30.0) -> str | None:
        """The member cluster these credentials belong to (None: nobody's). Waits, at most
        ``timeout_s`` (then ``TimeoutError``), for the term's first MemberCluster list and
        token Secret lists; then answers from memory (:mod:`gpufed.hub.components.tokens`)."""

        async def synced() -> None:
            await self.intake.members_synced.wait()
            await self.tokens.synced()

        await asyncio.wait_for(synced(), timeout_s)
        return self.tokens.authenticate(creds)

    def authenticated(self, creds: Credentials) -> str | None:
        """As :meth:`authenticate`, without waiting: the check :mod:`gpufed.hub.edge.service` repeats
        right before :meth:`open_session`, so a token rotated during the handshake opens
        nothing."""
        return self.tokens.authenticate(creds)

    def open_session(self, hello: AgentHello) -> AgentSession:
        """Accept a stream from ``hello.cluster``'s agent: Welcome, desired set, pending deletes.

        Raises :class:`StreamClosedError`: UNAVAILABLE once this controller stopped (its term
        is over, and a stream bound to it would feed a leader that no longer exists),
        PERMISSION_DENIED for an agent of another Kubernetes cluster.
        """
        self._refuse_if_stopped()
        m = self.members.admit(hello)
        s = AgentSession(
            cluster=hello.cluster,
            agent_version=hello.agent_version,
            agent_instance=hello.agent_instance,
            served_kinds=hello.served_kinds,
            protocol_version=hello.protocol_version,
        )
        self.dispatch.attach(m, s)
        self.members.heard(m)
        self.metrics.agents_connected.inc()
        s.welcome(
            hub_id=self.config.hub_id,
            heartbeat_interval_s=self.config.heartbeat_interval_s,
            max_message_bytes=self.config.max_message_bytes,
            hub_epoch=self.epoch,
            degraded_node_conditions=self.config.degraded_node_conditions,
        )
        # Desired set first: fenced and deleted jobs are absent, so the agent deletes them
        # before it gets anything else (docs/design.md §7 item 5).
        desired = self.dispatch.send_desired_set(s)
        self.members.note_agent_version(m, hello.agent_version)
        log.info(
            "agent.connected",
            cluster=hello.cluster,
            agent_version=hello.agent_version,
            instance=hello.agent_instance,
            desired=desired,
        )
        s.syncing = False
        self.rebuild.reported(m)
        self.dispatch.pump(hello.cluster)
        return s

    def close_session(self, s: AgentSession, reason: str) -> None:
        """The stream ended (either side)."""
        m = self.state.members.get(s.cluster)
        self.metrics.agents_connected.dec()
        code = s.closed.code if s.closed is not None else "OK"
        self.metrics.streams_closed.labels(code).inc()
        if m is not None and m.session is s:
            m.session = None
        log.info("agent.disconnected", cluster=s.cluster, code=code, reason=reason)

    def heard(self, s: AgentSession) -> None:
        """A message arrived on ``s``: the member is alive. Raises :class:`StreamClosedError`
        (UNAVAILABLE) once this term stopped, (ABORTED) when a newer stream replaced ``s``."""
        self._refuse_if_stopped()
        m = self.state.members.get(s.cluster)
        if m is None or m.session is not s:
            raise StreamClosedError("ABORTED", "this stream was replaced by a newer one")
        self.members.heard(m)

    async def handle(self, s: AgentSession, event: AgentEvent) -> None:
        """Route one decoded agent message (after :meth:`heard`). Raises
        :class:`StreamClosedError` to close the stream (a report about another member's job)."""
        m = self.state.members.get(s.cluster)
        if m is None or m.session is not s:
            raise StreamClosedError("ABORTED", "this stream was replaced by a newer one")
        if isinstance(event, Heartbeat):
            self.members.on_heartbeat(m, event)
        elif isinstance(event, InventorySnapshot):
            await self.members.take_snapshot(m, event)
        elif isinstance(event, InventoryDelta):
            self.members.on_delta(m, event)
        elif isinstance(event, WorkAck):
            self.reports.on_ack(s, event)
        elif isinstance(event, WorkloadStatus):
            self.reports.on_workload(s, event)
        elif isinstance(event, ResyncRequest):
            log.info("agent.resync_requested", cluster=s.cluster, reason=event.reason)
            self.dispatch.resend_desired_set(s)
