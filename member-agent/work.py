"""Applying the hub's work items in the member: apply, delete, reconcile, acknowledge.

Owns what the agent does with :class:`gpufed.api.work.WorkItem` s: one serial worker per job
(a newer revision replaces a queued older one; older revisions are ignored), the apply and
delete flows over :mod:`gpufed.sync.apply`, the acknowledgement of each revision once the
member API has accepted it, and the full reconcile after every (re)connect: the hub's
:class:`DesiredSet` is compared with the objects labelled with this hub's ``gpufed.io/origin``
and a ``gpufed.io/job-uid`` in the member, existing objects are adopted, missing ones created
(unless the job was applied before: a job that already ran is never re-run, its status becomes
``Missing``), and labelled objects of jobs the hub no longer wants are deleted — at once only
when they were applied under the hub's current state epoch; objects of another epoch are held
for the eviction grace period (:mod:`gpufed.agent.held`), during which the hub may claim them.
Every applied object carries the epoch (``gpufed.io/hub-epoch``).

Ownership (:mod:`gpufed.sync.ownership`): only objects carrying this hub's origin and the job's
UID are adopted, changed or deleted; an object of the same name that is someone else's fails the
work item with a message naming the object and this member, and is never touched. Namespaces
are created when missing and never deleted.

Driven by :mod:`gpufed.agent.hub_stream`; reports through two callbacks (acks, and status
tracking via :class:`gpufed.agent.status.StatusReporter`). While the hub is unreachable nothing
new arrives, so nothing new is applied, and running workloads are left as they are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from gpufed.agent.held import EpochGuard, held_jobs, stamp
from gpufed.agent.metrics import AgentMetrics
from gpufed.agent.stranded import PodClient, force_delete_stranded
from gpufed.api.labels import COMPUTE_DOMAIN_KIND, DEFAULT_ORIGIN
from gpufed.api.stream import HeldJob
from gpufed.api.work import WorkAck, WorkItem
from gpufed.sync.apply import (
    ApplyResult,
    DeleteResult,
    ManifestRefusedError,
    ObjectClient,
    ObjectRef,
    api_error_message,
    apply_object,
    check_manifests,
    delete_owned,
    ensure_namespace,
    get_object,
    main_workload,
    ref_of,
)
from gpufed.sync.manifests import (
    DEFAULT_ALLOWED_KINDS,
    WORKLOAD_KINDS,
    attempt_of,
    node_not_ready_of,
)
from gpufed.sync.ownership import Owner, OwnershipConflictError, job_uid_of, origin_selector
from gpufed.sync.retry import (
    FORBIDDEN_GRACE_S,
    ForbiddenGrace,
    Verdict,
    kube_retry,
    status_of,
)

log = structlog.get_logger("gpufed.agent.work")


class WorkClient(ObjectClient, Protocol):
    """An :class:`ObjectClient` that can also list labelled objects (the agent's MemberApi)."""

    async def list_labelled(
        self, kinds: Iterable[str], label_selector: str
    ) -> list[dict[str, Any]]:
        """Objects of the given ``Kind.group`` s (those the member serves), all namespaces."""
        ...


class StatusTracker(Protocol):
    """The status reporter, as the work manager sees it."""

    def track(
        self,
        job_uid: str,
        *,
        revision: int,
        main: ObjectRef | None,
        missing: bool = False,
        attempt: str = "",
        node_grace_s: float = ...,
    ) -> None: ...

    def untrack(self, job_uid: str) -> None: ...

    def keep_only(self, job_uids: set[str]) -> None: ...


@dataclass
class _Job:
    uid: str
    revision: int = 0  # newest revision received
    applied: bool = False  # this agent acknowledged an Apply of this job
    deleted: bool = False
    pending: WorkItem | None = None
    orphans: list[dict[str, Any]] | None = None  # queued orphan deletion (no hub job)
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class WorkManager:
    """Serial per-job processing of work items and desired sets (see module docstring).

    ``origin``: the hub's origin (``--origin``), the only one whose objects this agent touches;
    ``member``: this member's name, for the messages of ownership conflicts; ``guard``: the
    hub epoch and held jobs (:class:`gpufed.agent.held.EpochGuard`; its grace period is the
    agent's ``--eviction-grace-period``); ``forbidden``: how long a Forbidden on one job's
    apply or delete is retried before it is a refusal (:class:`gpufed.sync.retry.ForbiddenGrace`
    of ``--forbidden-retry-period``; default 60 s); ``pods``: where a deleted copy's pods on
    Nodes that no longer exist are force-deleted (:mod:`gpufed.agent.stranded`; None: never).
    """

    def __init__(
        self,
        client: WorkClient,
        *,
        ack: Callable[[WorkAck], None],
        status: StatusTracker,
        allowed_kinds: Iterable[str] = DEFAULT_ALLOWED_KINDS,
        metrics: AgentMetrics | None = None,
        origin: str = DEFAULT_ORIGIN,
        member: str = "",
        guard: EpochGuard | None = None,
        forbidden: ForbiddenGrace | None = None,
        pods: PodClient | None = None,
    ) -> None:
        self._client = client
        self._pods = pods
        # a 403 is retried for a while before the job is refused (a member API server that
        # just restarted forbids everything until its RBAC authorizer has listed: issue 26)
        self._forbidden = forbidden or ForbiddenGrace(FORBIDDEN_GRACE_S)
        self.guard = guard or EpochGuard()
        self.origin = origin
        self.member = member
        self._ack = ack
        self._status = status
        # a ComputeDomain is only ever one the hub rendered for the job (never a user's: the
        # hub's allow-list refuses the kind in templates), so the agent may always apply it
        self.allowed_kinds = frozenset(allowed_kinds) | {COMPUTE_DOMAIN_KIND}
        self._metrics = metrics
        self._jobs: dict[str, _Job] = {}
        # Namespaces this agent saw exist: most jobs land in a namespace used before, so the
        # apply skips reading it again (a 404 on the first create re-creates it).
        self._namespaces: set[str] = set()
        self._desired: dict[str, WorkItem] = {}
        self._session_uids: set[str] = set()
        self._gc_task: asyncio.Task[None] | None = None
        self._evict_task: asyncio.Task[None] | None = None

    # --- input from the hub stream -------------------------------------------------------------

    def set_ack(self, ack: Callable[[WorkAck], None]) -> None:
        """Where acks go (the current stream)."""
        self._ack = ack

    def connected(self, hub_epoch: str = "") -> None:
        """A new session was welcomed by a hub whose state epoch is ``hub_epoch``: a desired set
        follows. Under a new epoch the revisions received before compare with nothing (a fresh
        etcd counts from 1 again), so they are forgotten."""
        self._desired = {}
        self._session_uids = set()
        if self.guard.welcome(hub_epoch):
            for job in self._jobs.values():
                job.revision = 0

    async def held_jobs(self) -> list[HeldJob]:
        """The jobs of this origin whose objects exist in the member (for the Hello); empty
        when the member cannot be listed now (logged: the hub then rebuilds from GPUJob status
        alone)."""
        try:
            return held_jobs(await self._list_labelled(origin_selector(self.origin)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("work.held.list_failed", reason=api_error_message(exc))
            return []

    def disconnected(self) -> None:
        """The stream is gone: drop queued work (the hub re-sends it in its next desired set);
        work already under way finishes, its ack is lost and re-sent on reconcile."""
        for job in self._jobs.values():
            job.pending = None
            job.orphans = None
        for task in (self._gc_task, self._evict_task):
            if task is not None:
                task.cancel()
        self._gc_task = self._evict_task = None

    def submit(self, item: WorkItem) -> None:
        """Queue one work item on its job's worker (older revisions are ignored)."""
        job = self._jobs.setdefault(item.job_uid, _Job(uid=item.job_uid))
        self._session_uids.add(item.job_uid)
        self.guard.claimed(item.job_uid)
        if item.revision < job.revision:
            log.info(
                "work.item.stale",
                job_uid=item.job_uid,
                revision=item.revision,
                newest=job.revision,
            )
            return
        job.revision = item.revision
        job.pending = item
        self._kick(job)

    def desired_part(self, items: Iterable[WorkItem], *, final: bool) -> None:
        """One part of the hub's desired set; the final part starts the reconcile."""
        for item in items:
            self._desired[item.job_uid] = item
        if final:
            desired, self._desired = self._desired, {}
            log.info("work.reconcile.started", jobs=len(desired))
            for item in desired.values():
                self.submit(item)
            self._prune(set(desired) | self._session_uids)
            self._status.keep_only(set(desired) | self._session_uids)
            self._gc_task = asyncio.create_task(self._collect_orphans(set(desired)))

    def _prune(self, keep: set[str]) -> None:
        """Forget idle jobs the hub no longer has (memory stays bounded by its desired set)."""
        for uid, job in list(self._jobs.items()):
            busy = job.task is not None and not job.task.done()
            if uid not in keep and not busy and job.pending is None and job.orphans is None:
                del self._jobs[uid]

    async def idle(self) -> None:
        """Wait until every queued item and the orphan collection are done (tests, shutdown)."""
        while True:
            tasks = [
                j.task for j in self._jobs.values() if j.task is not None and not j.task.done()
            ]
            if self._gc_task is not None and not self._gc_task.done():
                tasks.append(self._gc_task)
            if not tasks:
                return
            await asyncio.gather(*tasks, return_exceptions=True)

    def job_revision(self, job_uid: str) -> int:
        """Newest revision received for a job (0 when unknown)."""
        job = self._jobs.get(job_uid)
        return job.revision if job else 0

    # --- workers -------------------------------------------------------------------------------

    def _kick(self, job: _Job) -> None:
        if job.task is None or job.task.done():
            job.task = asyncio.create_task(self._drain(job), name=f"work:{job.uid}")

    async def _drain(self, job: _Job) -> None:
        while job.pending is not None or job.orphans is not None:
            if job.pending is not None:
                item, job.pending = job.pending, None
                try:
                    await self._process(job, item)
                except asyncio.CancelledError:
                    raise
                except Exception:  # a bug: report it, keep the worker alive for later revisions
                    log.exception("work.item.crashed", job_uid=job.uid, revision=item.revision)
                    self._send_ack(
                        WorkAck(
                            job_uid=job.uid,
                            revision=item.revision,
                            result="Failed",
                            message="agent error while applying (see agent log)",
                            retryable=True,
                        )
                    )
            elif job.orphans is not None:
                orphans, job.orphans = job.orphans, None
                owner = Owner(self.origin, job.uid)
                await self._delete_owned(owner, [(ref_of(o), o) for o in orphans], reason="orphan")

    async def _process(self, job: _Job, item: WorkItem) -> None:
        if item.op == "Delete":
            await self._delete(job, item)
        else:
            await self._apply(job, item)

    def _send_ack(self, ack: WorkAck) -> None:
        if self._metrics is not None:
            self._metrics.work_acks.labels(result=ack.result).inc()
        self._ack(ack)

    async def _apply(self, job: _Job, item: WorkItem) -> None:
        bound = log.bind(job_uid=item.job_uid, job=item.job, revision=item.revision)
        start = asyncio.get_running_loop().time()
        owner = Owner(self.origin, item.job_uid)
        try:
            manifests = check_manifests(
                item.manifests,
                namespace=item.namespace,
                owner=owner,
                allowed_kinds=self.allowed_kinds,
            )
        except ManifestRefusedError as exc:
            bound.warning("work.apply.refused", reason=str(exc))
            self._send_ack(self._failed(item, str(exc), retryable=False))
            return
        manifests = [stamp(m, self.guard.epoch) for m in manifests]
        main = main_workload(manifests)
        ran_before = item.applied_before or job.applied
        try:
            if ran_before and main is not None and await get_object(self._client, main) is None:
                # Applied once and gone now (deleted in the member, or the member was rebuilt):
                # a job that already ran is never created again.
                bound.warning("work.apply.missing", object=str(main))
                self._status.track(item.job_uid, revision=item.revision, main=main, missing=True)
                return
            ns_checked = ran_before or item.namespace not in self._namespaces
            if ns_checked and not ran_before:
                await ensure_namespace(
                    self._client, item.namespace, item.pod_security, origin=self.origin
                )
                self._namespaces.add(item.namespace)
            results: list[ApplyResult] = []
            for obj in manifests:
                ref = ref_of(obj)
                # Workload objects of a job that ran before are never re-created, even if they
                # vanish between the check above and this call.
                may_create = not (ran_before and ref.kind_group in WORKLOAD_KINDS)
                try:
                    result = await apply_object(
                        self._client, obj, owner=owner, member=self.member, may_create=may_create
                    )
                except Exception as exc:
                    if status_of(exc) != 404 or ns_checked:
                        raise
                    # The namespace this agent saw before is gone (deleted in the member):
                    # create it again, once.
                    ns_checked = True
                    await ensure_namespace(
                        self._client, item.namespace, item.pod_security, origin=self.origin
                    )
                    result = await apply_object(
                        self._client, obj, owner=owner, member=self.member, may_create=may_create
                    )
                results.append(result)
                if result is ApplyResult.MISSING and ref == main:
                    bound.warning("work.apply.missing", object=str(ref))
                    self._status.track(
                        item.job_uid, revision=item.revision, main=main, missing=True
                    )
                    return
        except OwnershipConflictError as exc:
            # Someone else's object: left untouched, the job is told (the hub fails it unless
            # the object is the terminating copy of an earlier job of this hub).
            bound.warning(
                "work.apply.conflict", object=exc.obj, holder=exc.holder.value, reason=str(exc)
            )
            self._send_ack(self._failed(item, str(exc), retryable=exc.retryable))
            return
        except LookupError as exc:  # KindNotServedError: the CRD is not installed in this member
            bound.warning("work.apply.failed", reason=str(exc), retryable=False)
            self._send_ack(self._failed(item, str(exc), retryable=False))
            return
        except Exception as exc:
            verdict = self._forbidden.verdict(item.job_uid, exc)
            if status_of(exc) is None and verdict is Verdict.PERMANENT:
                raise  # not an API error: a bug, handled by the worker
            retryable = not verdict.permanent
            message = self._forbidden_message(item.job_uid, exc)
            bound.warning(
                "work.apply.failed", reason=message, status=status_of(exc), retryable=retryable
            )
            self._send_ack(self._failed(item, message, retryable=retryable))
            return
        self._forbidden.clear(item.job_uid)
        job.applied = True
        job.deleted = False
        self._status.track(
            item.job_uid,
            revision=item.revision,
            main=main,
            attempt=attempt_of(item.manifests),
            node_grace_s=node_not_ready_of(item.manifests),
        )
        if self._metrics is not None:
            self._metrics.apply_seconds.observe(asyncio.get_running_loop().time() - start)
        bound.info("work.applied", outcomes=[r.value for r in results])
        self._send_ack(WorkAck(job_uid=item.job_uid, revision=item.revision, result="Applied"))

    async def _delete(self, job: _Job, item: WorkItem) -> None:
        bound = log.bind(job_uid=item.job_uid, job=item.job, revision=item.revision)
        self._status.untrack(item.job_uid)
        owner = Owner(self.origin, item.job_uid)
        # Objects named by the item are read and checked before deletion; listed objects
        # carry this job's labels already (checked again on the listed copy).
        targets: dict[ObjectRef, dict[str, Any] | None] = {}
        for r in map(ref_of, item.manifests):
            targets[ObjectRef(r.api_version, r.kind, r.namespace or item.namespace, r.name)] = None
        try:
            for obj in await self._list_labelled(owner.selector):
                targets[ref_of(obj)] = obj
            refs = [r for r in targets if r.kind_group in self.allowed_kinds and r.name]
            await self._delete_owned(owner, [(r, targets[r]) for r in refs], reason="hub")
            await self._delete_stranded(owner, item.namespace)
        except LookupError as exc:
            bound.warning("work.delete.failed", reason=str(exc))
            self._send_ack(self._failed(item, str(exc), retryable=False))
            return
        except Exception as exc:
            verdict = self._forbidden.verdict(item.job_uid, exc)
            if status_of(exc) is None and verdict is Verdict.PERMANENT:
                raise  # not an API error: a bug, handled by the worker
            message = self._forbidden_message(item.job_uid, exc)
            retryable = not verdict.permanent
            bound.warning("work.delete.failed", reason=message, retryable=retryable)
            self._send_ack(self._failed(item, message, retryable=retryable))
            return
        self._forbidden.clear(item.job_uid)
        job.deleted = True
        job.applied = False
        bound.info("work.deleted", objects=len(refs))
        self._send_ack(WorkAck(job_uid=item.job_uid, revision=item.revision, result="Deleted"))

    async def _delete_owned(
        self,
        owner: Owner,
        targets: Iterable[tuple[ObjectRef, dict[str, Any] | None]],
        *,
        reason: str,
    ) -> None:
        """Delete each target that is ``owner``'s (``None``: read it first); others are kept."""
        # Workloads first: their pods stop before the ConfigMaps they mount disappear.
        ordered = sorted(targets, key=lambda t: (t[0].kind_group not in WORKLOAD_KINDS, str(t[0])))
        for ref, existing in ordered:
            try:
                result = await delete_owned(self._client, ref, owner=owner, existing=existing)
            except LookupError:
                continue  # kind not served any more: nothing of it can exist
            if result is DeleteResult.DELETED:
                log.info(
                    "work.object.deleted", job_uid=owner.job_uid, object=str(ref), reason=reason
                )
            elif result is DeleteResult.KEPT:
                log.info(
                    "work.object.kept",
                    job_uid=owner.job_uid,
                    object=str(ref),
                    reason="not owned by this job",
                )

    async def _delete_stranded(self, owner: Owner, namespace: str) -> None:
        """Force-delete the copy's pods on Nodes that no longer exist, so that a re-run in this
        member can reuse their names at once (:mod:`gpufed.agent.stranded`). Best effort: on an
        error the member's pod GC removes them later (about 40 s), as it did before."""
        if self._pods is None or not namespace:
            return
        try:
            async for attempt in kube_retry():
                with attempt:
                    names = await force_delete_stranded(self._pods, namespace, owner)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never keeps the copy's Delete from being acked
            fix = (
                " (grant the agent's workload role delete on pods)" if status_of(exc) == 403 else ""
            )
            log.warning(
                "work.stranded.failed",
                job_uid=owner.job_uid,
                reason=api_error_message(exc) + fix,
                exc_info=status_of(exc) is None,
            )
            return
        if names:
            log.info("work.stranded.deleted", job_uid=owner.job_uid, pods=names)

    async def _list_labelled(self, selector: str) -> list[dict[str, Any]]:
        async for attempt in kube_retry():
            with attempt:
                objs = await self._client.list_labelled(self.allowed_kinds, selector)
                # Objects owned by another object (a JobSet's Jobs, a Job's pods) go with their
                # owner; only top-level objects are gpufed's to delete.
                return [o for o in objs if not _controlled(o)]
        raise AssertionError("unreachable")  # pragma: no cover

    async def _collect_orphans(self, desired: set[str]) -> None:
        """Delete objects of this hub's jobs that the hub no longer wants (after a desired set):
        selected by this hub's origin and a job UID, never by the job UID alone; those of
        another hub state epoch are held, and evicted after the grace period
        (:mod:`gpufed.agent.held`)."""
        try:
            labelled = await self._list_labelled(origin_selector(self.origin))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("work.reconcile.list_failed", reason=api_error_message(exc))
            return
        by_job: dict[str, list[dict[str, Any]]] = {}
        present: set[str] = set()
        for obj in labelled:
            uid = job_uid_of(obj)
            present.add(uid)
            if uid and uid not in desired and uid not in self._session_uids:
                by_job.setdefault(uid, []).append(obj)
        self.guard.keep_only(by_job)
        self.guard.present(present)
        orphans = 0
        for uid, objs in sorted(by_job.items()):
            refs = [str(ref_of(o)) for o in objs]
            if not self.guard.may_delete(uid, objs):
                log.warning(
                    "work.orphan.held",
                    job_uid=uid,
                    objects=refs,
                    epoch=self.guard.epoch,
                    evict_in_s=round(self.guard.left_s(uid)),
                )
                continue
            orphans += 1
            log.info("work.orphan.found", job_uid=uid, objects=refs)
            job = self._jobs.setdefault(uid, _Job(uid=uid))
            self._status.untrack(uid)
            job.orphans = objs
            self._kick(job)
        held = self.guard.held
        if self._metrics is not None:
            self._metrics.held_jobs.set(len(held))
        log.info(
            "work.reconcile.finished", jobs=len(desired), orphan_jobs=orphans, held_jobs=len(held)
        )
        if held and (self._evict_task is None or self._evict_task.done()):
            wait = min(self.guard.left_s(uid) for uid in held)
            self._evict_task = asyncio.create_task(self._evict_later(desired, wait))

    async def _evict_later(self, desired: set[str], wait_s: float) -> None:
        """Collect again once the first held job's grace period ends (this session only)."""
        await asyncio.sleep(wait_s + 1.0)
        self._evict_task = None
        await self._collect_orphans(desired)

    def _forbidden_message(self, job_uid: str, exc: BaseException) -> str:
        """The API error's message; for a 403, how long this job has been forbidden and the
        fix once that is past the grace period (a grant the agent lacks)."""
        message = api_error_message(exc)
        since = self._forbidden.forbidden_for(job_uid) if status_of(exc) == 403 else None
        if since is None:
            return message
        if since < self._forbidden.grace_s:
            return f"{message} (forbidden for {since:.0f} s: retried for up to {self._forbidden.grace_s:.0f} s)"
        return (
            f"{message} (forbidden for {since:.0f} s: grant the agent's ServiceAccount this "
            f"right in member {self.member or 'this member'}, see the chart's agent RBAC)"
        )

    @staticmethod
    def _failed(item: WorkItem, message: str, *, retryable: bool) -> WorkAck:
        return WorkAck(
            job_uid=item.job_uid,
            revision=item.revision,
            result="Failed",
            message=message[:4000],
            retryable=retryable,
        )


def _controlled(obj: Mapping[str, Any]) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(r, Mapping) and r.get("controller") for r in refs)
