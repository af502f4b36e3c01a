"""Typed in-memory fakes of a leader term's two ports (gpufed.hub.adapters.ports) and its clocks.

``FakeStore`` keeps etcd's semantics that the hub relies on (one revision counter, the
placement transaction's create-or-revision guard); ``FakeHubAPI`` serves lists and watches
from memory and records every write. Both satisfy the Protocols under mypy, so tests build a
real :class:`~gpufed.hub.components.core.Controller` over them and drive it through public methods only.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import copy
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufed.api.inventory import NodeInventory
from gpufed.hub.adapters.ports import HubAPI, StateStore, WatchEvent
from gpufed.hub.adapters.store import ConflictError
from gpufed.hub.rules.records import (
    AckRecord,
    FairShareRecord,
    JobRecord,
    Loaded,
    MemberMeta,
    RecentNodesRecord,
    WorkRecord,
)


@dataclass
class TermClock:
    """Monotonic and wall seconds that move only when a test says so."""

    mono_s: float = 1_000.0
    wall_s: float = 1_767_225_600.0  # 2026-01-01T00:00:00Z

    def mono(self) -> float:
        return self.mono_s

    def wall(self) -> float:
        return self.wall_s

    def advance(self, seconds: float) -> None:
        self.mono_s += seconds
        self.wall_s += seconds


@dataclass
class FakeStore:
    """etcd as the hub uses it; ``calls`` names every write in order."""

    revision: int = 0
    jobs: dict[str, tuple[JobRecord, int]] = field(default_factory=dict)
    work: dict[tuple[str, str], tuple[WorkRecord, int]] = field(default_factory=dict)
    acks: dict[tuple[str, str], AckRecord] = field(default_factory=dict)
    reservations: dict[str, str] = field(default_factory=dict)
    metas: list[tuple[str, MemberMeta]] = field(default_factory=list)
    nodes: dict[str, dict[str, NodeInventory]] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    #: placements that fail with ConflictError before touching anything (job uids)
    conflict_on_place: set[str] = field(default_factory=set)
    #: the ``epoch`` key (None: a new or wiped state)
    epoch_id: str | None = None
    #: the ``fairshare`` key
    fair_share: FairShareRecord | None = None
    #: the ``recentnodes`` key
    recent_nodes: RecentNodesRecord | None = None

    def _next(self) -> int:
        self.revision += 1
        return self.revision

    async def load(self) -> Loaded:
        return Loaded(
            jobs={u: r for u, (r, _) in self.jobs.items()},
            job_revisions={u: rev for u, (_, rev) in self.jobs.items()},
            work=dict(self.work),
            acks=dict(self.acks),
            reservations=dict(self.reservations),
            members={c: m for c, m in self.metas},
            nodes={c: dict(n) for c, n in self.nodes.items()},
            epoch_id=self.epoch_id,
            fair_share=self.fair_share,
            recent_nodes=self.recent_nodes,
        )

    async def place(
        self,
        job: JobRecord,
        work: WorkRecord,
        reservation_json: str,
        *,
        expect_job_revision: int | None,
    ) -> tuple[int, int]:
        self.calls.append("place")
        current = self.jobs.get(job.uid)
        if job.uid in self.conflict_on_place or (
            (current is not None)
            if expect_job_revision is None
            else (current is None or current[1] != expect_job_revision)
        ):
            raise ConflictError(f"job {job.uid} was placed by someone else")
        assert job.cluster is not None
        rev = self._next()
        self.jobs[job.uid] = (job, rev)
        self.work[(job.cluster, job.uid)] = (work, rev)
        self.reservations[job.uid] = reservation_json
        return rev, rev

    async def preempt(
        self, hold_uid: str, hold_json: str, victims: Sequence[tuple[JobRecord, int]]
    ) -> int:
        self.calls.append("preempt")
        for rec, rev in victims:
            current = self.jobs.get(rec.uid)
            if current is None or current[1] != rev:
                raise ConflictError(f"job record {rec.uid} changed")
        rev = self._next()
        self.reservations[hold_uid] = hold_json
        for rec, _ in victims:
            self.jobs[rec.uid] = (rec, rev)
        return rev

    async def adopt(
        self,
        job: JobRecord,
        work: WorkRecord,
        ack: AckRecord | None,
        *,
        expect_job_revision: int | None,
    ) -> tuple[int, int]:
        self.calls.append("adopt")
        current = self.jobs.get(job.uid)
        if (
            (current is not None)
            if expect_job_revision is None
            else (current is None or current[1] != expect_job_revision)
        ):
            raise ConflictError(f"job {job.uid} was recorded by someone else")
        assert job.cluster is not None
        rev = self._next()
        self.jobs[job.uid] = (job, rev)
        self.work[(job.cluster, job.uid)] = (work, rev)
        if ack is not None:
            self.acks[(job.cluster, job.uid)] = ack
        return rev, rev

    async def ensure_epoch(self, new_id: str) -> str:
        self.calls.append("ensure_epoch")
        if self.epoch_id is None:
            self.epoch_id = new_id
        return f"{self.epoch_id}.0"

    async def put_job(self, job: JobRecord, *, expect_revision: int) -> int:
        self.calls.append("put_job")
        current = self.jobs.get(job.uid)
        if current is None or current[1] != expect_revision:
            raise ConflictError(f"job record {job.uid} changed")
        rev = self._next()
        self.jobs[job.uid] = (job, rev)
        return rev

    async def get_job(self, job_uid: str) -> tuple[JobRecord, int] | None:
        return self.jobs.get(job_uid)

    async def forget_job(self, job_uid: str) -> None:
        self.calls.append("forget_job")
        self.jobs.pop(job_uid, None)

    async def put_work(self, cluster: str, record: WorkRecord) -> int:
        self.calls.append("put_work")
        rev = self._next()
        self.work[(cluster, record.job_uid)] = (record, rev)
        return rev

    async def get_work(self, cluster: str, job_uid: str) -> tuple[WorkRecord, int] | None:
        return self.work.get((cluster, job_uid))

    async def put_ack(self, cluster: str, job_uid: str, ack: AckRecord) -> None:
        self.calls.append("put_ack")
        self.acks[(cluster, job_uid)] = ack

    async def put_fair_share(self, record: FairShareRecord) -> None:
        self.calls.append("put_fair_share")
        self.fair_share = record

    async def put_recent_nodes(self, record: RecentNodesRecord) -> None:
        self.calls.append("put_recent_nodes")
        self.recent_nodes = record

    async def forget_work(self, cluster: str, job_uid: str) -> None:
        self.calls.append("forget_work")
        self.work.pop((cluster, job_uid), None)
        self.acks.pop((cluster, job_uid), None)

    async def put_reservations(self, entries: dict[str, str]) -> None:
        self.calls.append("put_reservations")
        self.reservations.update(entries)

    async def delete_reservations(self, job_uids: Iterable[str]) -> None:
        self.calls.append("delete_reservations")
        for uid in job_uids:
            self.reservations.pop(uid, None)

    async def put_member_meta(self, cluster: str, meta: MemberMeta) -> None:
        self.calls.append("put_member_meta")
        self.metas.append((cluster, meta))

    async def write_nodes(
        self, cluster: str, nodes: Mapping[str, NodeInventory], changed: Iterable[str]
    ) -> None:
        self.calls.append("write_nodes")
        stored = self.nodes.setdefault(cluster, {})
        for name in changed:
            if name in nodes:
                stored[name] = nodes[name]
            else:
                stored.pop(name, None)


@dataclass
class FakeHubAPI:
    """The hub API server in memory: ``objects[plural]`` are listed (``namespaces`` are also
    read one by one); ``watch_events[plural]`` feeds watches (a watch waits for more until
    cancelled); writes are recorded.

    Status writes keep the API server's optimistic concurrency: every object has a
    ``metadata.resourceVersion`` from one counter, a status patch at another one fails with
    :class:`ApiConflictError` (409). ``secrets[namespace]`` are the labelled join-token Secrets
    (JSON form); ``secret_events[namespace]`` feeds their watch; ``requests`` counts every
    call by name (to pin that a path makes none)."""

    objects: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {
            "gpujobs": [],
            "memberclusters": [],
            "namespaces": [],
            "gpuqueues": [],
            "priorityclasses": [],
        }
    )
    watch_events: dict[str, asyncio.Queue[WatchEvent]] = field(default_factory=dict)
    secrets: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    secret_events: dict[str, asyncio.Queue[WatchEvent]] = field(default_factory=dict)
    #: namespaces whose Secret list fails with 403 (no Role there)
    forbidden_namespaces: set[str] = field(default_factory=set)
    job_statuses: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    member_statuses: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    queue_statuses: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    #: (involved kind, involved uid, type, reason) of each Event, in order
    event_refs: list[tuple[str, str, str, str]] = field(default_factory=list)
    finalizer_writes: list[tuple[str, str, list[str]]] = field(default_factory=list)
    listed: dict[str, int] = field(default_factory=dict)
    requests: collections.Counter[str] = field(default_factory=collections.Counter)
    revision: int = 100
    #: plurals whose list fails with 404 (a CRD not installed)
    unserved: set[str] = field(default_factory=set)
    #: (plural, namespace, name) of each create_object / delete_object, and each replace_status
    created: list[tuple[str, str, str]] = field(default_factory=list)
    deleted: list[tuple[str, str, str]] = field(default_factory=list)
    statuses: list[tuple[str, str, str, dict[str, Any]]] = field(default_factory=list)

    def bump(self, obj: dict[str, Any]) -> str:
        """Give ``obj`` a new resourceVersion (as every write on the API server does)."""
        self.revision += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.revision)
        return str(self.revision)

    def _find(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        for obj in self.objects.get(plural, []):
            meta = obj["metadata"]
            if meta["name"] == name and meta.get("namespace") == namespace:
                return obj
        return None

    def _write_status(
        self, plural: str, namespace: str | None, name: str, status: dict[str, Any], rv: str
    ) -> str:
        obj = self._find(plural, namespace, name)
        if obj is None:
            return rv  # objects a test did not list: recorded only
        current = str(obj["metadata"].get("resourceVersion", ""))
        if current and rv != current:
            raise ApiConflictError(f"{plural} {name}: resourceVersion {rv} is not {current}")
        obj["status"] = status
        return self.bump(obj)

    #: names of the Namespaces read one by one (intake's read for a namespace not seen yet)
    namespace_reads: list[str] = field(default_factory=list)

    async def list_objects(self, plural: str) -> tuple[list[dict[str, Any]], str]:
        self.requests["list_objects"] += 1
        self.listed[plural] = self.listed.get(plural, 0) + 1
        return list(self.objects.get(plural, [])), "1"

    async def watch_objects(
        self, plural: str, resource_version: str, *, timeout_s: int = 300
    ) -> AsyncIterator[WatchEvent | str]:
        queue = self.watch_events.setdefault(plural, asyncio.Queue())
        while True:
            yield await queue.get()

    async def patch_job_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> str:
        self.requests["patch_job_status"] += 1
        rv = self._write_status("gpujobs", namespace, name, status, resource_version)
        self.job_statuses.append((namespace, name, status))
        return rv

    async def set_job_finalizers(
        self, namespace: str, name: str, finalizers: list[str], resource_version: str
    ) -> dict[str, Any]:
        self.requests["set_job_finalizers"] += 1
        self.finalizer_writes.append((namespace, name, finalizers))
        obj = self._find("gpujobs", namespace, name)
        if obj is None:
            raise LookupError(f"no GPUJob {namespace}/{name}")
        obj["metadata"]["finalizers"] = list(finalizers)
        self.bump(obj)
        return obj

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.requests["get_job"] += 1
        return self._find("gpujobs", namespace, name)

    async def get_member(self, name: str) -> dict[str, Any] | None:
        self.requests["get_member"] += 1
        return self._find("memberclusters", None, name) or {
            "metadata": {"name": name, "resourceVersion": "1"}
        }

    async def get_namespace(self, name: str) -> dict[str, Any] | None:
        self.requests["get_namespace"] += 1
        self.namespace_reads.append(name)
        return self._find("namespaces", None, name)

    async def patch_member_status(
        self, name: str, status: dict[str, Any], resource_version: str
    ) -> str:
        self.requests["patch_member_status"] += 1
        rv = self._write_status("memberclusters", None, name, status, resource_version)
        self.member_statuses.append((name, status))
        return rv

    async def get_queue(self, name: str) -> dict[str, Any] | None:
        self.requests["get_queue"] += 1
        return self._find("gpuqueues", None, name)

    async def patch_queue_status(
        self, name: str, status: dict[str, Any], resource_version: str
    ) -> str:
        self.requests["patch_queue_status"] += 1
        rv = self._write_status("gpuqueues", None, name, status, resource_version)
        self.queue_statuses.append((name, status))
        return rv

    async def list_secrets(
        self, namespace: str, label_selector: str
    ) -> tuple[list[dict[str, Any]], str]:
        self.requests["list_secrets"] += 1
        if namespace in self.forbidden_namespaces:
            raise ApiForbiddenError(f"secrets is forbidden in namespace {namespace}")
        return list(self.secrets.get(namespace, [])), "1"

    async def watch_secrets(
        self, namespace: str, resource_version: str, label_selector: str, *, timeout_s: int = 300
    ) -> AsyncIterator[WatchEvent | str]:
        queue = self.secret_events.setdefault(namespace, asyncio.Queue())
        while True:
            yield await queue.get()

    async def list_resource(
        self, group: str, version: str, plural: str, *, label_selector: str = ""
    ) -> tuple[list[dict[str, Any]], str]:
        """``objects[plural]`` (a selector is one label key that must be present)."""
        self.requests["list_resource"] += 1
        if plural in self.unserved:
            raise ApiNotFoundError(f"the server could not find the requested resource {plural}")
        items = self.objects.get(plural, [])
        if label_selector:
            items = [o for o in items if label_selector in (o["metadata"].get("labels") or {})]
        return list(items), "1"

    async def watch_resource(
        self,
        group: str,
        version: str,
        plural: str,
        resource_version: str,
        *,
        label_selector: str = "",
        timeout_s: int = 300,
    ) -> AsyncIterator[WatchEvent | str]:
        queue = self.watch_events.setdefault(f"{plural}/{label_selector}", asyncio.Queue())
        while True:
            yield await queue.get()

    async def get_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> dict[str, Any] | None:
        self.requests["get_object"] += 1
        return self._find(plural, namespace, name)

    async def create_object(
        self, group: str, version: str, namespace: str, plural: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        self.requests["create_object"] += 1
        if self._find(plural, namespace, body["metadata"]["name"]) is not None:
            raise ApiConflictError(f"{plural} {body['metadata']['name']} already exists")
        obj = copy.deepcopy(body)
        self.revision += 1
        obj["metadata"].update(namespace=namespace, uid=f"uid-{self.revision}")
        self.bump(obj)
        self.objects.setdefault(plural, []).append(obj)
        self.created.append((plural, namespace, obj["metadata"]["name"]))
        return obj

    async def delete_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, uid: str
    ) -> bool:
        self.requests["delete_object"] += 1
        obj = self._find(plural, namespace, name)
        if obj is None:
            return False
        if obj["metadata"].get("uid") != uid:
            raise ApiConflictError(f"{plural} {name}: uid precondition failed")
        self.objects[plural].remove(obj)
        self.deleted.append((plural, namespace, name))
        return True

    async def replace_status(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        name: str,
        status: dict[str, Any],
        resource_version: str,
    ) -> str:
        self.requests["replace_status"] += 1
        rv = self._write_status(plural, namespace, name, status, resource_version)
        self.statuses.append((plural, namespace, name, status))
        return rv

    async def emit_event(
        self, involved: dict[str, Any], *, type_: str, reason: str, message: str
    ) -> None:
        self.requests["emit_event"] += 1
        self.events.append((str(involved.get("name")), reason, message))
        self.event_refs.append((str(involved.get("kind")), str(involved.get("uid")), type_, reason))


class ApiConflictError(Exception):
    """409, as the API server answers a write at a stale resourceVersion."""

    status = 409


class ApiForbiddenError(Exception):
    """403, as the API server answers a request RBAC does not allow."""

    status = 403


class ApiNotFoundError(Exception):
    """404, as the API server answers a list of a resource it does not serve (no CRD)."""

    status = 404


def token_secret(name: str, token: str, *, key: str = "token") -> dict[str, Any]:
    """A join-token Secret in JSON form (the value base64, as the API server returns it)."""
    return {
        "metadata": {"name": name, "labels": {"gpufed.io/join-token": "true"}},
        "data": {key: base64.b64encode(token.encode()).decode()},
    }


def _typed(store: FakeStore, kube: FakeHubAPI) -> tuple[StateStore, HubAPI]:
    """mypy checks here that the fakes satisfy the ports."""
    return store, kube
