"""The two ports of a leader term — its etcd store and the hub cluster's API server — as
Protocols.

:class:`gpufed.hub.adapters.store.Store` and :class:`gpufed.hub.adapters.kube.KubeAPI` implement them; the
components of :mod:`gpufed.hub.components.core` depend only on these, so unit tests run a controller over
typed in-memory fakes (``tests/unit/hub/fakes.py``) instead of patching private attributes.
Errors: the store raises :class:`gpufed.hub.adapters.store.NotLeaderError` (step down),
:class:`~gpufed.hub.adapters.store.StoreUnavailableError` (etcd gone past its retry budget) and
:class:`~gpufed.hub.adapters.store.ConflictError` (a guarded record changed); the API raises the
Kubernetes client's ``ApiException``, which :func:`gpufed.sync.retry.verdict_of` sorts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpufed.api.inventory import NodeInventory
from gpufed.hub.rules.records import (
    AckRecord,
    FairShareRecord,
    JobRecord,
    Loaded,
    MemberMeta,
    RecentNodesRecord,
    WorkRecord,
)


@dataclass(frozen=True)
class WatchEvent:
    """One change of a watched object: ``type`` is ADDED, MODIFIED or DELETED."""

    type: str
    obj: dict[str, Any]


class StateStore(Protocol):
    """The hub's etcd state (key layout: :mod:`gpufed.hub.adapters.store`); every write is guarded by
    this replica's leadership."""

    async def load(self) -> Loaded:
        """Everything a new leader takes over."""
        ...

    async def place(
        self,
        job: JobRecord,
        work: WorkRecord,
        reservation_json: str,
        *,
        expect_job_revision: int | None,
    ) -> tuple[int, int]:
        """Job record, work item and reservation in ONE transaction; returns (work revision,
        job record revision)."""
        ...

    async def preempt(
        self, hold_uid: str, hold_json: str, victims: Sequence[tuple[JobRecord, int]]
    ) -> int:
        """The preemptor's hold and every victim's record (each at its revision) in ONE
        transaction; returns the revision written at (``ConflictError``: a victim changed)."""
        ...

    async def put_job(self, job: JobRecord, *, expect_revision: int) -> int:
        """Update a job record unchanged since ``expect_revision``; returns its revision."""
        ...

    async def adopt(
        self,
        job: JobRecord,
        work: WorkRecord,
        ack: AckRecord | None,
        *,
        expect_job_revision: int | None,
    ) -> tuple[int, int]:
        """Record a placement rebuilt after a loss of state (no reservation); as ``place``."""
        ...

    async def ensure_epoch(self, new_id: str) -> str:
        """The hub state epoch, writing ``new_id`` as its id when absent."""
        ...

    async def get_job(self, job_uid: str) -> tuple[JobRecord, int] | None:
        """One job record and its revision."""
        ...

    async def forget_job(self, job_uid: str) -> None:
        """Delete a job record."""
        ...

    async def put_work(self, cluster: str, record: WorkRecord) -> int:
        """Write a work item; returns its new revision."""
        ...

    async def get_work(self, cluster: str, job_uid: str) -> tuple[WorkRecord, int] | None:
        """One work item and its revision."""
        ...

    async def put_ack(self, cluster: str, job_uid: str, ack: AckRecord) -> None:
        """Write the member's latest ack for a job."""
        ...

    async def put_fair_share(self, record: FairShareRecord) -> None:
        """Replace the queues' decayed usage (key ``fairshare``)."""
        ...

    async def put_recent_nodes(self, record: RecentNodesRecord) -> None:
        """Replace the nodes that left a member or shrank within the hour (key
        ``recentnodes``)."""
        ...

    async def forget_work(self, cluster: str, job_uid: str) -> None:
        """Delete a work item and its ack."""
        ...

    async def put_reservations(self, entries: dict[str, str]) -> None:
        """Write reservation ledger entries (job uid -> JSON)."""
        ...

    async def delete_reservations(self, job_uids: Iterable[str]) -> None:
        """Delete reservation ledger entries."""
        ...

    async def put_member_meta(self, cluster: str, meta: MemberMeta) -> None:
        """Write a member's facts besides nodes."""
        ...

    async def write_nodes(
        self, cluster: str, nodes: Mapping[str, NodeInventory], changed: Iterable[str]
    ) -> None:
        """Persist one member's inventory ``nodes`` (name -> node) after the ``changed`` names
        were upserted or removed."""
        ...


class HubAPI(Protocol):
    """The hub cluster's API server, as the leader uses it (objects are plain dicts)."""

    async def list_objects(self, plural: str) -> tuple[list[dict[str, Any]], str]:
        """Every object of a gpufed resource (``gpujobs``, ``memberclusters``, ``gpuqueues``) or of
        ``namespaces`` or ``priorityclasses`` (``scheduling.k8s.io/v1``, cluster-scoped), and
        the list's resourceVersion."""
        ...

    def watch_objects(
        self, plural: str, resource_version: str, *, timeout_s: int = 300
    ) -> AsyncIterator[WatchEvent | str]:
        """Changes since ``resource_version`` (a ``str`` for a bookmark's resourceVersion);
        ``ApiException`` 410 when it is too old."""
        ...

    async def patch_job_status(
        self, namespace: str, name: str, status: dict[str, Any], resource_version: str
    ) -> str:
        """Merge-patch a GPUJob's status if it is still at ``resource_version`` (409 when it
        changed; the kube adapter lets its own earlier writes of the job through:
        :mod:`gpufed.hub.adapters.ownwrites`); returns the new resourceVersion. One attempt: the
        caller's writer retries."""
        ...

    async def set_job_finalizers(
        self, namespace: str, name: str, finalizers: list[str], resource_version: str
    ) -> dict[str, Any]:
        """Replace a GPUJob's finalizers at ``resource_version`` (409 when it changed; the kube
        adapter lets its own status writes of the job through)."""
        ...

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One GPUJob, or None."""
        ...

    async def get_member(self, name: str) -> dict[str, Any] | None:
        """One MemberCluster, or None."""
        ...

    async def get_namespace(self, name: str) -> dict[str, Any] | None:
        """One Namespace of the hub cluster, or None when it does not exist."""
        ...

    async def patch_member_status(
        self, name: str, status: dict[str, Any], resource_version: str
    ) -> str:
        """Replace a MemberCluster's status if it is still at ``resource_version`` (409 when it
        changed); returns the new resourceVersion. One attempt: the caller's writer retries."""
        ...

    async def get_queue(self, name: str) -> dict[str, Any] | None:
        """One GPUQueue, or None."""
        ...

    async def patch_queue_status(
        self, name: str, status: dict[str, Any], resource_version: str
    ) -> str:
        """Replace a GPUQueue's status if it is still at ``resource_version`` (409 when it
        changed); returns the new resourceVersion. One attempt: the caller's writer retries."""
        ...

    async def list_resource(
        self, group: str, version: str, plural: str, *, label_selector: str = ""
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object of a namespaced resource (all namespaces, ``label_selector``) and the
        list's resourceVersion (``ApiException`` 404: not served, no CRD)."""
        ...

    def watch_resource(
        self,
        group: str,
        version: str,
        plural: str,
        resource_version: str,
        *,
        label_selector: str = "",
        timeout_s: int = 300,
    ) -> AsyncIterator[WatchEvent | str]:
        """Changes of what :meth:`list_resource` lists (as :meth:`watch_objects`)."""
        ...

    async def get_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> dict[str, Any] | None:
        """One namespaced object, or None."""
        ...

    async def create_object(
        self, group: str, version: str, namespace: str, plural: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """Create a namespaced object; returns it (409 when the name is taken)."""
        ...

    async def delete_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, uid: str
    ) -> bool:
        """Delete a namespaced object whose uid is ``uid``; False when it was gone."""
        ...

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
        """Replace a namespaced object's status at ``resource_version`` (409 when it changed);
        returns the new resourceVersion. One attempt."""
        ...

    async def list_secrets(
        self, namespace: str, label_selector: str
    ) -> tuple[list[dict[str, Any]], str]:
        """The Secrets of ``namespace`` matching ``label_selector`` (JSON form: ``data`` values
        base64) and the list's resourceVersion."""
        ...

    def watch_secrets(
        self, namespace: str, resource_version: str, label_selector: str, *, timeout_s: int = 300
    ) -> AsyncIterator[WatchEvent | str]:
        """Changes of those Secrets since ``resource_version`` (as :meth:`watch_objects`)."""
        ...

    async def emit_event(
        self, involved: dict[str, Any], *, type_: str, reason: str, message: str
    ) -> None:
        """Create an Event about ``involved`` (best effort, never raises)."""
        ...
