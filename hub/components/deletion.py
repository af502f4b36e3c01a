"""Deletion: the hub's finalizer on GPUJobs, member cleanup when a GPUJob is deleted, and job
records whose GPUJob is gone (orphans).

A GPUJob that the hub may have placed carries the finalizer ``gpufed.io/member-cleanup``
(:meth:`Deletion.add_finalizer`). When it is deleted, :meth:`Deletion.finalize` turns its work
item into a Delete; the finalizer stays until the agent acknowledges the Delete (background
propagation in the member, :meth:`Deletion.copy_deleted`) or the member is declared lost
(docs/design.md §7 item 3). A GPUJob that vanished without the finalizer's help (deleted before
it landed, or while no hub ran) leaves an orphaned etcd job record: its member copy is deleted
and the record forgotten (:meth:`Deletion.job_gone`, :meth:`Deletion.sweep_orphans`).

Called by intake (watch events), reports (Deleted acks) and members (lost members).
"""

from __future__ import annotations

import structlog

from gpufed.api.gpujob import GPUJob
from gpufed.api.labels import FINALIZER
from gpufed.hub.components.dispatch import Dispatch
from gpufed.hub.components.mirror import Mirror
from gpufed.hub.components.reservations import Reservations
from gpufed.hub.components.state import JobState
from gpufed.hub.components.term import Term
from gpufed.hub.rules.records import JobRecord
from gpufed.sync.retry import Verdict, status_of, verdict_of

log = structlog.get_logger("gpufed.hub.components.deletion")


class Deletion:
    """Finalizers, member cleanup and orphans of one leader term (module docstring)."""

    def __init__(
        self,
        term: Term,
        dispatch: Dispatch,
        reservations: Reservations,
        mirror: Mirror,
    ) -> None:
        self._term = term
        self._dispatch = dispatch
        self._reservations = reservations
        self._mirror = mirror
        #: job records in etcd whose GPUJob this term has not seen (yet): uid -> (record, rev)
        self._orphans: dict[str, tuple[JobRecord, int]] = {}

    # --- job records without a GPUJob ------------------------------------------------------------

    def restore(self, records: dict[str, JobRecord], revisions: dict[str, int]) -> None:
        """Every job record read from etcd is an orphan until its GPUJob is listed."""
        for uid, rec in records.items():
            self._orphans[uid] = (rec, revisions[uid])

    def adopt(self, uid: str) -> tuple[JobRecord, int] | None:
        """The GPUJob of an orphaned record was listed: hand the record back to it."""
        return self._orphans.pop(uid, None)

    def orphan_records(self) -> list[JobRecord]:
        """The job records whose GPUJob this term has not seen (yet): their copies may run."""
        return [rec for rec, _ in self._orphans.values()]

    def job_gone(self, uid: str) -> None:
        """The GPUJob is gone from the hub API (DELETED, or missing from a re-list)."""
        job = self._term.state.jobs.pop(uid, None)
        self._mirror.forget_job(uid)
        if job is None:
            if uid in self._orphans:  # deleted before intake took it in (namespace unknown)
                self._term.spawn(self._cleanup_orphan(uid))
            return
        log.info("hub.job.gone", job=job.key)
        if job.record is not None:
            self._orphans[uid] = (job.record, job.record_rev or 0)
            self._term.spawn(self._cleanup_orphan(uid))
        else:
            self._reservations.release(uid, "job deleted")

    def sweep_orphans(self, listed: set[str]) -> None:
        """After a GPUJob list: delete the member copies of records whose GPUJob is not among
        the ``listed`` UIDs. A listed job counts even before intake has taken it in (it may
        wait for its namespace's Pod Security level): its copy is running, not orphaned."""
        for uid in list(self._orphans):
            if uid not in listed and uid not in self._term.state.jobs:
                self._term.spawn(self._cleanup_orphan(uid))

    async def _cleanup_orphan(self, uid: str) -> None:
        async with self._term.state.lock(uid):
            rec = self._orphans.pop(uid, None)
            if rec is None or uid in self._term.state.jobs:
                return
            record, _ = rec
            log.info("hub.job.orphan_cleanup", job=record.job, cluster=record.cluster)
            if record.cluster is not None:
                await self._dispatch.ensure_delete(record.cluster, uid)
            await self._term.store.forget_job(uid)
            self._reservations.release(uid, "orphaned job record")

    # --- a GPUJob being deleted --------------------------------------------------------------------

    async def finalize(self, job: JobState) -> None:
        """The GPUJob is being deleted: delete its member copy, then drop the finalizer (call
        under the job's lock)."""
        rec = job.record
        if rec is None or rec.cluster is None:
            if rec is not None:
                await self._term.store.forget_job(job.uid)
                job.record = None
            self._reservations.release(job.uid, "job deleted")
            await self.drop_finalizer(job)
            return
        cluster = rec.cluster
        m = self._term.state.members.get(cluster)
        ws = self._term.state.work.get((cluster, job.uid))
        if ws is None or (m is not None and m.lost):
            if ws is not None:
                await self._dispatch.ensure_delete(cluster, job.uid)
            await self._term.store.forget_job(job.uid)
            job.record = None
            self._reservations.release(job.uid, "job deleted")
            await self.drop_finalizer(job)
            return
        await self._dispatch.ensure_delete(cluster, job.uid)

    async def copy_deleted(self, job: JobState) -> None:
        """The member acknowledged the Delete of a job being deleted: forget it, let it go."""
        await self._term.store.forget_job(job.uid)
        job.record = None
        self._reservations.release(job.uid, "job deleted")
        await self.drop_finalizer(job)

    # --- the finalizer ------------------------------------------------------------------------------

    async def add_finalizer(self, uid: str) -> None:
        """Add the finalizer to a GPUJob the hub may place (off the placement path)."""
        job = self._term.state.jobs.get(uid)
        if job is None or job.deleting or FINALIZER in job.obj.metadata.finalizers:
            return
        try:
            await self._patch_finalizers(job, add=True)
        except Exception as exc:
            code = status_of(exc)
            if code is None or not verdict_of(exc).permanent:
                raise
            # The API server refused it for good (e.g. 422: no new finalizers on an object
            # that is being deleted): logged, the job goes on without it.
            log.warning("hub.job.finalizer_refused", job=job.key, status=code, error=str(exc))

    async def drop_finalizer(self, job: JobState) -> None:
        """Remove the finalizer: the hub has nothing left of this job in any member."""
        if FINALIZER in job.obj.metadata.finalizers:
            await self._patch_finalizers(job, add=False)
            log.info("hub.job.deleted", job=job.key)

    async def _patch_finalizers(self, job: JobState, *, add: bool) -> GPUJob | None:
        """Add or remove our finalizer (optimistic concurrency, re-read on 409), behind the
        leader fence like every hub API write (:meth:`gpufed.hub.components.term.Term.check_fence`,
        before the write and before a re-read): a replica that no longer leads drops no
        finalizer, which would let the API server delete a GPUJob whose member copy the new
        leader still has to clean up. Raises ``NotLeaderError`` then (the term ends)."""
        ns, name = job.obj.metadata.namespace or "default", job.obj.metadata.name
        obj = job.obj
        for _ in range(5):
            current = list(obj.metadata.finalizers)
            if add == (FINALIZER in current):
                return obj
            wanted = [*current, FINALIZER] if add else [f for f in current if f != FINALIZER]
            self._term.check_fence()
            try:
                raw = await self._term.kube.set_job_finalizers(
                    ns, name, wanted, obj.metadata.resource_version or ""
                )
            except Exception as exc:
                verdict = verdict_of(exc)
                if verdict is Verdict.GONE:
                    return None
                if verdict is not Verdict.RECONCILE:
                    raise
                self._term.check_fence()
                fresh = await self._term.kube.get_job(ns, name)
                if fresh is None:
                    return None
                obj = GPUJob.model_validate(fresh)
                continue
            obj = GPUJob.model_validate(raw)
            if job.uid in self._term.state.jobs:
                job.obj = obj
            log.info("hub.job.finalizer", job=job.key, added=add)
            return obj
        raise RuntimeError(f"could not update the finalizers of {job.key}: kept conflicting")
