"""Rebuild: placements recovered from what survives a loss of the hub's etcd state.

A hub whose etcd state was lost (an embedded etcd on an emptyDir) or replaced (a restore from
an old backup) has a new state epoch (``epoch`` key, docs/design.md §10) and lacks, or holds
older, job records. Two things survive it: the GPUJobs on the hub cluster, whose status names
the member and the placement attempt (``status.cluster``, ``status.attempt``), and the agents,
which list the jobs they hold in their Hello (``held_jobs``). This module turns them back into
placements, and deletes nothing while it does (docs/design.md §7 item 7):

- :func:`gpufed.hub.components.term.claim_of` (pure, beside ``JobState.claim`` which it sets)
  decides, per GPUJob at intake, whether a placement must be adopted:
  no record and a status that names a member (or, without one, exactly one agent that holds
  the job), or a record older than the status (a lower attempt, another member);
- :meth:`Rebuild.adopt` records it in one etcd transaction (job record, work item with the
  manifests prepared as the placement pinned them, and an ack marking it applied when the job
  ran), sends the Apply — which the agent answers by adopting the objects that exist and
  re-stamping them with the new epoch, never by re-creating them — and shows the placement
  again. A job being adopted is never placed (``JobState.claim``), and is not admitted again.
  No reservation is written: the member's inventory counts the job's pods;
- a work item of the older record in another member is forgotten, not turned into a Delete:
  that copy is left to its agent's eviction grace period;
- held jobs with no GPUJob on the hub are only logged (``hub.rebuild.unclaimed``) and counted
  (``gpufed_rebuild_unclaimed_held_jobs_total``): their agent evicts them after its grace period.

Called by intake (``adopt`` in the job's reconcile) and by the
controller when an agent's stream opens (:meth:`Rebuild.reported`).
"""

from __future__ import annotations

import structlog

from gpufed.api.errors import FieldError
from gpufed.api.gpujob import Retry
from gpufed.hub.adapters.store import ConflictError
from gpufed.hub.components.dispatch import Dispatch
from gpufed.hub.components.mirror import Mirror
from gpufed.hub.components.scheduling import Scheduler
from gpufed.hub.components.term import Claim, JobState, MemberState, Term, WorkState
from gpufed.hub.rules import status as st
from gpufed.hub.rules.records import AckRecord, JobRecord, WorkRecord
from gpufed.sync.computedomain import ComputeDomainSpec, compute_domain_of
from gpufed.sync.manifests import PodSetPinning, prepare_manifests

log = structlog.get_logger("gpufed.hub.components.rebuild")

#: Phases in which the job's objects were applied in its member (missing objects are then never
#: created again: the job may have run).
_APPLIED_PHASES = frozenset({"Running", "Succeeded", "Failed", "Lost"})


class Rebuild:
    """Adoption of surviving placements in one leader term (see the module docstring)."""

    def __init__(self, term: Term, scheduler: Scheduler, dispatch: Dispatch, mirror: Mirror):
        self._term = term
        self._scheduler = scheduler
        self._dispatch = dispatch
        self._mirror = mirror
        #: a check for held jobs without a GPUJob waits for the term's first GPUJob list
        self._checking = False

    def reported(self, m: MemberState) -> None:
        """An agent's Hello listed what it holds (``m.held``): claim the jobs that no record
        places and no status names; log and count those with no GPUJob on the hub (once the
        term's first GPUJob list is in, ``HubState.jobs_listed``)."""
        jobs_listed = self._term.state.jobs_listed.is_set()
        if not jobs_listed and m.held and not self._checking:
            self._checking = True
            self._term.spawn(self._check_after_list())
        for uid, held in sorted(m.held.items()):
            job = self._term.state.jobs.get(uid)
            if job is None:
                if jobs_listed:
                    self._unclaimed(m.name, uid, held.hub_epoch)
                continue
            if job.record is None and job.claim is None and job.status.cluster is None:
                job.claim = Claim(m.name, 1, "agent")
                self._term.spawn(self._adopt_locked(uid))

    async def _check_after_list(self) -> None:
        await self._term.state.jobs_listed.wait()
        self.check_unclaimed()

    def check_unclaimed(self) -> None:
        """After the term's first GPUJob list: every held job of a connected member that has no
        GPUJob is logged and counted."""
        for m in self._term.state.members.values():
            for uid, held in sorted(m.held.items()):
                if uid not in self._term.state.jobs:
                    self._unclaimed(m.name, uid, held.hub_epoch)

    def _unclaimed(self, cluster: str, uid: str, epoch: str) -> None:
        log.warning("hub.rebuild.unclaimed", cluster=cluster, job_uid=uid, hub_epoch=epoch)
        self._term.metrics.rebuild_unclaimed.labels(cluster).inc()

    async def _adopt_locked(self, uid: str) -> None:
        async with self._term.state.lock(uid):
            job = self._term.state.jobs.get(uid)
            if job is not None:
                await self.adopt(job)

    async def adopt(self, job: JobState) -> None:
        """Record ``job.claim`` as the job's placement (one etcd transaction), then send its
        Apply and show it. Call under the job's lock; a no-op without a claim."""
        claim, job.claim = job.claim, None
        if claim is None:
            return
        uid, ns = job.uid, job.obj.metadata.namespace or "default"
        try:
            manifests = prepare_manifests(
                job.obj.spec.template,
                job_uid=uid,
                job_name=job.obj.metadata.name,
                namespace=ns,
                origin=self._term.config.origin,
                pinning=self._pinning(job, claim.cluster),
                allowed_kinds=self._term.config.allowed_kinds,
                attempt=claim.attempt,
                node_not_ready_s=(job.obj.spec.placement.retry or Retry()).node_not_ready_seconds,
                compute_domain=self._compute_domain(job, claim.cluster),
                time_limit_s=job.obj.spec.placement.time_limit_seconds,
            )
        except FieldError as exc:
            log.warning("hub.rebuild.unpreparable", job=job.key, error=str(exc))
            return
        now = self._term.wall()
        gpus = job.request.gpus if job.request is not None else (job.status.gpus or 0)
        record = JobRecord(
            uid=uid, job=job.key, cluster=claim.cluster, attempt=claim.attempt, placed_at=now,
            gpus=gpus,
        )  # fmt: skip
        work = WorkRecord(
            job_uid=uid, job=job.key, namespace=ns, op="Apply", manifests=tuple(manifests),
            created_at=now, pod_security=job.pod_security,
        )  # fmt: skip
        applied = claim.source == "agent" or claim.cluster in self._term.state.held_on(uid)
        applied = applied or job.status.phase in _APPLIED_PHASES
        # Revision 0: settles nothing, so the Apply (an adopt of what exists) is sent.
        ack = AckRecord(revision=0, result="Applied", applied=True, applied_at=now)
        expect = job.record_rev if job.record is not None else None
        try:
            rev, job_rev = await self._term.store.adopt(
                record, work, ack if applied else None, expect_job_revision=expect
            )
        except ConflictError:
            got = await self._term.store.get_job(uid)
            if got is not None:
                job.record, job.record_rev = got
            log.warning("hub.rebuild.conflict", job=job.key)
            return
        for key in [k for k in self._term.state.work if k[1] == uid and k[0] != claim.cluster]:
            # The older record's copy: forgotten here, left to its agent's eviction grace.
            await self._term.store.forget_work(key[0], uid)
            self._term.state.work.pop(key, None)
            log.warning("hub.rebuild.superseded", job=job.key, cluster=key[0])
        job.record, job.record_rev = record, job_rev
        self._term.state.work[(claim.cluster, uid)] = WorkState(
            claim.cluster, work, rev, ack=ack if applied else None
        )
        self._term.metrics.rebuild_adopted.labels(claim.source).inc()
        log.info(
            "hub.rebuild.adopted",
            job=job.key,
            cluster=claim.cluster,
            attempt=claim.attempt,
            source=claim.source,
            applied=applied,
            revision=rev,
        )
        if not job.terminal and job.status.cluster != claim.cluster:
            self._mirror.set_status(
                job,
                st.resumed(
                    job.status,
                    cluster=claim.cluster,
                    gpus=gpus,
                    now=self._mirror.now(),
                    attempt=claim.attempt,
                ),
            )
        self._dispatch.enqueue(claim.cluster, uid)

    def _compute_domain(self, job: JobState, cluster: str) -> ComputeDomainSpec | None:
        """The ComputeDomain the placement gave the job (``status.placement``), so the adopt
        keeps it; None when it gave none or the status does not say."""
        placement = job.status.placement
        if placement is None or placement.cluster != cluster:
            return None
        return compute_domain_of(st.decision_from_status(job.key, job.uid, placement))

    def _pinning(self, job: JobState, cluster: str) -> dict[str, PodSetPinning] | None:
        """The pinning the placement wrote (``status.placement``), so the adopt applies the same
        manifests; None when the status does not carry the decision."""
        placement = job.status.placement
        if placement is None or placement.cluster != cluster or not placement.pod_sets:
            return None
        return self._scheduler.pinning(st.decision_from_status(job.key, job.uid, placement))
