"""Apply strategies for the objects gpufed propagates into a member cluster.

Owns *how* a prepared manifest becomes an object in a member: which kinds are allowed at all,
which are applied with server-side apply (field manager ``gpufed``) and which are create-only
because their spec is immutable once created (a ``batch/v1`` Job), how an existing object is
adopted, how objects are deleted (background propagation) and how a namespace is created.

Called by the agent's work manager (``gpufed.agent.work``) through an :class:`ObjectClient`
that the agent implements over the member's API server; this module talks to no API itself,
so its logic is unit-tested with an in-memory client. Every API call here goes through
:func:`gpufed.sync.retry.kube_retry` (the one retry layer); callers must not retry around it.

Defense in depth (docs/design.md §4): the hub already confines a GPUJob to its namespace and to the
allow-listed kinds; :func:`check_manifests` refuses anything else again on the member side.
"""

from __future__ import annotations

import copy
import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpufed.api.inventory import workload_kind
from gpufed.api.labels import (
    JOB_UID_LABEL,
    MANAGED_NAMESPACE_LABEL,
    POD_SECURITY_ENFORCE_LABEL,
)
from gpufed.sync.manifests import DEFAULT_ALLOWED_KINDS, WORKLOAD_KINDS
from gpufed.sync.retry import Verdict, kube_retry, status_of, verdict_of

#: Field manager of every server-side apply gpufed makes (``metadata.managedFields[].manager``).
FIELD_MANAGER = "gpufed"

# The allow-list and the workload kinds are those of manifest preparation
# (gpufed.sync.manifests): the member enforces the same list the hub prepared against.

#: Kinds whose spec is immutable once created: created once, never updated (re-applying a
#: changed pod template of a Job is rejected by the API server, and a job must never re-run).
CREATE_ONLY_KINDS: frozenset[str] = frozenset({"Job.batch"})


class ApplyStrategy(enum.Enum):
    """How one kind is written to a member."""

    SERVER_SIDE_APPLY = "ServerSideApply"  # PATCH application/apply-patch, force, manager gpufed
    CREATE_ONLY = "CreateOnly"  # POST once; an existing object is adopted, never updated


def strategy_for(kind: str) -> ApplyStrategy:
    """The :class:`ApplyStrategy` of a ``Kind.group`` (``Job.batch`` -> create-only)."""
    return (
        ApplyStrategy.CREATE_ONLY if kind in CREATE_ONLY_KINDS else ApplyStrategy.SERVER_SIDE_APPLY
    )


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """A namespaced object in a member: ``apiVersion``, ``kind``, ``namespace``, ``name``."""

    api_version: str
    kind: str
    namespace: str
    name: str

    @property
    def kind_group(self) -> str:
        """``Kind.group`` (``Job.batch``; core kinds have no group: ``ConfigMap``)."""
        return workload_kind(self.api_version, self.kind)

    def __str__(self) -> str:
        return f"{self.kind_group} {self.namespace}/{self.name}"


def ref_of(obj: Mapping[str, Any]) -> ObjectRef:
    """The :class:`ObjectRef` of a manifest or object (``apiVersion``, ``kind``, metadata)."""
    meta = obj.get("metadata") or {}
    return ObjectRef(
        api_version=str(obj.get("apiVersion", "")),
        kind=str(obj.get("kind", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
    )


class ManifestRefusedError(ValueError):
    """A manifest the agent will not apply; the message names the field and the fix."""


class OwnedElsewhereError(RuntimeError):
    """An object with the wanted name exists but carries another job's UID label.

    Usually the old copy of a deleted and re-created hub job that is still being deleted;
    retrying later may succeed.
    """


class ObjectClient(Protocol):
    """What the apply strategies need from a member API server (the agent implements it).

    Methods raise the client's API exception (anything with an ``int`` ``status``, see
    :mod:`gpufed.sync.retry`) or connection errors; they never retry themselves.
    """

    async def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        """The object, or None when it does not exist (404)."""
        ...

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """POST the object; raises the API error (409 when it exists)."""
        ...

    async def apply(
        self, obj: Mapping[str, Any], *, field_manager: str, force: bool
    ) -> dict[str, Any]:
        """Server-side apply (``PATCH`` with ``application/apply-patch+yaml``)."""
        ...

    async def delete(self, ref: ObjectRef, *, propagation: str) -> bool:
        """DELETE with ``propagationPolicy``; False when the object was already gone."""
        ...

    async def get_namespace(self, name: str) -> dict[str, Any] | None:
        """The Namespace, or None when it does not exist."""
        ...

    async def create_namespace(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """POST a Namespace; raises the API error (409 when it exists)."""
        ...


class ApplyResult(enum.Enum):
    """What :func:`apply_object` did with one object."""

    CREATED = "created"
    APPLIED = "applied"  # server-side applied over an existing or new object
    ADOPTED = "adopted"  # a create-only object already existed with this job's UID
    MISSING = "missing"  # gone, and must not be created again (the job ran before)


# --- validation -----------------------------------------------------------------------------------


def check_manifests(
    manifests: Sequence[Mapping[str, Any]],
    *,
    namespace: str,
    job_uid: str,
    allowed_kinds: Iterable[str] = DEFAULT_ALLOWED_KINDS,
) -> list[dict[str, Any]]:
    """Validate the manifests of one work item and return copies ready to apply.

    Each manifest must have ``apiVersion``, ``kind`` and ``metadata.name``; its ``Kind.group``
    must be in ``allowed_kinds``; ``metadata.namespace`` must equal the work item's
    ``namespace`` (it is filled in when absent); the ``gpufed.io/job-uid`` label must equal
    ``job_uid`` (added when absent). Raises :class:`ManifestRefusedError` naming the manifest and the
    field. The returned list puts supporting objects (ConfigMaps, Secrets, Services) before
    workloads, otherwise keeping the given order.
    """
    allowed = frozenset(allowed_kinds)
    if not namespace:
        raise ManifestRefusedError(
            "work item: namespace is empty; the hub must name the job namespace"
        )
    out: list[dict[str, Any]] = []
    for i, raw in enumerate(manifests):
        where = f"manifests[{i}]"
        if not isinstance(raw, Mapping):
            raise ManifestRefusedError(
                f"{where}: expected a Kubernetes object, got {type(raw).__name__}"
            )
        obj = copy.deepcopy(dict(raw))
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if not isinstance(api_version, str) or not api_version:
            raise ManifestRefusedError(f"{where}.apiVersion: missing (e.g. batch/v1)")
        if not isinstance(kind, str) or not kind:
            raise ManifestRefusedError(f"{where}.kind: missing (e.g. Job)")
        kind_group = workload_kind(api_version, kind)
        if kind_group not in allowed:
            raise ManifestRefusedError(
                f"{where}.kind: {kind_group} is not allowed in a member "
                f"(allowed: {', '.join(sorted(allowed))})"
            )
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ManifestRefusedError(f"{where}.metadata: expected an object")
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise ManifestRefusedError(
                f"{where}.metadata.name: missing; gpufed applies objects by deterministic names"
            )
        where = f"{where} ({kind_group} {name})"
        ns = meta.get("namespace") or namespace
        if ns != namespace:
            raise ManifestRefusedError(
                f"{where}.metadata.namespace: {ns!r} differs from the job namespace "
                f"{namespace!r}; a job may only create objects in its own namespace"
            )
        meta["namespace"] = namespace
        labels = meta.setdefault("labels", {})
        if not isinstance(labels, dict):
            raise ManifestRefusedError(f"{where}.metadata.labels: expected a map of strings")
        have = labels.get(JOB_UID_LABEL)
        if have is not None and have != job_uid:
            raise ManifestRefusedError(
                f"{where}.metadata.labels[{JOB_UID_LABEL}]: {have!r} is not this job's UID "
                f"{job_uid!r}"
            )
        labels[JOB_UID_LABEL] = job_uid
        out.append(obj)
    # Supporting objects first, so a Job never starts before the ConfigMap it mounts.
    return sorted(out, key=lambda o: ref_of(o).kind_group in WORKLOAD_KINDS)


def main_workload(manifests: Sequence[Mapping[str, Any]]) -> ObjectRef | None:
    """The object whose status describes the job: the first workload-kind manifest, else the
    first manifest, else None."""
    refs = [ref_of(m) for m in manifests]
    for ref in refs:
        if ref.kind_group in WORKLOAD_KINDS:
            return ref
    return refs[0] if refs else None


# --- applying -------------------------------------------------------------------------------------


async def ensure_namespace(client: ObjectClient, name: str, pod_security: str = "") -> bool:
    """Create namespace ``name`` labelled ``gpufed.io/managed=true`` unless it exists.

    ``pod_security``: the Pod Security level of the job's hub namespace (``baseline`` …); when
    given, the new namespace also carries it as ``pod-security.kubernetes.io/enforce``, so the
    member's Pod Security Admission enforces what the hub checked. Returns True when this call
    created it. An existing namespace is left as it is (gpufed never relabels a namespace it
    did not create, nor one it created for an earlier job).
    """
    labels = {MANAGED_NAMESPACE_LABEL: "true"}
    if pod_security:
        labels[POD_SECURITY_ENFORCE_LABEL] = pod_security
    async for attempt in kube_retry():
        with attempt:
            if await client.get_namespace(name) is not None:
                return False
            try:
                await client.create_namespace(
                    {
                        "apiVersion": "v1",
                        "kind": "Namespace",
                        "metadata": {"name": name, "labels": dict(labels)},
                    }
                )
            except Exception as exc:
                if status_of(exc) == 409:  # created meanwhile by someone else
                    return False
                raise
            return True
    raise AssertionError("unreachable: kube_retry re-raises")  # pragma: no cover


async def apply_object(
    client: ObjectClient, obj: Mapping[str, Any], *, job_uid: str, may_create: bool = True
) -> ApplyResult:
    """Make ``obj`` exist in the member with the strategy of its kind.

    - create-only kinds: an existing object with this job's UID label is adopted untouched;
      a missing one is created, unless ``may_create`` is False (the job ran before: never
      re-run it), which gives :attr:`ApplyResult.MISSING`;
    - other kinds: server-side apply with field manager ``gpufed`` and ``force`` (the hub is
      the source of truth for the fields it sets); when ``may_create`` is False and the object
      is gone, :attr:`ApplyResult.MISSING` as well.

    Raises :class:`OwnedElsewhereError` when the name is taken by another job's object, and
    the API error when the member refuses the object (after retries for temporary errors).
    """
    ref = ref_of(obj)
    if strategy_for(ref.kind_group) is ApplyStrategy.CREATE_ONLY:
        return await _create_only(client, obj, ref, job_uid=job_uid, may_create=may_create)
    async for attempt in kube_retry():
        with attempt:
            if not may_create and not await _exists_as_ours(client, ref, job_uid):
                return ApplyResult.MISSING
            await client.apply(obj, field_manager=FIELD_MANAGER, force=True)
            return ApplyResult.APPLIED
    raise AssertionError("unreachable: kube_retry re-raises")  # pragma: no cover


async def _create_only(
    client: ObjectClient, obj: Mapping[str, Any], ref: ObjectRef, *, job_uid: str, may_create: bool
) -> ApplyResult:
    async for attempt in kube_retry():
        with attempt:
            if not may_create:
                ours = await _exists_as_ours(client, ref, job_uid)
                return ApplyResult.ADOPTED if ours else ApplyResult.MISSING
            # Create first: one request in the common case (a new job). 409 means it exists
            # (created by this agent before, or by someone else): read it, then adopt it or
            # report its owner.
            try:
                await client.create(obj)
            except Exception as exc:
                if verdict_of(exc) is not Verdict.RECONCILE:
                    raise
                existing = await client.get(ref)
                if existing is None:
                    raise  # gone again meanwhile: report the conflict
                _check_owner(existing, ref, job_uid)
                return ApplyResult.ADOPTED
            return ApplyResult.CREATED
    raise AssertionError("unreachable: kube_retry re-raises")  # pragma: no cover


async def _exists_as_ours(client: ObjectClient, ref: ObjectRef, job_uid: str) -> bool:
    """True when ``ref`` exists with this job's UID label, False when it is gone; raises
    :class:`OwnedElsewhereError` when another job (or nobody) owns it."""
    existing = await client.get(ref)
    if existing is None:
        return False
    _check_owner(existing, ref, job_uid)
    return True


def _check_owner(existing: Mapping[str, Any], ref: ObjectRef, job_uid: str) -> None:
    labels = (existing.get("metadata") or {}).get("labels") or {}
    owner = labels.get(JOB_UID_LABEL)
    if owner != job_uid:
        raise OwnedElsewhereError(
            f"{ref} exists but belongs to "
            + (f"job {owner}" if owner else "no gpufed job (no gpufed.io/job-uid label)")
            + f", not {job_uid}; delete it or wait for its deletion to finish"
        )


async def delete_object(client: ObjectClient, ref: ObjectRef) -> bool:
    """Delete one object with background propagation (dependents, e.g. a Job's pods, are
    removed by the member's garbage collector). Returns False when it was already gone."""
    async for attempt in kube_retry():
        with attempt:
            return await client.delete(ref, propagation="Background")
    raise AssertionError("unreachable: kube_retry re-raises")  # pragma: no cover


def api_error_message(exc: BaseException) -> str:
    """The member API's own message for a failed call (``Status.message`` of the response
    body), falling back to the exception text; used in failed work acks."""
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str) and body:
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("message"):
            return str(parsed["message"])
    status = status_of(exc)
    reason = getattr(exc, "reason", None)
    if status is not None and reason:
        return f"HTTP {status}: {reason}"
    return str(exc) or type(exc).__name__
