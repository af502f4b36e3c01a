"""Status mirroring: what the hub writes back to its own API server (GPUJob and MemberCluster
status, Events).

Every component of a leader term reports through one :class:`Mirror`: :meth:`Mirror.set_status`
for a GPUJob's new status (the pure rules that compute it are in :mod:`gpufed.hub.status`),
:meth:`Mirror.member_status` for a MemberCluster's (computed by :mod:`gpufed.hub.members`),
:meth:`Mirror.event` for Events. Writes are coalesced per object by
:class:`gpufed.hub.writer.CoalescingWriter`, which is also their one retry layer: a GPUJob's
placed/dispatched/running steps usually come within a fraction of a second, and written at most
every 250 ms per job they take fewer writes (each write also comes back through every GPUJob
watch); a job reaching a terminal phase is written at once, ahead of the others.

Events are for people, status is state: under load, Events wait for one of two slots (and may
lag) while status writes go first (client-go rate-limits its events too).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import ValidationError

from gpufed.api.gpujob import GPUJobStatus, StatusCondition
from gpufed.api.membercluster import MemberClusterStatus
from gpufed.hub import status as st
from gpufed.hub.state import JobState
from gpufed.hub.term import Term
from gpufed.hub.writer import CoalescingWriter
from gpufed.sync.retry import Verdict, verdict_of


class Mirror:
    """Coalesced status writers and Events of one leader term (see the module docstring).

    ``spawn`` runs an Event's write in the background; ``wall`` is the clock of status times.
    """

    def __init__(
        self,
        term: Term,
    ) -> None:
        self._term = term
        self._event_slots = asyncio.Semaphore(2)
        self.jobs = CoalescingWriter(
            "job-status", self._write_job_status, workers=8, min_interval_s=0.25
        )
        self.members = CoalescingWriter("member-status", self._write_member_status)

    def start(self) -> None:
        """Start the writers' workers."""
        self.jobs.start()
        self.members.start()

    async def stop(self) -> None:
        """Stop the writers (pending values are dropped: the next leader rewrites them)."""
        await self.jobs.stop()
        await self.members.stop()

    def now(self) -> str:
        """The wall clock as an RFC 3339 status time."""
        return st.rfc3339(self._term.wall())

    # --- GPUJobs ---------------------------------------------------------------------------------

    def set_status(self, job: JobState, status: GPUJobStatus) -> None:
        """Make ``status`` the job's status now, and write it soon (at once when terminal: a
        job that ended is what its user waits for, and its GPUs are free)."""
        job.status = status.model_copy(update={"observed_generation": job.obj.metadata.generation})
        payload = job.status.model_dump(by_alias=True, mode="json")
        self.jobs.submit(
            job.uid,
            (job.obj.metadata.namespace, job.obj.metadata.name, payload),
            urgent=st.is_terminal(job.status),
        )

    def forget_job(self, uid: str) -> None:
        """The GPUJob is gone: drop what is pending for it."""
        self.jobs.forget(uid)

    async def _write_job_status(self, uid: str, value: Any) -> None:
        ns, name, payload = value
        try:
            await self._term.kube.patch_job_status(ns, name, payload)
        except Exception as exc:
            gone = verdict_of(exc) is Verdict.GONE
            self._term.metrics.status_writes.labels("job", "gone" if gone else "error").inc()
            raise
        self._term.metrics.status_writes.labels("job", "ok").inc()

    def event(self, job: JobState, type_: str, reason: str, message: str) -> None:
        """Emit a core/v1 Event about the job (in the background, after status writes)."""
        involved = {
            "api_version": job.obj.api_version,
            "kind": job.obj.kind,
            "name": job.obj.metadata.name,
            "namespace": job.obj.metadata.namespace,
            "uid": job.uid,
        }

        async def emit() -> None:
            async with self._event_slots:
                await self._term.kube.emit_event(
                    involved, type_=type_, reason=reason, message=message
                )

        self._term.spawn(emit())

    # --- MemberClusters --------------------------------------------------------------------------

    def member_status(self, name: str, status: MemberClusterStatus) -> None:
        """Write a MemberCluster's status soon (skipped when equal to the last one written)."""
        self.members.submit(name, status.model_dump(by_alias=True, mode="json"))

    def last_member_conditions(self, name: str) -> list[StatusCondition] | None:
        """The conditions of the MemberCluster status this term last wrote (None before the
        first write; empty when it does not read back)."""
        previous = self.members.last_written(name)
        if previous is None:
            return None
        if not isinstance(previous, dict):
            return []
        try:
            return MemberClusterStatus.model_validate(previous).conditions
        except ValidationError:
            return []

    def forget_member(self, name: str) -> None:
        """The MemberCluster is gone: drop what is pending for it."""
        self.members.forget(name)

    async def _write_member_status(self, name: str, payload: Any) -> None:
        try:
            await self._term.kube.patch_member_status(name, payload)
        except Exception as exc:
            if verdict_of(exc) is not Verdict.GONE:
                self._term.metrics.status_writes.labels("member", "error").inc()
            raise
        self._term.metrics.status_writes.labels("member", "ok").inc()
