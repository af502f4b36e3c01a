"""Intake: list+watch of GPUJobs, MemberClusters, Namespaces, GPUQueues and PriorityClasses on
the hub cluster, GPUJob validation and admission; each job taken in is handed to the lifecycle
(:mod:`gpufed.hub.components.lifecycle`), which decides what comes next.

Each resource is listed, then watched (:func:`gpufed.hub.adapters.listwatch.list_watch`); objects
missing from a re-list were deleted while unwatched. Transient errors back off; anything else
ends the term, except for GPUQueues: a missing CRD or RBAC rule (404, 403) backs off too and
places nothing meanwhile (:mod:`gpufed.hub.components.queues`), since placing without the quotas could
exceed them; the same for PriorityClasses (:mod:`gpufed.hub.rules.admission`: a 403 without the
RBAC rule places nothing rather than placing at the wrong priorities). A GPUQueue or
PriorityClass change asks for a scheduling cycle.

A new GPUJob is validated once (pod sets, allowed kinds, own namespace, where its priority
comes from: :mod:`gpufed.hub.rules.podsets`, :mod:`gpufed.sync.manifests`,
:mod:`gpufed.hub.rules.admission`) and, unless it was placed already, admitted at its namespace's
Pod Security level (:mod:`gpufed.hub.rules.admission`; :class:`NamespaceLevels`: the value of the
namespace's ``pod-security.kubernetes.io/enforce`` label, :func:`gpufed.sync.podsecurity.parse_level`,
``HubConfig.default_pod_security`` when absent, ``restricted`` when it is not a level); a job in
a namespace the Namespace watch has not shown yet waits for one read of that namespace (the two
watches are not ordered). An
invalid or refused job gets phase Failed, condition ``Valid=False`` naming the field and a
Warning Event, and never reaches a member. Any unexpected error while reading one job marks only
that job invalid: one GPUJob must never stop the leader for every other job. A valid job gets
the finalizer, then waits in the queue (:mod:`gpufed.hub.components.scheduling`). The term's first
GPUJob list sets ``HubState.jobs_listed``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

import structlog
from pydantic import ValidationError

from gpufed.api.errors import FieldError
from gpufed.api.gpujob import GPUJob, GPUJobStatus
from gpufed.api.labels import POD_SECURITY_ENFORCE_LABEL
from gpufed.hub.adapters.listwatch import list_watch
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.components.lifecycle import Lifecycle
from gpufed.hub.components.members import Members
from gpufed.hub.components.mirror import Mirror
from gpufed.hub.components.queues import Queues
from gpufed.hub.components.rebuild import Rebuild
from gpufed.hub.components.term import JobState, Term, claim_of
from gpufed.hub.rules import status as st
from gpufed.hub.rules.admission import AdmissionPolicy, admit, priority_source
from gpufed.hub.rules.podsets import placement_request
from gpufed.sync.manifests import prepare_manifests
from gpufed.sync.podsecurity import Level, parse_level
from gpufed.sync.retry import Backoff, Verdict

log = structlog.get_logger("gpufed.hub.components.intake")

GPUJOBS = "gpujobs"
MEMBERCLUSTERS = "memberclusters"
NAMESPACES = "namespaces"
GPUQUEUES = "gpuqueues"
PRIORITYCLASSES = "priorityclasses"
#: GPUQueue and PriorityClass list errors that back off instead of ending the term (no CRD, no RBAC rule).
_QUEUE_ERRORS = frozenset({Verdict.RETRY, Verdict.REFUSED, Verdict.GONE})


class NamespaceLevels:
    """Namespace name -> Pod Security enforce level (see the module docstring); bounded: one
    short string per namespace (the level, not the object)."""

    def __init__(self, default: Level) -> None:
        self.default = default
        self._levels: dict[str, Level] = {}

    def __len__(self) -> int:
        return len(self._levels)

    def level(self, name: str) -> Level | None:
        """The level of namespace ``name``; None while the hub has not seen it."""
        return self._levels.get(name)

    def seen(self, name: str, labels: Mapping[str, Any] | None) -> Level:
        """Namespace ``name`` exists with ``labels`` (None: it does not exist; its jobs are
        going too, and the default level stands in). Returns its level."""
        value = (labels or {}).get(POD_SECURITY_ENFORCE_LABEL)
        level = parse_level(None if value is None else str(value), self.default)
        if labels is not None:
            self._levels[name] = level
        return level

    def on_event(self, type_: str, obj: Mapping[str, Any]) -> str:
        """A Namespace watch event; returns the namespace's name."""
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if type_ == "DELETED":
            self._levels.pop(name, None)
        else:
            self.seen(name, meta.get("labels") or {})
        return name

    def listed(self, names: Iterable[str]) -> None:
        """After a (re)list: forget namespaces that are gone."""
        present = set(names)
        for name in [n for n in self._levels if n not in present]:
            del self._levels[name]


class Intake:
    """List+watch and GPUJob intake of one leader term (see the module docstring)."""

    def __init__(
        self,
        term: Term,
        members: Members,
        lifecycle: Lifecycle,
        mirror: Mirror,
        rebuild: Rebuild,
        queues: Queues,
    ) -> None:
        self._lifecycle = lifecycle
        self._rebuild = rebuild
        self._term = term
        self._queues = queues
        self._members = members
        self._mirror = mirror
        self._reconciling: set[str] = set()
        self.namespaces = NamespaceLevels(term.config.default_pod_security)
        self._policy = AdmissionPolicy(
            reserved_namespaces=term.config.refused_namespaces,
            allow_exposed_services=term.config.allow_exposed_services,
        )
        #: namespace -> (job uid -> its latest object): new jobs waiting for the namespace's level
        self._awaiting: dict[str, dict[str, GPUJob]] = {}
        #: set once the first MemberCluster list of this term is in (the first GPUJob list:
        #: ``HubState.jobs_listed``)
        self.members_synced = asyncio.Event()

    # --- list + watch --------------------------------------------------------------------------------

    async def list_watch(self, plural: str) -> None:
        """List, then watch ``plural`` (``gpujobs``, ``memberclusters``, ``namespaces``,
        ``gpuqueues`` or ``priorityclasses``) forever (:func:`gpufed.hub.adapters.listwatch.list_watch`)."""
        kube = self._term.kube
        on_error = {
            GPUQUEUES: self._queues.list_failed,
            PRIORITYCLASSES: self._term.state.priorities.list_failed,
        }.get(plural)
        await list_watch(
            plural,
            lambda: kube.list_objects(plural),
            lambda rv: kube.watch_objects(plural, rv),
            on_listed=lambda items: self._listed(plural, items),
            on_event=lambda ev: self._on_event(plural, ev),
            tolerate=_QUEUE_ERRORS if on_error is not None else frozenset({Verdict.RETRY}),
            on_error=on_error,
        )

    def _on_event(self, plural: str, ev: WatchEvent) -> None:
        if plural == GPUQUEUES:
            if self._queues.on_event(ev.type, ev.obj):
                self._term.state.kick()
        elif plural == PRIORITYCLASSES:
            if self._term.state.priorities.on_event(ev.type, ev.obj):
                self._term.state.kick()
        elif plural == MEMBERCLUSTERS:
            self._members.on_event(ev.type, ev.obj)
        elif plural == NAMESPACES:
            name = self.namespaces.on_event(ev.type, ev.obj)
            level = self.namespaces.level(name)
            if level is not None and name in self._awaiting:
                self._admit_waiting(name, level)
        else:
            self.on_job_event(ev)

    def _listed(self, plural: str, items: list[dict[str, Any]]) -> None:
        """After a (re)list: objects we knew that are gone were deleted while unwatched; the
        rest arrive as ADDED."""
        if plural == GPUQUEUES:
            self._queues.listed(items)
            self._term.state.kick()
            return
        if plural == PRIORITYCLASSES:
            self._term.state.priorities.listed(items)
            self._term.state.kick()
            return
        present = (
            {str(o.get("metadata", {}).get("uid")) for o in items} if plural == GPUJOBS else set()
        )
        if plural == GPUJOBS:
            for uid in [u for u in self._term.state.jobs if u not in present]:
                self._lifecycle.job_gone(uid)
            for waiting in self._awaiting.values():
                for uid in [u for u in waiting if u not in present]:
                    del waiting[uid]
        elif plural == NAMESPACES:
            self.namespaces.listed(str(o.get("metadata", {}).get("name")) for o in items)
        else:
            self._members.listed({str(o.get("metadata", {}).get("name")) for o in items})
        for obj in items:
            self._on_event(plural, WatchEvent("ADDED", obj))
        if plural == MEMBERCLUSTERS:
            self.members_synced.set()
        elif plural == GPUJOBS:
            self._lifecycle.sweep_orphans(present)
            self._term.state.jobs_listed.set()

    # --- GPUJobs -------------------------------------------------------------------------------------

    def on_job_event(self, ev: WatchEvent) -> None:
        """A GPUJob watch event (ADDED, MODIFIED, DELETED)."""
        meta = ev.obj.get("metadata", {})
        uid = str(meta.get("uid", ""))
        if ev.type == "DELETED":
            self._awaiting.get(str(meta.get("namespace", "")), {}).pop(uid, None)
            self._lifecycle.job_gone(uid)
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
        job = self._term.state.jobs.get(uid)
        if job is None:
            namespace = obj.metadata.namespace or "default"
            level = self.namespaces.level(namespace)
            if level is None:
                self._await_namespace(namespace, uid, obj)
                return
            job = self._new_job(uid, obj, level)
        else:
            job.obj = obj
        self._reconcile_soon(job)

    # --- the namespace's Pod Security level ----------------------------------------------------------

    def _await_namespace(self, namespace: str, uid: str, obj: GPUJob) -> None:
        """Keep a new job until its namespace's level is known (one read per namespace)."""
        waiting = self._awaiting.setdefault(namespace, {})
        first = not waiting
        waiting[uid] = obj
        if first:
            self._term.spawn(self._read_namespace(namespace))

    async def _read_namespace(self, namespace: str) -> None:
        backoff = Backoff(base=0.2, cap=10.0)
        while self._awaiting.get(namespace):
            try:
                obj = await self._term.kube.get_namespace(namespace)
            except Exception as exc:
                # kube_retry already retried transient errors: say so and try again later
                # (the jobs wait; a missing RBAC rule must not fail them).
                log.warning("hub.namespace.unreadable", namespace=namespace, error=str(exc))
                await asyncio.sleep(backoff.next())
                continue
            labels = obj.get("metadata", {}).get("labels") or {} if obj is not None else None
            self._admit_waiting(namespace, self.namespaces.seen(namespace, labels))
            return
        self._awaiting.pop(namespace, None)

    def _admit_waiting(self, namespace: str, level: Level) -> None:
        for uid, obj in self._awaiting.pop(namespace, {}).items():
            if uid not in self._term.state.jobs:
                self._reconcile_soon(self._new_job(uid, obj, level))

    # --- a new job -----------------------------------------------------------------------------------

    def _new_job(self, uid: str, obj: GPUJob, level: Level) -> JobState:
        status = obj.status or GPUJobStatus()
        job = JobState(
            uid=uid, obj=obj, status=status, seen_mono=self._term.mono(), pod_security=level
        )
        self._lifecycle.adopt(job)
        # No record, or an older one than the status: a lost or restored etcd state
        # (docs/design.md §7 item 7); the placement is adopted in the reconcile, never redone.
        if job.claim is None:
            job.claim = claim_of(job.record, job.status, self._term.state.held_on(job.uid))
        if job.record is not None and job.claim is None:
            placed = job.record.cluster
            if placed is not None and job.status.cluster != placed and not job.terminal:
                # Placed by an earlier hub that stopped before writing the status: say so again.
                log.info("hub.job.placement_restored", job=obj.key, cluster=placed)
                self._mirror.set_status(
                    job,
                    st.resumed(
                        job.status,
                        cluster=placed,
                        gpus=job.record.gpus,
                        now=self._mirror.now(),
                        attempt=job.record.attempt,
                    ),
                )
        created = obj.metadata.creation_timestamp
        submitted = st.parse_rfc3339(created) if created else self._term.wall()
        namespace = obj.metadata.namespace or "default"
        was_placed = job.record is not None or job.claim is not None or job.terminal
        try:
            job.request = placement_request(obj, submitted_at=submitted)
            job.priority = priority_source(obj, placed=was_placed)
            if job.record is not None and job.record.priority is not None:
                # Placed: it keeps the priority it was placed with.
                job.request = job.request.model_copy(
                    update={
                        "priority": job.record.priority,
                        "preemption_policy": job.record.preemption_policy
                        or job.request.preemption_policy,
                    }
                )
            prepared = prepare_manifests(
                obj.spec.template,
                job_uid=uid,
                job_name=obj.metadata.name,
                namespace=namespace,
                origin=self._term.config.origin,
                allowed_kinds=self._term.config.allowed_kinds,
            )
            if not was_placed:
                # Placed jobs are not admitted again: a policy change never fails a running job.
                admit(
                    obj.spec.template,
                    prepared,
                    namespace=namespace,
                    level=level,
                    policy=self._policy,
                )
        except FieldError as exc:
            job.request = None
            job.error, job.error_field = exc.message, exc.field
        except Exception as exc:
            log.exception("hub.job.intake_error", job=obj.key, error=str(exc))
            job.request = None
            job.error, job.error_field = f"the hub cannot read this job: {exc}", "spec"
        self._term.state.jobs[uid] = job
        if job.error is not None and not job.terminal and job.record is None and not job.claim:
            message = f"{job.error_field}: {job.error}"
            self._mirror.invalid(job, job.error_field or "", message)
        return job

    def _reconcile_soon(self, job: JobState) -> None:
        if job.uid not in self._reconciling:
            self._reconciling.add(job.uid)
            self._term.spawn(self._reconcile(job.uid))

    async def _reconcile(self, uid: str) -> None:
        async with self._term.state.lock(uid):
            self._reconciling.discard(uid)
            job = self._term.state.jobs.get(uid)
            if job is None:
                return
            if job.claim is not None:
                # First, so that a deleted job's member copy is cleaned up from the adopted
                # record.
                await self._rebuild.adopt(job)
            await self._lifecycle.reconcile_locked(job)
