"""The leader's control loop: intake, scheduling, dispatch, status mirroring, member health.

One :class:`Controller` exists while this replica leads (:mod:`gpufed.hub.app` creates it
after winning the election and drops it when leadership is lost). It starts from etcd
(:meth:`Store.load`) and the hub API server (list+watch), so a restart or a failover resumes
where the previous leader stopped and creates nothing twice (DESIGN.md §7 item 4).

Flows (DESIGN.md §7):

1. **Intake**: a GPUJob is validated (pod sets, allowed kinds, own namespace); an invalid one
   gets phase Failed, condition ``Valid=False`` naming the field and a Warning Event. A valid
   one gets the finalizer, then waits in the queue.
2. **Scheduling** (:meth:`_cycle`): placement's queue pass over the waiting jobs
   (priority, submit time, backfill rule) calls ``place()`` on the long-lived
   :class:`FleetSnapshot`; a ``Placed`` decision is reserved in the snapshot at once, then the
   job record, the work item and the reservation are written in ONE etcd transaction
   (:meth:`Store.place`) before anything is sent.
3. **Dispatch**: the work item goes to the member's stream, at most
   ``max_unacked_per_cluster`` in flight; after every (re)connect the agent first gets the
   full desired set (fenced jobs left out, so their old copies are deleted), then pending
   deletes, then new work.
4. **Status**: acks and workload reports become ``GPUJob.status`` (pure rules in
   :mod:`gpufed.hub.status`; terminal phases are final) and Events; reservations are released
   once the member reports the job's pods bound, the job finished, or the TTL passed.
5. **Deletion**: the finalizer stays until the agent acknowledges the delete (background
   propagation in the member) or the member is declared lost.
6. **Health**: from the hub's own receive times (:mod:`gpufed.hub.health`); NotReady members
   are left out of placement; after the member-lost timeout their jobs become Lost or, with
   ``reschedule: OnClusterLoss``, are placed again while the old copy is fenced.

Concurrency: one asyncio loop; every read-modify-write of one job runs under that job's lock
(kopf's "one serial worker per object"), many jobs in parallel. A write that finds another
leader in etcd (:class:`NotLeaderError`) ends this controller.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog
from pydantic import ValidationError

from gpufed.api.decision import Decision, Outcome, Reservation
from gpufed.api.gpujob import GPUJob, GPUJobStatus, StatusCondition
from gpufed.api.inventory import (
    ClusterHealth,
    ClusterInventory,
    MemberClusterState,
    NodeInventory,
    Taint,
    summarize,
)
from gpufed.api.labels import FINALIZER, GPU_RESOURCE, HOSTNAME_LABEL
from gpufed.api.membercluster import (
    READY_CONDITION,
    MemberCluster,
    MemberClusterSpec,
    MemberClusterStatus,
)
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol.codec import (
    ProtocolError,
    work_ack_from_pb,
    work_item_to_pb,
    workload_status_from_pb,
)
from gpufed.api.request import PlacementRequest
from gpufed.api.work import WorkAck, WorkloadStatus
from gpufed.hub import status as st
from gpufed.hub.config import HubConfig
from gpufed.hub.health import MemberHealth, classify, silence
from gpufed.hub.kube import GoneError, KubeAPI, WatchEvent
from gpufed.hub.metrics import HubMetrics
from gpufed.hub.podsets import InvalidJobError, placement_request
from gpufed.hub.records import AckRecord, JobRecord, MemberMeta, WorkRecord
from gpufed.hub.sessions import AgentSession, RefusedError, StreamClosedError
from gpufed.hub.store import (
    ConflictError,
    Loaded,
    NotLeaderError,
    Store,
    StoreUnavailableError,
)
from gpufed.hub.writer import CoalescingWriter, ObjectGoneError, RefusedWriteError
from gpufed.placement import (
    BackfillRule,
    FleetSnapshot,
    Hold,
    Policy,
    hold_for,
    place,
    schedule_pass,
)
from gpufed.sync.manifests import ManifestError, PodSetPinning, prepare_manifests
from gpufed.sync.retry import Verdict
from gpufed.sync.retry import classify as classify_error

log = structlog.get_logger("gpufed.hub.core")

PROTOCOL_VERSION = pb.PROTOCOL_VERSION_CURRENT
#: Budget of one DesiredSet part (agents' gRPC clients accept 4 MiB by default).
_DESIRED_PART_BYTES = 1024 * 1024
#: Minimum pause between two scheduling cycles (a burst of changes becomes one cycle).
_CYCLE_DEBOUNCE_S = 0.005
_TICK_S = 0.5
#: Status codes of a write the API server refuses for its content: retrying cannot help.
_REFUSED = frozenset({400, 403, 422})


@dataclass
class JobState:
    """What the leader knows about one GPUJob (keyed by UID)."""

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

    @property
    def key(self) -> str:
        return self.obj.key

    @property
    def deleting(self) -> bool:
        return self.obj.metadata.deletion_timestamp is not None

    @property
    def terminal(self) -> bool:
        return st.is_terminal(self.status)

    @property
    def placed_cluster(self) -> str | None:
        return self.record.cluster if self.record is not None else None


@dataclass
class WorkState:
    """One work item in the outbox, with the member's latest ack."""

    cluster: str
    record: WorkRecord
    revision: int
    ack: AckRecord | None = None
    sent_at: float | None = None
    retry_at: float | None = None

    @property
    def applied_before(self) -> bool:
        return self.ack is not None and self.ack.applied

    @property
    def settled(self) -> bool:
        """The member acknowledged this revision (Applied for Apply, Deleted for Delete)."""
        if self.ack is None or self.ack.revision < self.revision:
            return False
        want = "Applied" if self.record.op == "Apply" else "Deleted"
        return self.ack.result == want


@dataclass
class MemberState:
    """What the leader knows about one member cluster."""

    name: str
    spec: MemberClusterSpec | None = None
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
    token: str | None = None
    outbox: collections.deque[str] = field(default_factory=collections.deque)
    queued: set[str] = field(default_factory=set)
    dirty_nodes: set[str] = field(default_factory=set)
    removed_nodes: set[str] = field(default_factory=set)
    #: serialises node writes, so a settle waits for a flush already in flight
    nodes_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    meta_dirty: bool = False
    status_dirty: bool = True

    @property
    def lost(self) -> bool:
        return self.meta.lost_at is not None


class Controller:
    """The leader's state and loops (see the module docstring)."""

    def __init__(
        self,
        config: HubConfig,
        store: Store,
        kube: KubeAPI,
        metrics: HubMetrics,
        *,
        mono: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.store = store
        self.kube = kube
        self.metrics = metrics
        self._mono = mono
        self._wall = wall
        self.started = mono()
        self.policy = Policy(
            allocation=config.allocation,
            reservation_ttl_s=config.reservation_ttl_s,
        )
        self.backfill = BackfillRule()
        self.snapshot = FleetSnapshot()
        self.jobs: dict[str, JobState] = {}
        self.work: dict[tuple[str, str], WorkState] = {}
        self.members: dict[str, MemberState] = {}
        self._orphan_records: dict[str, tuple[JobRecord, int]] = {}
        #: workload reports that came before this term's GPUJob list (latest per job uid)
        self._early_reports: dict[str, tuple[AgentSession, WorkloadStatus]] = {}
        self._locks: dict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        self._kick = asyncio.Event()
        self._stopped = asyncio.Event()
        self.stop_reason = ""
        self.members_synced = asyncio.Event()
        self.jobs_synced = asyncio.Event()
        self._tokens_loaded_at = -1e9
        self._reconciling: set[str] = set()
        #: jobs that may want placement (checked again each cycle)
        self._waiting: set[str] = set()
        self._bg: set[asyncio.Task[Any]] = set()
        # Events are for people, status is state: under load, Events wait for a slot (and may
        # lag) while status writes go first (client-go rate-limits its events too).
        self._event_slots = asyncio.Semaphore(2)
        self._restarted_reservations: dict[str, str] = {}
        # A job's placed/dispatched/running steps usually come within a fraction of a second:
        # written at most every 250 ms per job they take fewer writes (each write also comes
        # back through every GPUJob watch); a job finishing later is written at once.
        self.job_status = CoalescingWriter(
            "job-status", self._write_job_status, workers=8, min_interval_s=0.25
        )
        self.member_status = CoalescingWriter("member-status", self._write_member_status)

    # =========================================================================================
    # lifecycle
    # =========================================================================================

    async def load(self) -> None:
        """Read the previous leader's state from etcd; restart every timer from now."""
        loaded = await self.store.load()
        self._restore(loaded)
        log.info(
            "hub.state.loaded",
            jobs=len(loaded.jobs),
            work=len(loaded.work),
            reservations=len(loaded.reservations),
            members=len(set(loaded.members) | set(loaded.nodes)),
        )

    def _restore(self, loaded: Loaded) -> None:
        now_wall = self._wall()
        for name in set(loaded.members) | set(loaded.nodes):
            m = self._member(name)
            m.meta = loaded.members.get(name, MemberMeta())
            m.nodes = dict(loaded.nodes.get(name, {}))
            if m.lost:
                m.health = "Lost"
        for (cluster, uid), (record, rev) in loaded.work.items():
            self.work[(cluster, uid)] = WorkState(
                cluster, record, rev, ack=loaded.acks.get((cluster, uid))
            )
        for uid, rec in loaded.jobs.items():
            self._orphan_records[uid] = (rec, loaded.job_revisions[uid])
        restarted: dict[str, str] = {}
        for uid, text in loaded.reservations.items():
            res = Reservation.model_validate_json(text)
            if res.created_at < now_wall:
                # A hub that was down restarts every timer from its own start.
                res = res.model_copy(update={"created_at": now_wall})
                restarted[uid] = res.model_dump_json()
            self.snapshot.add_reservation(res)
        self._restarted_reservations = restarted

    async def run(self) -> str:
        """Run until leadership must end (returns the reason) or the task is cancelled."""
        self.job_status.start()
        self.member_status.start()
        self.metrics.is_leader.set(1)
        tasks = [
            asyncio.create_task(self._guard(self._list_watch("memberclusters"))),
            asyncio.create_task(self._guard(self._list_watch("gpujobs"))),
            asyncio.create_task(self._guard(self._schedule_loop())),
            asyncio.create_task(self._guard(self._tick_loop())),
            asyncio.create_task(self._guard(self._flush_loop())),
        ]
        try:
            if self._restarted_reservations:
                await self.store.put_reservations(self._restarted_reservations)
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
        self.metrics.is_leader.set(0)
        for m in self.members.values():
            if m.session is not None:
                m.session.close(
                    "UNAVAILABLE", f"hub {self.config.hub_id} stopped leading: {reason}"
                )
        for t in list(self._bg):
            t.cancel()
        await self.job_status.stop()
        await self.member_status.stop()

    def stop(self, reason: str) -> None:
        """Ask :meth:`run` to return (e.g. a write found another leader)."""
        if not self._stopped.is_set():
            self.stop_reason = reason
            log.warning("hub.controller.stopping", reason=reason)
            self._stopped.set()

    async def _guard(self, coro: Awaitable[None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except NotLeaderError as exc:
            self.stop(str(exc))
        except StoreUnavailableError as exc:
            log.warning("hub.etcd.unavailable", error=str(exc))
            self.stop(f"etcd unavailable: {exc}")
        except Exception as exc:
            log.exception("hub.controller.crashed", error=str(exc))
            self.stop(f"internal error: {exc}")

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(self._guard(coro))
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def kick(self) -> None:
        """Ask for a scheduling cycle soon."""
        self._kick.set()

    @property
    def ready(self) -> bool:
        """Both initial lists are done (``/readyz``)."""
        return self.members_synced.is_set() and self.jobs_synced.is_set()

    # =========================================================================================
    # intake: list + watch
    # =========================================================================================

    async def _list_watch(self, plural: str) -> None:
        on_event = self._on_member_event if plural == "memberclusters" else self._on_job_event
        backoff = 0.2
        while True:
            try:
                items, rv = await self.kube.list_objects(plural)
            except Exception as exc:
                if classify_error(exc) is not Verdict.RETRY:
                    raise
                log.warning("hub.intake.list_failed", resource=plural, error=str(exc))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10)
                continue
            self._on_listed(plural, items)
            for obj in items:
                on_event(WatchEvent("ADDED", obj))
            if plural == "memberclusters":
                self.members_synced.set()
            else:
                self._orphans_after_list()
                self._jobs_listed()
            log.info("hub.intake.listed", resource=plural, objects=len(items), rv=rv)
            backoff = 0.2
            while True:
                try:
                    async for ev in self.kube.watch_objects(plural, rv):
                        if isinstance(ev, str):
                            rv = ev
                            continue
                        rv = str(ev.obj.get("metadata", {}).get("resourceVersion", rv))
                        on_event(ev)
                    backoff = 0.2
                except GoneError:
                    log.info("hub.intake.relist", resource=plural, reason="410 ObjectGoneError")
                    break
                except Exception as exc:
                    if classify_error(exc) is not Verdict.RETRY:
                        raise
                    log.warning("hub.intake.watch_failed", resource=plural, error=str(exc))
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 10)

    def _on_listed(self, plural: str, items: list[dict[str, Any]]) -> None:
        """After a (re)list: objects we knew that are gone were deleted while unwatched."""
        present = {str(o.get("metadata", {}).get("uid")) for o in items}
        if plural == "gpujobs":
            for uid in [u for u in self.jobs if u not in present]:
                self._job_gone(uid)
        else:
            names = {str(o.get("metadata", {}).get("name")) for o in items}
            for m in list(self.members.values()):
                if m.spec is not None and m.name not in names:
                    self._member_gone(m.name)

    # --- members ------------------------------------------------------------------------------

    def _member(self, name: str) -> MemberState:
        m = self.members.get(name)
        if m is None:
            m = self.members[name] = MemberState(name)
        return m

    def _on_member_event(self, ev: WatchEvent) -> None:
        name = str(ev.obj.get("metadata", {}).get("name", ""))
        if ev.type == "DELETED":
            self._member_gone(name)
            return
        try:
            mc = MemberCluster.model_validate(ev.obj)
        except ValidationError as exc:
            log.warning("hub.member.invalid", cluster=name, error=str(exc.errors()[0]))
            return
        m = self._member(name)
        if m.spec is None or m.spec.join_token_ref != mc.spec.join_token_ref:
            m.token = None
        m.spec = mc.spec
        if mc.status is not None:
            m.conditions_seen = list(mc.status.conditions)
        labels = dict(mc.spec.labels)
        taints = tuple(Taint(key=t.key, value=t.value, effect=t.effect) for t in mc.spec.taints)
        if name in self.snapshot.cluster_names:
            self.snapshot.set_metadata(name, labels=labels, taints=taints)
        else:
            self.snapshot.set_member(self._member_state(m))
        m.status_dirty = True
        self.kick()

    def _member_state(self, m: MemberState) -> MemberClusterState:
        spec = m.spec
        return MemberClusterState(
            name=m.name,
            labels=dict(spec.labels) if spec else {},
            taints=tuple(Taint(key=t.key, value=t.value, effect=t.effect) for t in spec.taints)
            if spec
            else (),
            health=self._health_of(m),
            inventory=ClusterInventory(
                cluster=m.name,
                nodes=tuple(m.nodes[n] for n in sorted(m.nodes)),
                served_kinds=frozenset(m.meta.served_kinds),
                agent_version=m.meta.agent_version,
            ),
        )

    def _health_of(self, m: MemberState) -> ClusterHealth:
        if m.health == "Ready":
            return ClusterHealth(ready=True)
        if m.health == "Lost":
            return ClusterHealth(
                ready=False,
                reason="ClusterLost",
                message=f"no message from the agent for more than {self.config.member_lost_s:.0f}"
                " s: the member was declared lost and its jobs handled",
            )
        return ClusterHealth(
            ready=False,
            reason="LeaseExpired",
            message=f"no message from the agent for more than {self.config.member_lease_s:.0f} s",
        )

    def _member_gone(self, name: str) -> None:
        m = self.members.get(name)
        if m is None:
            return
        m.spec = None
        m.token = None
        if m.meta.cluster_uid:
            # A re-joined member may live in another (rebuilt) Kubernetes cluster.
            m.meta = m.meta.model_copy(update={"cluster_uid": ""})
            m.meta_dirty = True
        if m.session is not None:
            m.session.close("PERMISSION_DENIED", f"MemberCluster {name} was deleted on the hub")
        if name in self.snapshot.cluster_names:
            self.snapshot.remove_member(name)
        self.member_status.forget(name)
        log.info("hub.member.removed", cluster=name)

    # --- jobs ---------------------------------------------------------------------------------

    def _on_job_event(self, ev: WatchEvent) -> None:
        meta = ev.obj.get("metadata", {})
        uid = str(meta.get("uid", ""))
        if ev.type == "DELETED":
            self._job_gone(uid)
            return
        try:
            obj = GPUJob.model_validate(ev.obj)
        except ValidationError as exc:
            log.warning(
                "hub.job.unreadable",
                job=f"{meta.get('namespace')}/{meta.get('name')}",
                error=str(exc.errors()[0]),
            )
            return
        job = self.jobs.get(uid)
        if job is None:
            job = self._new_job(uid, obj)
        else:
            job.obj = obj
        self._reconcile_soon(job)

    def _jobs_listed(self) -> None:
        """The first GPUJob list of this term is in: apply the workload reports that waited."""
        first = not self.jobs_synced.is_set()
        self.jobs_synced.set()
        if not first:
            return
        early, self._early_reports = self._early_reports, {}
        for s, report in early.values():
            m = self.members.get(s.cluster)
            if m is None or m.session is not s:
                continue  # a newer stream of that member reports again
            try:
                self._on_workload(s, report)
            except RefusedError as exc:
                log.warning("agent.report_refused", cluster=s.cluster, reason=str(exc))
        if early:
            log.info("hub.early_reports_applied", reports=len(early))

    def _new_job(self, uid: str, obj: GPUJob) -> JobState:
        status = obj.status or GPUJobStatus()
        job = JobState(uid=uid, obj=obj, status=status, seen_mono=self._mono())
        orphan = self._orphan_records.pop(uid, None)
        if orphan is not None:
            job.record, job.record_rev = orphan
            placed = job.record.cluster
            if placed is not None and job.status.cluster != placed and not job.terminal:
                # Placed by an earlier hub that stopped before writing the status: say so again.
                log.info("hub.job.placement_restored", job=obj.key, cluster=placed)
                self._set_status(
                    job,
                    st.resumed(job.status, cluster=placed, gpus=job.record.gpus, now=self._now()),
                )
        created = obj.metadata.creation_timestamp
        submitted = st.parse_rfc3339(created) if created else self._wall()
        try:
            job.request = placement_request(obj, submitted_at=submitted)
            prepare_manifests(
                obj.spec.template,
                job_uid=uid,
                job_name=obj.metadata.name,
                namespace=obj.metadata.namespace or "default",
                origin=self.config.origin,
                allowed_kinds=self.config.allowed_kinds,
            )
        except (InvalidJobError, ManifestError) as exc:
            job.request = None
            job.error, job.error_field = exc.message, exc.field
        except Exception as exc:
            # A rule without a message of its own is still this job's problem only: one
            # GPUJob must never stop the leader for every other job.
            log.exception("hub.job.intake_error", job=obj.key, error=str(exc))
            job.request = None
            job.error, job.error_field = f"the hub cannot read this job: {exc}", "spec"
        self.jobs[uid] = job
        if job.error is not None and not job.terminal and job.record is None:
            message = f"{job.error_field}: {job.error}"
            self._set_status(
                job,
                st.invalid(
                    job.status, field=job.error_field or "", message=message, now=self._now()
                ),
            )
            self._event(job, "Warning", "InvalidSpec", message)
            log.info("hub.job.invalid", job=job.key, field=job.error_field, error=job.error)
        return job

    def _job_gone(self, uid: str) -> None:
        job = self.jobs.pop(uid, None)
        self.job_status.forget(uid)
        if job is None:
            return
        log.info("hub.job.gone", job=job.key)
        if job.record is not None:
            self._orphan_records[uid] = (job.record, job.record_rev or 0)
            self._spawn(self._cleanup_orphan(uid))
        else:
            self._release(uid)

    def _orphans_after_list(self) -> None:
        """Job records in etcd whose GPUJob no longer exists: delete their member copies."""
        for uid in list(self._orphan_records):
            if uid not in self.jobs:
                self._spawn(self._cleanup_orphan(uid))

    async def _cleanup_orphan(self, uid: str) -> None:
        async with self._locks[uid]:
            rec = self._orphan_records.pop(uid, None)
            if rec is None or uid in self.jobs:
                return
            record, _ = rec
            log.info("hub.job.orphan_cleanup", job=record.job, cluster=record.cluster)
            if record.cluster is not None:
                await self._ensure_delete(record.cluster, uid)
            await self.store.forget_job(uid)
            self._release(uid)

    def _reconcile_soon(self, job: JobState) -> None:
        if job.uid not in self._reconciling:
            self._reconciling.add(job.uid)
            self._spawn(self._reconcile(job.uid))

    async def _reconcile(self, uid: str) -> None:
        async with self._locks[uid]:
            self._reconciling.discard(uid)
            job = self.jobs.get(uid)
            if job is None:
                return
            if job.deleting:
                await self._finalize(job)
                return
            if self._wants_placement(job):
                self._waiting.add(uid)
                self.kick()
            needs_finalizer = job.record is not None or (
                job.request is not None and not job.terminal
            )
            if needs_finalizer and FINALIZER not in job.obj.metadata.finalizers:
                # Off the placement path: a job deleted before its finalizer landed is cleaned
                # up from its etcd record (DELETED event, or the orphan sweep after a restart).
                self._spawn(self._add_finalizer(uid))

    async def _add_finalizer(self, uid: str) -> None:
        job = self.jobs.get(uid)
        if job is None or job.deleting or FINALIZER in job.obj.metadata.finalizers:
            return
        try:
            await self._patch_finalizers(job, add=True)
        except Exception as exc:
            status = getattr(exc, "status", None)
            if status is None or not 400 <= status < 500:
                raise
            # e.g. 422: no new finalizers on an object that is being deleted
            log.warning("hub.job.finalizer_refused", job=job.key, status=status, error=str(exc))

    async def _patch_finalizers(self, job: JobState, *, add: bool) -> GPUJob | None:
        """Add or remove our finalizer (optimistic concurrency, re-read on 409)."""
        ns, name = job.obj.metadata.namespace or "default", job.obj.metadata.name
        obj = job.obj
        for _ in range(5):
            current = list(obj.metadata.finalizers)
            if add == (FINALIZER in current):
                return obj
            wanted = [*current, FINALIZER] if add else [f for f in current if f != FINALIZER]
            try:
                raw = await self.kube.set_job_finalizers(
                    ns, name, wanted, obj.metadata.resource_version or ""
                )
            except Exception as exc:
                status = getattr(exc, "status", None)
                if status == 404:
                    return None
                if status != 409:
                    raise
                fresh = await self.kube.get_job(ns, name)
                if fresh is None:
                    return None
                obj = GPUJob.model_validate(fresh)
                continue
            obj = GPUJob.model_validate(raw)
            if job.uid in self.jobs:
                job.obj = obj
            log.info("hub.job.finalizer", job=job.key, added=add)
            return obj
        raise RuntimeError(f"could not update the finalizers of {job.key}: kept conflicting")

    # --- deletion -----------------------------------------------------------------------------

    async def _finalize(self, job: JobState) -> None:
        """The GPUJob is being deleted (call under the job's lock)."""
        rec = job.record
        if rec is None or rec.cluster is None:
            if rec is not None:
                await self.store.forget_job(job.uid)
                job.record = None
            self._release(job.uid)
            await self._drop_finalizer(job)
            return
        cluster = rec.cluster
        m = self.members.get(cluster)
        ws = self.work.get((cluster, job.uid))
        if ws is None or (m is not None and m.lost):
            if ws is not None:
                await self._ensure_delete(cluster, job.uid)
            await self.store.forget_job(job.uid)
            job.record = None
            self._release(job.uid)
            await self._drop_finalizer(job)
            return
        await self._ensure_delete(cluster, job.uid)

    async def _drop_finalizer(self, job: JobState) -> None:
        if FINALIZER in job.obj.metadata.finalizers:
            await self._patch_finalizers(job, add=False)
            log.info("hub.job.deleted", job=job.key)

    async def _ensure_delete(self, cluster: str, uid: str, *, fenced: bool = False) -> None:
        """Turn the job's work item in ``cluster`` into a Delete (new revision) and send it."""
        ws = self.work.get((cluster, uid))
        if ws is None or (ws.record.op == "Delete" and ws.record.fenced == fenced):
            if ws is not None:
                self._enqueue(cluster, uid)
            return
        record = ws.record.model_copy(update={"op": "Delete", "manifests": (), "fenced": fenced})
        ws.revision = await self.store.put_work(cluster, record)
        ws.record = record
        ws.sent_at = None
        ws.retry_at = None
        log.info("hub.work.delete", job=record.job, cluster=cluster, revision=ws.revision)
        self._enqueue(cluster, uid)

    # =========================================================================================
    # scheduling
    # =========================================================================================

    def _wants_placement(self, job: JobState) -> bool:
        return (
            job.request is not None
            and not job.terminal
            and not job.deleting
            and (job.record is None or job.record.cluster is None)
        )

    async def _schedule_loop(self) -> None:
        while True:
            await self._kick.wait()
            await asyncio.sleep(_CYCLE_DEBOUNCE_S)
            self._kick.clear()
            await self._cycle()

    async def _cycle(self) -> None:
        """One scheduling pass over every waiting job (numbered phases below)."""
        now = self._wall()
        # 1. drop reservations whose pods never showed up
        expired = self.snapshot.expire_reservations(now)
        if expired:
            await self.store.delete_reservations(r.job_uid for r in expired)
            for r in expired:
                log.info("hub.reservation.expired", job=r.job, cluster=r.cluster)
        # 2. the queue
        waiting = []
        for uid in list(self._waiting):
            job = self.jobs.get(uid)
            if job is not None and self._wants_placement(job):
                waiting.append(job)
            else:
                self._waiting.discard(uid)
        self.metrics.queue_depth.set(len(waiting))
        if not waiting:
            return
        requests = [j.request for j in waiting if j.request is not None]
        reservations: dict[str, Reservation] = {}
        # Small fleets: record every member's score or rejection for `gpufed explain`.
        explain = len(self.snapshot.cluster_names) <= self.config.explain_members

        def attempt(req: PlacementRequest, hold: Mapping[str, Hold]) -> Decision:
            t0 = time.perf_counter()
            decision = place(req, self.snapshot, self.policy, now, hold=hold, explain=explain)
            self.metrics.placement_seconds.observe(time.perf_counter() - t0)
            if decision.outcome == Outcome.PLACED:
                reservations[req.uid] = self.snapshot.reserve(
                    decision, now, self.config.reservation_ttl_s
                )
            return decision

        # 3. placement's queue pass: order, backfill holds, place + reserve
        result = schedule_pass(
            requests,
            now,
            attempt,
            lambda r: hold_for(r, self.snapshot, self.policy),
            self.backfill,
        )
        # 4. commit placed jobs (etcd first, then dispatch); report the rest
        commits = []
        for req, decision in result.decisions:
            self.metrics.decisions.labels(decision.outcome.value).inc()
            job = self.jobs.get(req.uid)
            if decision.outcome == Outcome.PLACED:
                commits.append(self._commit(req.uid, decision, reservations[req.uid]))
            elif job is not None:
                self._not_placed(job, decision)
        if commits:
            await asyncio.gather(*commits)

    def _fleet_complete(self) -> bool:
        """Every member the hub knows has reported an inventory (a Rejected is then final)."""
        known = [m for m in self.members.values() if m.spec is not None]
        return bool(known) and all(m.nodes for m in known)

    def _not_placed(self, job: JobState, decision: Decision) -> None:
        if decision.outcome == Outcome.REJECTED and not self._fleet_complete():
            waiting = sorted(m.name for m in self.members.values() if m.spec and not m.nodes)
            decision = decision.model_copy(
                update={
                    "outcome": Outcome.UNSCHEDULABLE,
                    "message": f"{decision.message} (waiting for member inventories: "
                    f"{', '.join(waiting) or 'no member cluster registered yet'})",
                }
            )
        sig = (decision.outcome, decision.message, decision.rejections)
        if sig == job.last_unschedulable:
            return
        job.last_unschedulable = sig
        assert job.request is not None
        self._set_status(
            job,
            st.decided(
                job.status, decision, gpus=job.request.gpus, placement_ms=None, now=self._now()
            ),
        )
        if decision.outcome == Outcome.REJECTED:
            self._event(job, "Warning", "Rejected", decision.message)
            log.info("placement.rejected", job=job.key, reason=decision.message)
        else:
            self._event(job, "Normal", "Unschedulable", decision.message)
            log.info("placement.unschedulable", job=job.key, reason=decision.message)

    async def _commit(self, uid: str, decision: Decision, res: Reservation) -> None:
        """Write the placement (one etcd transaction), then dispatch and report it."""
        async with self._locks[uid]:
            job = self.jobs.get(uid)
            if job is None or not self._wants_placement(job) or decision.cluster is None:
                self.snapshot.release(uid)
                return
            cluster = decision.cluster
            member = self.members.get(cluster)
            known = member.nodes if member is not None else {}
            pinning = {
                ps.name: PodSetPinning(
                    nodes=tuple(sorted(ps.nodes)),
                    hostnames={
                        n: known[n].labels.get(HOSTNAME_LABEL, n) for n in ps.nodes if n in known
                    },
                    nvlink_domains=decision.nvlink_domains,
                )
                for ps in decision.pod_sets
            }
            ns = job.obj.metadata.namespace or "default"
            try:
                manifests = prepare_manifests(
                    job.obj.spec.template,
                    job_uid=uid,
                    job_name=job.obj.metadata.name,
                    namespace=ns,
                    origin=self.config.origin,
                    pinning=pinning,
                    allowed_kinds=self.config.allowed_kinds,
                )
            except ManifestError as exc:  # pragma: no cover - validated at intake
                self.snapshot.release(uid)
                self._set_status(
                    job, st.invalid(job.status, field=exc.field, message=str(exc), now=self._now())
                )
                return
            assert job.request is not None
            attempt_no = (job.record.attempt + 1) if job.record is not None else 1
            now = self._wall()
            record = JobRecord(
                uid=uid,
                job=job.key,
                cluster=cluster,
                attempt=attempt_no,
                placed_at=now,
                gpus=job.request.gpus,
            )
            work = WorkRecord(
                job_uid=uid,
                job=job.key,
                namespace=ns,
                op="Apply",
                manifests=tuple(manifests),
                created_at=now,
            )
            expect = job.record_rev if job.record is not None else None
            try:
                rev, job_rev = await self.store.place(
                    record, work, res.model_dump_json(), expect_job_revision=expect
                )
            except ConflictError:
                got = await self.store.get_job(uid)
                if got is None or got[0].cluster != cluster or got[0].attempt != attempt_no:
                    # Someone else placed it: adopt what etcd says.
                    self.snapshot.release(uid)
                    if got is not None:
                        job.record, job.record_rev = got
                    log.warning("placement.conflict", job=job.key)
                    return
                stored = await self.store.get_work(cluster, uid)
                assert stored is not None
                rev, job_rev = stored[1], got[1]  # our own write committed; the reply was lost
            job.record, job.record_rev = record, job_rev
            self.work[(cluster, uid)] = WorkState(cluster, work, rev)
            job.decided_mono = self._mono()
            placement_s = job.decided_mono - job.seen_mono
            if attempt_no == 1:
                self.metrics.placement_latency_seconds.observe(placement_s)
            self._set_status(
                job,
                st.decided(
                    job.status,
                    decision,
                    gpus=job.request.gpus,
                    placement_ms=round(placement_s * 1000, 3) if attempt_no == 1 else None,
                    now=self._now(),
                ),
            )
            log.info(
                "placement.decided",
                job=job.key,
                cluster=cluster,
                domains=list(decision.nvlink_domains[:8]),
                score=decision.score,
                revision=rev,
                attempt=attempt_no,
            )
            self._event(job, "Normal", "Placed", f"placed on {cluster}: {decision.message}")
            self._enqueue(cluster, uid)

    def _release(self, uid: str) -> None:
        """Release a reservation (in memory now, in etcd soon)."""
        if self.snapshot.release(uid) is not None:
            self._spawn(self.store.delete_reservations([uid]))

    # =========================================================================================
    # agent streams
    # =========================================================================================

    async def authenticate(self, token: str) -> str | None:
        """The member cluster whose join token is ``token`` (None when no member has it)."""
        await asyncio.wait_for(self.members_synced.wait(), 30)
        for attempt in range(2):
            for m in self.members.values():
                if m.spec is not None and m.token and hmac.compare_digest(m.token, token):
                    return m.name
            if attempt == 0 and self._mono() - self._tokens_loaded_at > 2.0:
                await self._load_tokens()
        return None

    async def _load_tokens(self) -> None:
        self._tokens_loaded_at = self._mono()

        async def one(m: MemberState) -> None:
            assert m.spec is not None
            ref = m.spec.join_token_ref
            m.token = await self.kube.read_secret_key(
                ref.namespace or self.config.token_namespace, ref.name, ref.key
            )

        await asyncio.gather(*(one(m) for m in self.members.values() if m.spec is not None))

    def open_session(self, cluster: str, hello: pb.Hello) -> AgentSession:
        """Accept a stream from ``cluster``'s agent: Welcome, desired set, pending deletes.

        Raises :class:`StreamClosedError` (UNAVAILABLE) once this controller stopped: its
        term is over, and a stream bound to it would feed a leader that no longer exists.
        """
        if self._stopped.is_set():
            raise StreamClosedError(
                "UNAVAILABLE", f"hub {self.config.hub_id} stopped leading: {self.stop_reason}"
            )
        m = self._member(cluster)
        uid = hello.cluster_uid
        if uid and m.meta.cluster_uid and uid != m.meta.cluster_uid:
            # A valid token in an agent pointed at the wrong cluster (kubeconfig, context):
            # it would report that cluster's nodes as this member's, find this member's jobs
            # missing and delete the other cluster's gpufed objects as orphans.
            log.warning(
                "agent.refused",
                cluster=cluster,
                reason="another Kubernetes cluster",
                joined_uid=m.meta.cluster_uid,
                agent_uid=uid,
            )
            raise StreamClosedError(
                "PERMISSION_DENIED",
                f"member {cluster} joined from the Kubernetes cluster whose kube-system "
                f"Namespace UID is {m.meta.cluster_uid}; this agent talks to {uid}: check its "
                "--kubeconfig/--context (to move the member to a rebuilt cluster, delete and "
                "re-join its MemberCluster)",
            )
        if uid and not m.meta.cluster_uid:
            m.meta = m.meta.model_copy(update={"cluster_uid": uid})
            self._spawn(self._persist_meta(m))  # the identity binds from now on, crash or not
        if m.session is not None:
            m.session.close("ABORTED", "replaced by a newer stream from the same member")
        s = AgentSession(
            cluster=cluster,
            agent_version=hello.agent_version,
            agent_instance=hello.agent_instance,
            served_kinds=tuple(hello.served_kinds),
        )
        m.outbox.clear()
        m.queued.clear()
        m.session = s
        s.syncing = True
        self._heard(m)
        self.metrics.agents_connected.inc()
        s.send(
            pb.HubMessage(
                welcome=pb.Welcome(
                    cluster=cluster,
                    hub_id=self.config.hub_id,
                    protocol_version=PROTOCOL_VERSION,
                    heartbeat_interval_ms=int(self.config.heartbeat_interval_s * 1000),
                    max_message_bytes=self.config.max_message_bytes,
                )
            )
        )
        # Desired set first: fenced and deleted jobs are absent, so the agent deletes them
        # before it gets anything else (DESIGN.md §7 item 5).
        now = self._mono()
        mine = sorted(
            (ws for (c, _), ws in self.work.items() if c == cluster), key=lambda w: w.revision
        )
        items = []
        for ws in mine:
            if ws.record.op == "Apply":
                items.append(
                    work_item_to_pb(ws.record.item(ws.revision, applied_before=ws.applied_before))
                )
                if not ws.settled:
                    ws.sent_at = now
        for part in _parts(items):
            s.send(pb.HubMessage(desired_set=part))
        for ws in mine:
            if ws.record.op == "Delete" and not ws.settled:
                self._enqueue(cluster, ws.record.job_uid, send=False)
        if m.meta.agent_version != hello.agent_version:
            m.meta = m.meta.model_copy(update={"agent_version": hello.agent_version})
            m.meta_dirty = True
        log.info(
            "agent.connected",
            cluster=cluster,
            agent_version=hello.agent_version,
            instance=hello.agent_instance,
            desired=len(items),
        )
        s.syncing = False
        self._pump(cluster)
        return s

    def close_session(self, s: AgentSession, reason: str) -> None:
        """The stream ended (either side)."""
        m = self.members.get(s.cluster)
        self.metrics.agents_connected.dec()
        code = s.closed.code if s.closed is not None else "OK"
        self.metrics.streams_closed.labels(code).inc()
        if m is not None and m.session is s:
            m.session = None
        log.info("agent.disconnected", cluster=s.cluster, code=code, reason=reason)

    async def handle(self, s: AgentSession, msg: pb.AgentMessage) -> None:
        """One message from an agent stream. Raises :class:`StreamClosedError` to close it."""
        if self._stopped.is_set():
            raise StreamClosedError(
                "UNAVAILABLE", f"hub {self.config.hub_id} stopped leading: {self.stop_reason}"
            )
        m = self.members.get(s.cluster)
        if m is None or m.session is not s:
            raise StreamClosedError("ABORTED", "this stream was replaced by a newer one")
        self._heard(m)
        kind = msg.WhichOneof("body")
        if kind == "heartbeat":
            if not s.awaiting_snapshot and msg.heartbeat.inventory_seq > (s.inventory_seq or 0):
                self._resync(s, "heartbeat names an inventory seq the hub never received")
        elif kind == "inventory_snapshot":
            done = s.snapshot_part(msg.inventory_snapshot)
            if done is not None:
                seq, nodes, kinds = done
                self._replace_inventory(m, nodes, kinds or list(s.served_kinds))
                log.info("agent.inventory.snapshot", cluster=s.cluster, seq=seq, nodes=len(nodes))
        elif kind == "inventory_delta":
            got = s.delta(msg.inventory_delta)
            if isinstance(got, str):
                self._resync(s, got)
            elif got is not None:
                self._apply_delta(m, *got)
        elif kind == "work_ack":
            try:
                ack = work_ack_from_pb(msg.work_ack)
            except ProtocolError as exc:
                raise StreamClosedError("INVALID_ARGUMENT", str(exc)) from exc
            await self._on_ack(s, ack)
        elif kind == "workload_status":
            try:
                report = workload_status_from_pb(msg.workload_status)
            except ProtocolError as exc:
                raise StreamClosedError("INVALID_ARGUMENT", str(exc)) from exc
            self._on_workload(s, report)
        elif kind == "resync_request":
            log.info("agent.resync_requested", cluster=s.cluster, reason=msg.resync_request.reason)
            self._resend_desired(s)
        elif kind == "hello":
            raise StreamClosedError("INVALID_ARGUMENT", "Hello may only be the first message")
        else:
            raise StreamClosedError("INVALID_ARGUMENT", "empty message (no body set)")

    def _heard(self, m: MemberState) -> None:
        m.last_heard = self._mono()
        m.last_heard_wall = self._wall()
        if m.lost:  # before the health change, whose status write must not show lostTime
            m.meta = m.meta.model_copy(update={"lost_at": None})
            # Written through, not left to the next flush: a hub that crashed within that
            # flush would start again believing the member lost.
            self._spawn(self._persist_meta(m))
            log.info("member.returned", cluster=m.name)
        if m.health != "Ready":
            self._set_health(m, "Ready")

    async def _persist_meta(self, m: MemberState) -> None:
        m.meta_dirty = False
        try:
            await self.store.put_member_meta(m.name, m.meta)  # the latest meta, not a copy
        except BaseException:
            m.meta_dirty = True  # the flush loop tries again
            raise

    def _resync(self, s: AgentSession, reason: str) -> None:
        s.awaiting_snapshot = True
        s.send(pb.HubMessage(resync_request=pb.ResyncRequest(reason=reason)))
        log.info("agent.resync", cluster=s.cluster, reason=reason)

    def _resend_desired(self, s: AgentSession) -> None:
        items = [
            work_item_to_pb(ws.record.item(ws.revision, applied_before=ws.applied_before))
            for (c, _), ws in sorted(self.work.items(), key=lambda kv: kv[1].revision)
            if c == s.cluster and ws.record.op == "Apply"
        ]
        for part in _parts(items):
            s.send(pb.HubMessage(desired_set=part))

    # --- inventory ----------------------------------------------------------------------------

    def _replace_inventory(
        self, m: MemberState, nodes: list[NodeInventory], kinds: Iterable[str]
    ) -> None:
        new = {n.name: n for n in nodes}
        removed = set(m.nodes) - set(new)
        changed = [n for n in nodes if m.nodes.get(n.name) != n]
        m.nodes = new
        m.dirty_nodes |= {n.name for n in changed}
        m.dirty_nodes -= removed
        m.removed_nodes |= removed
        served = tuple(sorted(set(kinds))) or m.meta.served_kinds
        if served != m.meta.served_kinds:
            m.meta = m.meta.model_copy(update={"served_kinds": served})
            m.meta_dirty = True
        if m.spec is None:
            return
        if m.name not in self.snapshot.cluster_names or len(changed) > len(new) // 2:
            self.snapshot.set_member(self._member_state(m))
        else:
            for name in removed:
                self.snapshot.remove_node(m.name, name)
            for n in changed:
                self.snapshot.upsert_node(m.name, n)
            self.snapshot.set_metadata(m.name, served_kinds=frozenset(served))
        self._inventory_changed(m)

    def _apply_delta(
        self, m: MemberState, upserts: list[NodeInventory], removed: list[str]
    ) -> None:
        for n in upserts:
            m.nodes[n.name] = n
            m.dirty_nodes.add(n.name)
            m.removed_nodes.discard(n.name)
        for name in removed:
            if m.nodes.pop(name, None) is not None:
                m.removed_nodes.add(name)
                m.dirty_nodes.discard(name)
        if m.spec is None or m.name not in self.snapshot.cluster_names:
            return
        for name in removed:
            self.snapshot.remove_node(m.name, name)
        for n in upserts:
            self.snapshot.upsert_node(m.name, n)
        self._inventory_changed(m)

    def _inventory_changed(self, m: MemberState) -> None:
        m.status_dirty = True
        settled = self.snapshot.settled_reservations()
        for res in settled:
            self.snapshot.release(res.job_uid)
            log.info("hub.reservation.settled", job=res.job, cluster=res.cluster)
        if settled:
            self._spawn(self._settle({r.cluster for r in settled}, [r.job_uid for r in settled]))
        self.kick()

    async def _settle(self, clusters: set[str], job_uids: list[str]) -> None:
        """Drop settled reservations from etcd, after the inventory that covers their pods.

        A hub that restarts in between must find those GPUs used in the stored inventory or in
        the stored ledger, never in neither (it would place onto them again until the agent's
        next snapshot: the e2e burst drill saw a node booked twice over).
        """
        for name in sorted(clusters):
            if (m := self.members.get(name)) is not None:
                await self._flush_nodes(m)
        await self.store.delete_reservations(job_uids)

    async def _flush_nodes(self, m: MemberState) -> None:
        async with m.nodes_lock:  # a caller also waits for a write another caller started
            if m.dirty_nodes or m.removed_nodes:
                upserts = [m.nodes[n] for n in m.dirty_nodes if n in m.nodes]
                removed = list(m.removed_nodes)
                m.dirty_nodes, m.removed_nodes = set(), set()
                await self.store.write_nodes(m.name, upserts, removed)

    # --- work ---------------------------------------------------------------------------------

    def _enqueue(self, cluster: str, uid: str, *, send: bool = True) -> None:
        m = self.members.get(cluster)
        if m is None:
            return
        if uid not in m.queued:
            m.queued.add(uid)
            m.outbox.append(uid)
        if send:
            self._pump(cluster)

    def _pump(self, cluster: str) -> None:
        """Send queued work to the member while fewer than the cap are unacknowledged."""
        m = self.members.get(cluster)
        if m is None or m.session is None or m.health == "Lost" or m.session.syncing:
            return
        s = m.session
        cap = self.config.max_unacked_per_cluster
        while m.outbox and len(s.unacked) < cap:
            uid = m.outbox.popleft()
            m.queued.discard(uid)
            ws = self.work.get((cluster, uid))
            if ws is None or ws.settled:
                continue
            item = ws.record.item(ws.revision, applied_before=ws.applied_before)
            s.send(pb.HubMessage(work_item=work_item_to_pb(item)))
            s.unacked[uid] = ws.revision
            ws.sent_at = self._mono()
            ws.retry_at = None
            self.metrics.work_sent.labels(ws.record.op).inc()
            log.debug(
                "dispatch.sent",
                job=ws.record.job,
                cluster=cluster,
                op=ws.record.op,
                revision=ws.revision,
            )

    def _work_elsewhere(self, uid: str, cluster: str) -> str | None:
        for c, u in self.work:
            if u == uid and c != cluster:
                return c
        job = self.jobs.get(uid)
        if job is not None and job.placed_cluster not in (None, cluster):
            return job.placed_cluster
        return None

    async def _on_ack(self, s: AgentSession, ack: WorkAck) -> None:
        """Check an ack now (a foreign one closes the stream); persist it off the stream's
        read path, so one slow etcd write does not hold up the agent's next messages."""
        s.unacked.pop(ack.job_uid, None)
        try:
            ws = self._ack_target(s.cluster, ack)
            if ws is not None:
                self._spawn(self._ack(s.cluster, ws, ack))
        finally:
            self._pump(s.cluster)

    def _ack_target(self, cluster: str, ack: WorkAck) -> WorkState | None:
        """The work item an ack answers; None for an unknown job or an old revision."""
        ws = self.work.get((cluster, ack.job_uid))
        if ws is None:
            other = self._work_elsewhere(ack.job_uid, cluster)
            if other is not None:
                raise RefusedError(
                    f"ack for job {ack.job_uid}, which is assigned to member {other}, not {cluster}"
                )
            log.info("agent.ack.unknown", cluster=cluster, job_uid=ack.job_uid)
            return None
        if ack.revision != ws.revision:
            log.info(
                "agent.ack.stale",
                cluster=cluster,
                job=ws.record.job,
                revision=ack.revision,
                current=ws.revision,
            )
            return None
        return ws

    async def _ack(self, cluster: str, ws: WorkState, ack: WorkAck) -> None:
        uid = ack.job_uid
        async with self._locks[uid]:
            if self.work.get((cluster, uid)) is not ws or ack.revision != ws.revision:
                return
            op = ws.record.op
            prev = ws.ack
            if ack.result == "Applied" and op == "Apply":
                now = self._wall()
                record = AckRecord(
                    revision=ack.revision,
                    result="Applied",
                    applied=True,
                    applied_at=prev.applied_at if prev and prev.applied_at else now,
                )
                if prev == record:
                    return
                await self.store.put_ack(cluster, uid, record)
                ws.ack = record
                self._dispatched(uid, cluster)
            elif ack.result == "Deleted" and op == "Delete":
                await self.store.forget_work(cluster, uid)
                del self.work[(cluster, uid)]
                log.info("work.deleted", job=ws.record.job, cluster=cluster)
                job = self.jobs.get(uid)
                if job is not None and job.deleting and job.placed_cluster == cluster:
                    await self.store.forget_job(uid)
                    job.record = None
                    self._release(uid)
                    await self._drop_finalizer(job)
            elif ack.result == "Failed":
                record = AckRecord(
                    revision=ack.revision,
                    result="Failed",
                    message=ack.message,
                    retryable=ack.retryable,
                    applied=prev.applied if prev else False,
                    applied_at=prev.applied_at if prev else None,
                )
                await self.store.put_ack(cluster, uid, record)
                ws.ack = record
                log.warning(
                    "work.failed",
                    job=ws.record.job,
                    cluster=cluster,
                    op=op,
                    retryable=ack.retryable,
                    error=ack.message,
                )
                if ack.retryable or op == "Delete":
                    ws.retry_at = self._mono() + min(self.config.resend_after_s, 5.0)
                else:
                    await self._member_refused(cluster, uid, ack.message)
            else:
                log.info(
                    "agent.ack.mismatch",
                    cluster=cluster,
                    job=ws.record.job,
                    op=op,
                    result=ack.result,
                )

    def _dispatched(self, uid: str, cluster: str) -> None:
        job = self.jobs.get(uid)
        if job is None or job.placed_cluster != cluster:
            return
        dispatch_s = None
        if job.decided_mono is not None:
            dispatch_s = self._mono() - job.decided_mono
            self.metrics.dispatch_seconds.observe(dispatch_s)
        self._set_status(
            job,
            st.dispatched(
                job.status,
                dispatch_ms=round(dispatch_s * 1000, 3) if dispatch_s is not None else None,
                now=self._now(),
            ),
        )
        log.info("dispatch.acked", job=job.key, cluster=cluster, dispatch_s=dispatch_s)

    async def _member_refused(self, cluster: str, uid: str, message: str) -> None:
        job = self.jobs.get(uid)
        if job is not None and job.placed_cluster == cluster:
            self._set_status(job, st.member_refused(job.status, message=message, now=self._now()))
            self._event(job, "Warning", "MemberRejected", message)
        self._release(uid)
        # Clean up whatever part of the objects the member did accept.
        await self._ensure_delete(cluster, uid)

    def _on_workload(self, s: AgentSession, report: WorkloadStatus) -> None:
        ws = self.work.get((s.cluster, report.job_uid))
        if ws is None:
            other = self._work_elsewhere(report.job_uid, s.cluster)
            if other is not None:
                raise RefusedError(
                    f"workload status for job {report.job_uid}, which is assigned to member "
                    f"{other}, not {s.cluster}"
                )
            return
        if report.revision == ws.revision and not ws.settled:
            # The agent processed this revision (a report without an ack: its objects were
            # Missing); stop re-sending it.
            ws.sent_at = None
            ws.retry_at = None
            s.unacked.pop(report.job_uid, None)
            self._pump(s.cluster)
        job = self.jobs.get(report.job_uid)
        if job is None and not self.jobs_synced.is_set():
            # Agents reconnect to a new leader before its GPUJob list is in, and send each
            # status once: keep the latest and apply it after the list (dropping it left a
            # job that finished during a failover Running forever).
            self._early_reports[report.job_uid] = (s, report)
            return
        if ws.record.op != "Apply" or job is None or job.placed_cluster != s.cluster:
            return
        before = job.status.phase
        new = st.workload(job.status, report, now=self._now())
        self._set_status(job, new)
        if new.phase != before:
            log.info("job.phase", job=job.key, cluster=s.cluster, phase=new.phase, was=before)
            if new.phase in ("Running", "Succeeded"):
                self._event(job, "Normal", new.phase, new.message)
            elif new.phase == "Failed":
                self._event(job, "Warning", "Failed", new.message)
        if new.phase in ("Succeeded", "Failed"):
            self._release(job.uid)

    # =========================================================================================
    # timers
    # =========================================================================================

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(_TICK_S)
            now = self._mono()
            for m in list(self.members.values()):
                if m.spec is None:
                    continue
                h = classify(
                    now=now,
                    last_heard=m.last_heard,
                    hub_start=self.started,
                    lease_s=self.config.member_lease_s,
                    lost_s=self.config.member_lost_s,
                    marked_lost=m.lost,
                )
                if h != m.health:
                    self._set_health(m, h)
                    if h == "Lost" and not m.lost:
                        await self._declare_lost(m)
            for ws in self.work.values():
                if ws.settled:
                    continue
                due = (ws.retry_at is not None and now >= ws.retry_at) or (
                    ws.sent_at is not None and now - ws.sent_at > self.config.resend_after_s
                )
                if due:
                    owner = self.members.get(ws.cluster)
                    if owner is not None and owner.session is not None:
                        owner.session.unacked.pop(ws.record.job_uid, None)
                        ws.sent_at = None
                        ws.retry_at = None
                        self._enqueue(ws.cluster, ws.record.job_uid)

    def _set_health(self, m: MemberState, health: MemberHealth) -> None:
        was, m.health = m.health, health
        if m.name in self.snapshot.cluster_names:
            self.snapshot.set_health(m.name, self._health_of(m))
        m.status_dirty = True
        self._submit_member_status(m)
        quiet = silence(now=self._mono(), last_heard=m.last_heard, hub_start=self.started)
        if health == "Ready":
            log.info("member.ready", cluster=m.name, was=was)
            self.kick()
            self._pump(m.name)
        elif health == "NotReady":
            log.warning("member.not_ready", cluster=m.name, silent_s=round(quiet, 1))
        else:
            log.warning("member.lost", cluster=m.name, silent_s=round(quiet, 1))

    async def _declare_lost(self, m: MemberState) -> None:
        """The member-lost timeout passed: its jobs become Lost or are placed again."""
        now_wall = self._wall()
        m.meta = m.meta.model_copy(update={"lost_at": now_wall})
        await self.store.put_member_meta(m.name, m.meta)
        lost_for = silence(now=self._mono(), last_heard=m.last_heard, hub_start=self.started)
        for cluster, uid in [k for k in self.work if k[0] == m.name]:
            async with self._locks[uid]:
                ws = self.work.get((cluster, uid))
                job = self.jobs.get(uid)
                if ws is None:
                    continue
                if job is None or job.placed_cluster != cluster:
                    continue
                if job.deleting:
                    await self._finalize(job)
                    continue
                if job.terminal:
                    continue
                self._release(uid)
                resched = job.obj.spec.placement.reschedule == "OnClusterLoss"
                if resched and job.record is not None and job.record_rev is not None:
                    requeued = job.record.model_copy(update={"cluster": None})
                    job.record_rev = await self.store.put_job(
                        requeued, expect_revision=job.record_rev
                    )
                    job.record = requeued
                    await self._ensure_delete(cluster, uid, fenced=True)
                    job.last_unschedulable = None
                    self._waiting.add(uid)
                self._set_status(
                    job,
                    st.cluster_lost(
                        job.status,
                        cluster=cluster,
                        rescheduled=resched,
                        lost_for_s=lost_for,
                        now=self._now(),
                    ),
                )
                self._event(job, "Warning", "ClusterLost", job.status.message)
                log.warning("job.lost", job=job.key, cluster=cluster, rescheduled=resched)
        self.kick()

    async def _flush_loop(self) -> None:
        """Persist changed inventories and member facts; refresh member status and metrics."""
        last_status = 0.0
        while True:
            await asyncio.sleep(min(self.config.inventory_flush_s, self.config.status_interval_s))
            for m in list(self.members.values()):
                await self._flush_nodes(m)
                if m.meta_dirty:
                    await self._persist_meta(m)
            now = self._mono()
            if now - last_status >= self.config.status_interval_s:
                last_status = now
                for m in self.members.values():
                    if m.spec is not None:
                        self._submit_member_status(m)

    # =========================================================================================
    # status writing
    # =========================================================================================

    def _now(self) -> str:
        return st.rfc3339(self._wall())

    def _set_status(self, job: JobState, status: GPUJobStatus) -> None:
        job.status = status.model_copy(update={"observed_generation": job.obj.metadata.generation})
        payload = job.status.model_dump(by_alias=True, mode="json")
        # A job that ended is what its user waits for (and its GPUs are free): write it first.
        self.job_status.submit(
            job.uid,
            (job.obj.metadata.namespace, job.obj.metadata.name, payload),
            urgent=st.is_terminal(job.status),
        )

    async def _write_job_status(self, uid: str, value: Any) -> None:
        ns, name, payload = value
        try:
            await self.kube.patch_job_status(ns, name, payload)
        except Exception as exc:
            code = getattr(exc, "status", None)
            if code == 404:
                self.metrics.status_writes.labels("job", "gone").inc()
                raise ObjectGoneError() from exc
            self.metrics.status_writes.labels("job", "error").inc()
            if code in _REFUSED:
                raise RefusedWriteError(f"{ns}/{name}: {getattr(exc, 'body', exc)}") from exc
            raise
        self.metrics.status_writes.labels("job", "ok").inc()

    def _submit_member_status(self, m: MemberState) -> None:
        if m.spec is None:
            return
        m.status_dirty = False
        status = self.member_status_of(m)
        self.member_status.submit(m.name, status.model_dump(by_alias=True, mode="json"))

    def member_status_of(self, m: MemberState) -> MemberClusterStatus:
        """The MemberCluster status the hub would write now (also feeds the metrics).

        ``lastHeartbeatTime`` advances in steps of at least ``heartbeat_interval_s`` (10 s
        minimum): the printer column shows its age, and a write per message would load the
        hub API server for nothing.
        """
        self.metrics.cluster_ready.labels(m.name).set(1 if m.health == "Ready" else 0)
        step = max(10.0, self.config.heartbeat_interval_s)
        if m.last_heard_wall is not None and (
            m.heartbeat_shown is None or m.last_heard_wall - m.heartbeat_shown >= step
        ):
            m.heartbeat_shown = m.last_heard_wall
        heartbeat = m.heartbeat_shown
        summary = summarize(m.nodes.values())
        reserved: dict[str, int] = {}
        for res in self.snapshot.reservations():
            if res.cluster != m.name:
                continue
            for node, amounts in res.nodes.items():
                inv = m.nodes.get(node)
                product = (inv.gpu_product if inv else None) or "unknown"
                gpus = amounts.get(GPU_RESOURCE, 0)
                if gpus:
                    reserved[product] = reserved.get(product, 0) + gpus
        health = self._health_of(m)
        if health.ready:
            cond = (
                ("True", "AgentConnected", "")
                if m.session is not None
                else (
                    "True",
                    "WithinLease",
                    "no agent stream since this hub started leading; within the member lease",
                )
            )
        else:
            cond = ("False", health.reason, health.message)
        previous = self.member_status.last_written(m.name)
        conditions = st.set_condition(
            _conditions_of(previous) if previous is not None else m.conditions_seen,
            READY_CONDITION,
            cond[0],
            reason=cond[1],
            message=cond[2],
            now=self._now(),
        )
        for product in set(summary.gpus_total) | set(reserved):
            for state, value in (
                ("total", summary.gpus_total.get(product, 0)),
                ("free", summary.gpus_free.get(product, 0)),
                ("reserved", reserved.get(product, 0)),
            ):
                self.metrics.cluster_gpus.labels(m.name, product, state).set(value)
        gpu_summary = ", ".join(
            f"{p}={summary.gpus_free.get(p, 0)}/{t}" for p, t in sorted(summary.gpus_total.items())
        )
        return MemberClusterStatus(
            conditions=conditions,
            gpus_total=summary.gpus_total,
            gpus_free=summary.gpus_free,
            gpus_reserved=reserved,
            largest_free_nvlink_block=summary.largest_free_nvlink_block,
            gpu_summary=gpu_summary or "none",
            nodes=len(m.nodes),
            served_kinds=list(m.meta.served_kinds),
            last_heartbeat_time=st.rfc3339(heartbeat) if heartbeat else None,
            agent_version=m.meta.agent_version or None,
            lost_time=st.rfc3339(m.meta.lost_at) if m.meta.lost_at else None,
            cluster_uid=m.meta.cluster_uid or None,
        )

    async def _write_member_status(self, name: str, payload: Any) -> None:
        try:
            await self.kube.patch_member_status(name, payload)
        except Exception as exc:
            code = getattr(exc, "status", None)
            if code == 404:
                raise ObjectGoneError() from exc
            self.metrics.status_writes.labels("member", "error").inc()
            if code in _REFUSED:
                raise RefusedWriteError(f"{name}: {getattr(exc, 'body', exc)}") from exc
            raise
        self.metrics.status_writes.labels("member", "ok").inc()

    def _event(self, job: JobState, type_: str, reason: str, message: str) -> None:
        involved = {
            "api_version": job.obj.api_version,
            "kind": job.obj.kind,
            "name": job.obj.metadata.name,
            "namespace": job.obj.metadata.namespace,
            "uid": job.uid,
        }

        async def emit() -> None:
            async with self._event_slots:
                await self.kube.emit_event(involved, type_=type_, reason=reason, message=message)

        self._spawn(emit())


def _conditions_of(previous: Any) -> list[Any]:
    if not isinstance(previous, dict):
        return []
    try:
        return MemberClusterStatus.model_validate(previous).conditions
    except ValidationError:
        return []


def _parts(items: list[pb.WorkItem]) -> list[pb.DesiredSet]:
    """Split a desired set into parts below the per-message budget (at least one part)."""
    parts: list[pb.DesiredSet] = []
    current: list[pb.WorkItem] = []
    size = 0
    for item in items:
        n = item.ByteSize()
        if current and size + n > _DESIRED_PART_BYTES:
            parts.append(pb.DesiredSet(items=current, part=len(parts), final=False))
            current, size = [], 0
        current.append(item)
        size += n
    parts.append(pb.DesiredSet(items=current, part=len(parts), final=True))
    return parts
