"""Finalizers: the hub's finalizer on GPUJobs.

A GPUJob that the hub may have placed carries the finalizer ``gpufed.io/member-cleanup``
(:meth:`Finalizers.add_finalizer`): the API server keeps a deleted GPUJob until the hub drops it
(:meth:`Finalizers.drop_finalizer`), which the lifecycle (:mod:`gpufed.hub.components.lifecycle`,
rule 1) does once the agent acknowledged the Delete of its member copy (background propagation
in the member) or the member is declared lost (docs/design.md §7 item 3). Every patch is behind
the leader fence.

Called by the lifecycle.
"""

from __future__ import annotations

import structlog

from gpufed.api.gpujob import GPUJob
from gpufed.api.labels import FINALIZER
from gpufed.hub.components.term import JobState, Term
from gpufed.sync.retry import Verdict, status_of, verdict_of

log = structlog.get_logger("gpufed.hub.components.finalizers")


class Finalizers:
    """The hub's finalizer on the GPUJobs of one leader term (module docstring)."""

    def __init__(self, term: Term) -> None:
        self._term = term

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
