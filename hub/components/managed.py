"""Managed plain workloads: Jobs and JobSets applied to the hub cluster with ``spec.managedBy:
gpufed.io/hub``, each federated through one GPUJob that this component creates, watches and
deletes, and whose status it writes back into the workload's own status.

Started by :class:`gpufed.hub.components.core.Controller` (one loop per kind of
``HubConfig.managed_kinds`` and one for the GPUJobs it made); the rest of the hub sees only
GPUJobs, so placement, queues, preemption, re-runs, ``gpufed get jobs`` and ``gpufed explain``
treat these jobs like any other. The translation is pure (:mod:`gpufed.hub.rules.managed`).

Per workload (key: kind, namespace, name), one serial reconcile:

1. the workload exists and is managed, no GPUJob of its name: create it
   (:func:`~gpufed.hub.rules.managed.gpujob_for`), unless the workload already finished, or
   already started (its GPUJob was deleted by hand: the Job is marked Failed, never run twice);
2. its GPUJob exists and is its own (controller ``ownerReference`` with the workload's uid):
   write the workload status from the GPUJob status (:func:`~gpufed.hub.rules.managed.
   workload_status`); a later ``metadata.generation`` gets one Warning Event
   ``SpecChangeIgnored`` (the GPUJob's spec is immutable: delete and apply again);
3. a GPUJob made for an earlier workload of the same name: deleted (uid precondition);
4. a GPUJob of that name that gpufed did not make: left alone, a Warning Event
   ``GPUJobNameTaken`` on the workload;
5. the workload is gone: its GPUJob is deleted (with a uid precondition); the hub's finalizer
   then removes the member copy. No garbage collector is needed on the hub cluster.

Only workloads labelled ``gpufed.io/queue`` are listed and watched (the label selector keeps the
hub from decoding every Job of every tenant; MultiKueue asks for its queue-name label alike).
One workload's trouble stays its own: an API error of its reconcile is retried for that
workload alone with a backoff (:data:`RETRY_BASE_S` doubling to :data:`RETRY_CAP_S`), never
ending the leader term; a GPUJob over :data:`MAX_GPUJOB_BYTES`, or one the API server finds too
large, is refused like any invalid spec.

Safety: everything happens in the workload's own namespace; a workload's status is written
only while its ``managedBy`` is ``gpufed.io/hub``; nothing but these GPUJobs is ever created or
deleted. A kind whose resource the hub cluster does not serve (no JobSet CRD) or may not read
(RBAC) logs ``hub.managed.kind_unavailable`` once and is tried again every
:data:`UNAVAILABLE_RETRY_S`; the other kinds go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import defaultdict
from typing import Any

import structlog
from pydantic import ValidationError

from gpufed.api.errors import FieldError
from gpufed.api.gpujob import GPUJobStatus
from gpufed.api.labels import GROUP, MANAGED_KIND_LABEL, QUEUE_LABEL, VERSION
from gpufed.hub.adapters.listwatch import list_watch
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.adapters.store import NotLeaderError, StoreUnavailableError
from gpufed.hub.components.term import Term
from gpufed.hub.rules import managed as rules
from gpufed.hub.rules.status import rfc3339
from gpufed.sync.retry import Backoff, Verdict, verdict_of

log = structlog.get_logger("gpufed.hub.components.managed")

#: Seconds between two tries of a kind the hub cluster does not serve or lets the hub read.
UNAVAILABLE_RETRY_S = 30.0
#: First and longest wait before one workload's failed reconcile is tried again, seconds.
RETRY_BASE_S = 1.0
RETRY_CAP_S = 300.0
#: Seconds between two reads of a GPUJob that holds the name a workload's GPUJob needs.
TAKEN_RECHECK_S = 30.0
#: The largest GPUJob (compact JSON) the hub creates for a workload. etcd stores at most
#: 1.5 MiB per object (``--max-request-bytes``); the GPUJob's status and managedFields come on top.
MAX_GPUJOB_BYTES = 1024 * 1024
_GPUJOBS = "gpujobs"
_Key = tuple[str, str, str]  # kind, namespace, name


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _finished(kind: rules.ManagedKind, status: dict[str, Any]) -> bool:
    if kind.kind == "JobSet":
        return bool(status.get("terminalState"))
    return any(
        isinstance(c, dict)
        and c.get("type") in ("Complete", "Failed")
        and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


class ManagedWorkloads:
    """The managed plain workloads of one leader term (see the module docstring)."""

    def __init__(self, term: Term) -> None:
        self._term = term
        self._kinds = [rules.KINDS[k] for k in sorted(term.config.managed_kinds)]
        #: the latest managed workload objects seen
        self._workloads: dict[_Key, dict[str, Any]] = {}
        #: the latest GPUJobs labelled gpufed.io/managed-kind, by (namespace, name)
        self._gpujobs: dict[tuple[str, str], dict[str, Any]] = {}
        #: kinds (and "gpujobs") whose first list is in
        self._listed: set[str] = set()
        self._locks: defaultdict[_Key, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._pending: set[_Key] = set()
        #: the generation last warned about (SpecChangeIgnored), per workload
        self._warned: dict[_Key, str] = {}
        #: GPUJob names (namespace, name) held by a GPUJob gpufed did not make -> the workload
        #: waiting for it (warned once; reconciled again when that GPUJob goes)
        self._taken: dict[tuple[str, str], _Key] = {}
        #: the backoff of a workload whose reconcile failed; keys with a retry queued
        self._backoff: dict[_Key, Backoff] = {}
        self._retrying: set[_Key] = set()
        #: kinds now unavailable -> why (logged once per outage)
        self.unavailable: dict[str, str] = {}

    def loops(self) -> list[Any]:
        """The coroutines to run for the term: one list+watch per kind, one of the GPUJobs."""
        if not self._kinds:
            return []
        return [self._watch_gpujobs(), *(self._watch_kind(k) for k in self._kinds)]

    # --- list + watch ---------------------------------------------------------------------------

    async def _watch_gpujobs(self) -> None:
        kube = self._term.kube
        selector = MANAGED_KIND_LABEL
        await list_watch(
            "gpujobs (managed)",
            lambda: kube.list_resource(GROUP, VERSION, _GPUJOBS, label_selector=selector),
            lambda rv: kube.watch_resource(GROUP, VERSION, _GPUJOBS, rv, label_selector=selector),
            on_listed=self._gpujobs_listed,
            on_event=self._gpujob_event,
        )

    async def _watch_kind(self, kind: rules.ManagedKind) -> None:
        kube = self._term.kube
        # Only opted-in workloads reach the hub: the API server filters by the queue label, so
        # no tenant's other Jobs are decoded here (their size and churn cost the hub nothing).
        selector = QUEUE_LABEL
        while True:
            try:
                await list_watch(
                    kind.plural,
                    lambda: kube.list_resource(
                        kind.group, kind.version, kind.plural, label_selector=selector
                    ),
                    lambda rv: kube.watch_resource(
                        kind.group, kind.version, kind.plural, rv, label_selector=selector
                    ),
                    on_listed=lambda items: self._workloads_listed(kind, items),
                    on_event=lambda ev: self._workload_event(kind, ev),
                )
            except Exception as exc:
                verdict = verdict_of(exc)
                if verdict not in (Verdict.GONE, Verdict.REFUSED):
                    raise
                if kind.kind not in self.unavailable:
                    why = (
                        f"the hub cluster does not serve {kind.plural}.{kind.group} (install "
                        f"the {kind.kind} CRD, or leave {kind.kind} out of --managed-kinds)"
                        if verdict is Verdict.GONE
                        else f"the hub may not list {kind.plural}.{kind.group} (RBAC: the "
                        f"gpufed-hub ClusterRole's rule for {kind.plural})"
                    )
                    self.unavailable[kind.kind] = why
                    log.warning(
                        "hub.managed.kind_unavailable",
                        kind=kind.kind,
                        reason=why,
                        retry_s=UNAVAILABLE_RETRY_S,
                        error=str(exc)[:200],
                    )
                await asyncio.sleep(UNAVAILABLE_RETRY_S)

    def _workloads_listed(self, kind: rules.ManagedKind, items: list[dict[str, Any]]) -> None:
        if self.unavailable.pop(kind.kind, None) is not None:
            log.info("hub.managed.kind_available", kind=kind.kind)
        seen = set()
        for obj in items:
            key = self._remember(kind, obj)
            if key is not None:
                seen.add(key)
        gone = [k for k in self._workloads if k[0] == kind.kind and k not in seen]
        for key in gone:
            del self._workloads[key]
        self._listed.add(kind.kind)
        for key in seen | set(gone) | self._owned_keys(kind):
            self._reconcile_soon(key)

    def _workload_event(self, kind: rules.ManagedKind, ev: WatchEvent) -> None:
        meta = _meta(ev.obj)
        key = (kind.kind, str(meta.get("namespace", "")), str(meta.get("name", "")))
        if ev.type == "DELETED":
            self._workloads.pop(key, None)
        elif self._remember(kind, ev.obj) is None:
            return
        self._reconcile_soon(key)

    def _remember(self, kind: rules.ManagedKind, obj: dict[str, Any]) -> _Key | None:
        """Keep ``obj`` when it is managed by gpufed; its key, else None (and forget it)."""
        meta = _meta(obj)
        key = (kind.kind, str(meta.get("namespace", "")), str(meta.get("name", "")))
        if not rules.is_managed(obj):
            self._workloads.pop(key, None)
            return None
        self._workloads[key] = obj
        return key

    def _gpujobs_listed(self, items: list[dict[str, Any]]) -> None:
        self._gpujobs = {}
        for obj in items:
            meta = _meta(obj)
            self._gpujobs[(str(meta.get("namespace")), str(meta.get("name")))] = obj
        self._listed.add(_GPUJOBS)
        keys = set(self._workloads)
        for kind in self._kinds:
            keys |= self._owned_keys(kind)
        for key in keys:
            self._reconcile_soon(key)

    def _gpujob_event(self, ev: WatchEvent) -> None:
        meta = _meta(ev.obj)
        ns, name = str(meta.get("namespace")), str(meta.get("name"))
        if ev.type == "DELETED":
            self._gpujobs.pop((ns, name), None)
            waiting = self._taken.pop((ns, name), None)
            if waiting is not None:  # the name it waited for is free now
                self._reconcile_soon(waiting)
        else:
            self._gpujobs[(ns, name)] = ev.obj
        owner = rules.owner_of(ev.obj)
        if owner is not None:
            self._reconcile_soon((owner[0].kind, ns, owner[1]))

    def _owned_keys(self, kind: rules.ManagedKind) -> set[_Key]:
        """Keys of the workloads of ``kind`` that the known GPUJobs name as owner."""
        out = set()
        for (ns, _), obj in self._gpujobs.items():
            owner = rules.owner_of(obj)
            if owner is not None and owner[0] == kind:
                out.add((kind.kind, ns, owner[1]))
        return out

    # --- reconcile ------------------------------------------------------------------------------

    def _reconcile_soon(self, key: _Key) -> None:
        if key not in self._pending:
            self._pending.add(key)
            self._term.spawn(self._reconcile(key))

    async def _reconcile(self, key: _Key) -> None:
        lock = self._locks[key]
        async with lock:
            self._pending.discard(key)
            if _GPUJOBS in self._listed and key[0] in self._listed:
                try:
                    await self._step(key)
                except (NotLeaderError, StoreUnavailableError):
                    raise  # the term's own end: not this workload's trouble
                except Exception as exc:
                    # One tenant's workload (an API error, a 429, a bug its content triggers)
                    # must not end the term that serves every member: retry it alone, later.
                    self._retry_later(key, exc)
                else:
                    self._backoff.pop(key, None)
        if key not in self._workloads and not lock.locked() and key not in self._pending:
            self._locks.pop(key, None)
            self._warned.pop(key, None)
            self._backoff.pop(key, None)

    def _retry_later(self, key: _Key, exc: Exception) -> None:
        backoff = self._backoff.setdefault(key, Backoff(RETRY_BASE_S, RETRY_CAP_S))
        wait = backoff.next()
        log.warning(
            "hub.managed.reconcile_failed",
            workload=f"{key[0]} {key[1]}/{key[2]}",
            error=_api_message(exc)[:300],
            retry_in_s=wait,
        )
        if key not in self._retrying:
            self._retrying.add(key)
            self._term.spawn(self._retry_after(key, wait))

    async def _recheck_taken(self, ns: str, gname: str, key: _Key) -> None:
        """Read the GPUJob that holds ``gname`` every :data:`TAKEN_RECHECK_S` until it is gone
        (then reconcile the waiting workload) or the workload stopped waiting. A GPUJob the hub
        did not make carries no managed-kind label, so the GPUJob watch here never sees it go."""
        while self._taken.get((ns, gname)) == key and key in self._workloads:
            await asyncio.sleep(TAKEN_RECHECK_S)
            got = await self._term.kube.get_object(GROUP, VERSION, ns, _GPUJOBS, gname)
            if got is None:
                self._gpujobs.pop((ns, gname), None)
                if self._taken.pop((ns, gname), None) is not None:
                    self._reconcile_soon(key)
                return
            self._gpujobs[(ns, gname)] = got
        if self._taken.get((ns, gname)) == key:
            del self._taken[(ns, gname)]

    async def _retry_after(self, key: _Key, wait: float) -> None:
        await asyncio.sleep(wait)
        self._retrying.discard(key)
        self._reconcile_soon(key)

    async def _step(self, key: _Key) -> None:
        kind_name, ns, name = key
        kind = rules.KINDS[kind_name]
        workload = self._workloads.get(key)
        gname = rules.gpujob_name(kind, name)
        gpujob = self._gpujobs.get((ns, gname))
        owner = rules.owner_of(gpujob) if gpujob is not None else None
        ours = owner is not None and owner[0] == kind and owner[1] == name
        if workload is None:
            if gpujob is not None and ours:
                await self._delete_gpujob(ns, gname, gpujob, why="its workload was deleted")
            return
        uid = str(_meta(workload).get("uid", ""))
        if gpujob is None:
            await self._create(kind, key, workload)
            return
        if not ours:
            if self._taken.get((ns, gname)) != key:
                self._taken[(ns, gname)] = key
                self._term.spawn(self._recheck_taken(ns, gname, key))
                self._event(
                    kind,
                    workload,
                    "GPUJobNameTaken",
                    f"GPUJob {gname} exists and was not made by gpufed for this {kind.kind}; "
                    f"rename the {kind.kind} or delete that GPUJob",
                )
            return
        assert owner is not None
        if owner[2] != uid:
            await self._delete_gpujob(
                ns, gname, gpujob, why="it was made for an earlier workload of this name"
            )
            return
        await self._write_status(kind, key, workload, gpujob.get("status"))
        self._check_generation(kind, key, workload, gpujob)

    async def _create(self, kind: rules.ManagedKind, key: _Key, workload: dict[str, Any]) -> None:
        status = workload.get("status") or {}
        if _finished(kind, status):
            return
        if rules.has_started(kind, status):
            # It ran once and its GPUJob was deleted by hand: do not run it a second time.
            failed = GPUJobStatus(
                phase="Failed", message="its GPUJob was deleted while the job ran"
            )
            await self._write_status(kind, key, workload, failed.model_dump(by_alias=True))
            return
        try:
            body = rules.gpujob_for(workload, kind)
        except FieldError as exc:
            await self._refuse(kind, key, workload, str(exc))
            return
        size = len(json.dumps(body, separators=(",", ":")))
        if size > MAX_GPUJOB_BYTES:
            await self._refuse(
                kind,
                key,
                workload,
                f"its GPUJob would be {size / 2**20:.2f} MiB, over the {MAX_GPUJOB_BYTES // 2**20}"
                f" MiB the hub creates (etcd keeps at most 1.5 MiB per object): move large env "
                f"values, annotations or embedded files into a ConfigMap or Secret",
            )
            return
        ns = key[1]
        self._term.check_fence()
        try:
            created = await self._term.kube.create_object(GROUP, VERSION, ns, _GPUJOBS, body)
        except Exception as exc:
            verdict = verdict_of(exc)
            if verdict is Verdict.RECONCILE:  # 409: the name is taken; read it and decide
                got = await self._term.kube.get_object(
                    GROUP, VERSION, ns, _GPUJOBS, body["metadata"]["name"]
                )
                if got is not None:
                    self._gpujobs[(ns, body["metadata"]["name"])] = got
                    self._reconcile_soon(key)
                return
            if verdict in (Verdict.REFUSED, Verdict.PERMANENT) or _too_large(exc):
                # 400/403/422, another 4xx (413), or etcd's "request is too large" (answered
                # as a 500): this GPUJob is refused, and would be on every try
                await self._refuse(kind, key, workload, _api_message(exc))
                return
            raise
        self._gpujobs[(ns, body["metadata"]["name"])] = created
        log.info(
            "hub.managed.gpujob_created",
            workload=f"{kind.kind} {ns}/{key[2]}",
            gpujob=body["metadata"]["name"],
        )
        self._event(
            kind, workload, "GPUJobCreated", f"federated as GPUJob {ns}/{body['metadata']['name']}"
        )

    async def _refuse(
        self, kind: rules.ManagedKind, key: _Key, workload: dict[str, Any], message: str
    ) -> None:
        """The workload cannot become a GPUJob: a Warning Event and a Failed status."""
        log.info("hub.managed.refused", workload=f"{kind.kind} {key[1]}/{key[2]}", error=message)
        self._event(kind, workload, "InvalidSpec", message)
        failed = GPUJobStatus(phase="Failed", message=message)
        await self._write_status(kind, key, workload, failed.model_dump(by_alias=True))

    async def _delete_gpujob(self, ns: str, name: str, gpujob: dict[str, Any], *, why: str) -> None:
        if _meta(gpujob).get("deletionTimestamp"):
            return  # deleting already: the hub's finalizer removes the member copy first
        self._term.check_fence()
        try:
            await self._term.kube.delete_object(
                GROUP, VERSION, ns, _GPUJOBS, name, str(_meta(gpujob).get("uid", ""))
            )
        except Exception as exc:
            if verdict_of(exc) is not Verdict.RECONCILE:  # 409: another object now: leave it
                raise
        log.info("hub.managed.gpujob_deleted", gpujob=f"{ns}/{name}", reason=why)

    async def _write_status(
        self,
        kind: rules.ManagedKind,
        key: _Key,
        workload: dict[str, Any],
        raw_status: Any,
    ) -> None:
        if not rules.is_managed(workload):
            return  # never write the status of a workload gpufed does not manage
        try:
            gs = GPUJobStatus.model_validate(raw_status) if raw_status else None
        except ValidationError as exc:
            log.warning("hub.managed.status_unreadable", workload=key, error=str(exc)[:200])
            return
        current = workload.get("status") or {}
        desired = rules.workload_status(kind, gs, current, now=rfc3339(self._term.wall()))
        if desired == current:
            return
        meta = _meta(workload)
        self._term.check_fence()
        try:
            rv = await self._term.kube.replace_status(
                kind.group,
                kind.version,
                key[1],
                kind.plural,
                key[2],
                desired,
                str(meta.get("resourceVersion", "")),
            )
        except Exception as exc:
            verdict = verdict_of(exc)
            if verdict is Verdict.RECONCILE:  # changed meanwhile: read it, try again
                got = await self._term.kube.get_object(
                    kind.group, kind.version, key[1], kind.plural, key[2]
                )
                if got is not None and self._remember(kind, got) is not None:
                    self._reconcile_soon(key)
                return
            if verdict in (Verdict.GONE, Verdict.REFUSED, Verdict.PERMANENT) or _too_large(exc):
                log.warning(
                    "hub.managed.status_refused",
                    workload=f"{kind.kind} {key[1]}/{key[2]}",
                    error=_api_message(exc),
                )
                return
            raise
        updated = {**workload, "metadata": {**meta, "resourceVersion": rv}, "status": desired}
        if self._workloads.get(key) is workload:
            self._workloads[key] = updated

    def _check_generation(
        self,
        kind: rules.ManagedKind,
        key: _Key,
        workload: dict[str, Any],
        gpujob: dict[str, Any],
    ) -> None:
        generation = str(_meta(workload).get("generation") or 1)
        made = str((_meta(gpujob).get("annotations") or {}).get(rules.GENERATION_ANNOTATION, "1"))
        if generation == made or self._warned.get(key) == generation:
            return
        self._warned[key] = generation
        self._event(
            kind,
            workload,
            "SpecChangeIgnored",
            f"the spec changed (generation {generation}) after GPUJob {_meta(gpujob).get('name')} "
            f"was made from generation {made}; the federated job keeps running as made: delete "
            f"the {kind.kind} and apply it again to run the new spec",
        )

    def _event(
        self, kind: rules.ManagedKind, workload: dict[str, Any], reason: str, message: str
    ) -> None:
        meta = _meta(workload)
        involved = {
            "api_version": kind.api_version,
            "kind": kind.kind,
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        }
        type_ = "Normal" if reason == "GPUJobCreated" else "Warning"
        with contextlib.suppress(Exception):
            self._term.spawn(
                self._term.kube.emit_event(involved, type_=type_, reason=reason, message=message)
            )


def _too_large(exc: Exception) -> bool:
    """The API server's answer when etcd refuses an object over its request limit: a 413, or a
    500 "etcdserver: request is too large" (kubernetes/kubernetes#112152)."""
    status = getattr(exc, "status", None)
    return status == 413 or (status == 500 and "request is too large" in _api_message(exc))


def _api_message(exc: Exception) -> str:
    """The API server's message of an ``ApiException`` (its JSON body), else ``str(exc)``."""
    body = getattr(exc, "body", None)
    try:
        return str(json.loads(body)["message"])[:1024] if body else str(exc)[:1024]
    except (ValueError, KeyError, TypeError):
        return str(exc)[:1024]
