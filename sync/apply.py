"""Apply strategies for the objects gpufed propagates into a member cluster.

Owns *how* a prepared manifest becomes an object in a member: which kinds are allowed at all,
which are applied with server-side apply (field manager ``gpufed``) and which are create-only
because their spec is immutable once created (a ``batch/v1`` Job), how an existing object is
adopted, how objects are deleted (background propagation) and how a namespace is created.
Every write and every delete first checks ownership (:mod:`gpufed.sync.ownership`): only an
object carrying this hub's origin and this job's UID is adopted, changed or deleted, and the
write or delete is conditional on the object read (``resourceVersion`` / ``uid``
preconditions), so an object replaced meanwhile is checked again, never overwritten.

Called by the agent's work manager (``gpufed.agent.work``) through an :class:`ObjectClient`
that the agent implements over the member's API server; this module talks to no API itself,
so its logic is unit-tested with an in-memory client. Every API call here goes through
:func:`gpufed.sync.retry.kube_retry` (the one retry layer); callers must not retry around it.

Defense in depth (docs/design.md §4): the hub already confines a GPUJob to its namespace and to the
allow-listed kinds; :func:`check_manifests` refuses anything else again on the member side.
"""

from __future__ import annotations

import asyncio
import copy
import enum
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpufed.api.errors import GpufedError, PermanentError
from gpufed.api.inventory import workload_kind
from gpufed.api.labels import (
    JOB_UID_LABEL,
    MANAGED_NAMESPACE_LABEL,
    POD_SECURITY_ENFORCE_LABEL,
)
from gpufed.sync.grants import RESERVED_NAMESPACES, grant_manifest
from gpufed.sync.manifests import DEFAULT_ALLOWED_KINDS, WORKLOAD_KINDS
from gpufed.sync.ownership import Holder, Owner, check_owner, holder_of
from gpufed.sync.retry import Verdict, kube_retry, status_of, verdict_of

#: Field manager of every server-side apply gpufed makes (``metadata.managedFields[].manager``).
FIELD_MANAGER = "gpufed"

# The allow-list and the workload kinds are those of manifest preparation
# (gpufed.sync.manifests): the member enforces the same list the hub prepared against.

#: Kinds whose spec is immutable once created: created once, never updated (re-applying a
#: changed pod template of a Job is rejected by the API server, and a job must never re-run).
CREATE_ONLY_KINDS: frozenset[str] = frozenset({"Job.batch"})


#: How often one apply or delete re-reads an object that changed between the read and the
#: conditional write (409); a member where it keeps changing gets a retryable failure.
MAX_CONFLICTS = 3

#: How often :func:`ensure_namespace` asks whether a new grant is in effect before it goes on.
GRANT_WAIT_TRIES = 8


class ApplyStrategy(enum.Enum):
    """How one kind is written to a member (both create a missing object with POST)."""

    SERVER_SIDE_APPLY = "ServerSideApply"  # an existing own object: apply-patch, force, gpufed
    CREATE_ONLY = "CreateOnly"  # POST once; an existing own object is adopted, never updated


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


class ManifestRefusedError(PermanentError, ValueError):
    """A manifest the agent will not apply; the message names the field and the fix."""


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

    async def delete(self, ref: ObjectRef, *, propagation: str, uid: str | None = None) -> bool:
        """DELETE with ``propagationPolicy`` and, when ``uid`` is given, the precondition
        ``preconditions.uid`` (409 when the object now has another UID); False when the object
        was already gone."""
        ...

    async def get_namespace(self, name: str) -> dict[str, Any] | None:
        """The Namespace, or None when it does not exist."""
        ...

    async def create_namespace(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """POST a Namespace; raises the API error (409 when it exists)."""
        ...

    async def allowed(self, verb: str, resource: str, namespace: str) -> bool:
        """Whether this client may ``verb`` core ``resource`` in ``namespace`` now (a
        SelfSubjectAccessReview: what the API server's authorizer answers)."""
        ...


class ApplyResult(enum.Enum):
    """What :func:`apply_object` did with one object."""

    CREATED = "created"
    APPLIED = "applied"  # server-side applied over an existing object of this job
    ADOPTED = "adopted"  # a create-only object already existed as this job's
    MISSING = "missing"  # gone, and must not be created again (the job ran before)


class DeleteResult(enum.Enum):
    """What :func:`delete_owned` did with one object."""

    DELETED = "deleted"
    GONE = "gone"  # did not exist (any more)
    KEPT = "kept"  # exists and is not this job's: never deleted


# --- validation -----------------------------------------------------------------------------------


def check_manifests(
    manifests: Sequence[Mapping[str, Any]],
    *,
    namespace: str,
    owner: Owner,
    allowed_kinds: Iterable[str] = DEFAULT_ALLOWED_KINDS,
) -> list[dict[str, Any]]:
    """Validate the manifests of one work item and return copies ready to apply.

    Each manifest must have ``apiVersion``, ``kind`` and ``metadata.name``; its ``Kind.group``
    must be in ``allowed_kinds``; ``metadata.namespace`` must equal the work item's
    ``namespace`` (it is filled in when absent); the ``gpufed.io/job-uid`` and
    ``gpufed.io/origin`` labels must be ``owner``'s (added when absent: :attr:`Owner.labels`).
    Raises :class:`ManifestRefusedError` naming the manifest and the field. The returned list
    puts supporting objects (ConfigMaps, Secrets, Services) before workloads, otherwise keeping
    the given order.
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
        for key, want in owner.labels.items():
            have = labels.get(key)
            if have is not None and have != want:
                what = "this job's UID" if key == JOB_UID_LABEL else "this agent's hub origin"
                fix = "" if key == JOB_UID_LABEL else " (start the agent with the hub's --origin)"
                raise ManifestRefusedError(
                    f"{where}.metadata.labels[{key}]: {have!r} is not {what} {want!r}{fix}"
                )
            labels[key] = want
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


async def ensure_namespace(
    client: ObjectClient,
    name: str,
    pod_security: str = "",
    *,
    origin: str,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> bool:
    """Create namespace ``name`` labelled ``gpufed.io/managed=true`` unless it exists, and make
    sure it holds the agent's workload grant for the hub ``origin``.

    ``pod_security``: the Pod Security level of the job's hub namespace (``baseline`` …); when
    given, the new namespace also carries it as ``pod-security.kubernetes.io/enforce``, so the
    member's Pod Security Admission enforces what the hub checked. Returns True when this call
    created it. An existing namespace (perhaps made by the member's admins, with their own
    quotas) is used as it is: never relabelled. gpufed never deletes a namespace, not even one
    it created (it may hold others' objects by then); the agent's RBAC has no ``delete`` on
    namespaces.

    The grant (:func:`gpufed.sync.grants.grant_manifest`: a RoleBinding of the ClusterRole
    ``gpufed-agent-workload`` to the agent's ServiceAccount) is what lets the agent write the
    job's objects there, in a namespace it created and in one that existed; it is created when
    missing, in every namespace except the reserved ones (where the agent writes nothing), and
    waited for until the API server's authorizer applies it (a SelfSubjectAccessReview; a new
    RoleBinding takes a moment, :func:`_grant_effective`). A RoleBinding of the grant's name that
    exists already is left as it is (this agent's from before, or someone else's). Raises the
    API error (after retries for temporary errors); ``sleep``: the wait between two reviews.
    """
    created = await _ensure_namespace_exists(client, name, pod_security)
    if name not in RESERVED_NAMESPACES:
        # 409: it exists (this agent's from before, or someone else's: never changed).
        await _create(client, grant_manifest(name, origin))
        await _grant_effective(client, name, sleep)
    return created


async def _grant_effective(
    client: ObjectClient, namespace: str, sleep: Callable[[float], Awaitable[None]]
) -> None:
    """Wait until the API server's authorizer applies the grant in ``namespace``: RBAC reads
    bindings from a cache that follows a new RoleBinding a moment later, and a write made at
    once is refused (403). Asks at most :data:`GRANT_WAIT_TRIES` times, backing off from
    50 ms (about 7 s in all); after that the writes go ahead and any 403 is reported."""
    for attempt in range(GRANT_WAIT_TRIES):
        async for call in kube_retry():
            with call:
                if await client.allowed("create", "secrets", namespace):
                    return
        await sleep(min(0.05 * 2**attempt, 2.0))


async def _ensure_namespace_exists(client: ObjectClient, name: str, pod_security: str) -> bool:
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
    client: ObjectClient,
    obj: Mapping[str, Any],
    *,
    owner: Owner,
    member: str = "",
    may_create: bool = True,
) -> ApplyResult:
    """Make ``obj`` exist in the member with the strategy of its kind, as ``owner``'s.

    A missing object is created (POST: one request for a new object), unless ``may_create``
    is False (the job ran before: never re-run it), which gives :attr:`ApplyResult.MISSING`.
    An existing object is read and must be ``owner``'s (origin and job UID labels); then a
    create-only kind is adopted untouched (even its ``gpufed.io/hub-epoch`` annotation: the
    agent may not patch a batch Job) and any other kind is server-side applied (field
    manager ``gpufed``, ``force``: the hub is the source of truth for the fields it sets),
    conditional on the ``resourceVersion`` read, so an object replaced meanwhile is read and
    checked again (at most :data:`MAX_CONFLICTS` times).

    Raises :class:`gpufed.sync.ownership.OwnershipConflictError` (naming the object and
    ``member``) when the object is not ``owner``'s — it is then left exactly as it is — and the
    API error when the member refuses the object (after retries for temporary errors).
    """
    ref = ref_of(obj)
    create_only = strategy_for(ref.kind_group) is ApplyStrategy.CREATE_ONLY
    existing = None if may_create else await get_object(client, ref)
    for attempt in range(MAX_CONFLICTS):
        if existing is None:
            if not may_create:
                return ApplyResult.MISSING
            created = await _create(client, obj)
            if created:
                return ApplyResult.CREATED
            # 409: it exists (created by this agent before, or by someone else): read it,
            # then adopt it or report its owner.
            existing = await get_object(client, ref)
            continue
        check_owner(existing, str(ref), owner=owner, member=member)
        if create_only:
            return ApplyResult.ADOPTED
        if await _apply_over(client, obj, existing):
            return ApplyResult.APPLIED
        if attempt + 1 < MAX_CONFLICTS:
            existing = await get_object(client, ref)  # changed since read: check it again
    raise _StillChangingError(f"{ref} kept changing while gpufed applied it; retry later")


class _StillChangingError(GpufedError, RuntimeError):
    """The object changed between every read and conditional write (a retryable 409)."""

    status = 409


async def get_object(client: ObjectClient, ref: ObjectRef) -> dict[str, Any] | None:
    """The object, or None when it does not exist (retried for temporary errors)."""
    async for attempt in kube_retry():
        with attempt:
            return await client.get(ref)
    raise AssertionError("unreachable: kube_retry re-raises")  # pragma: no cover


async def _create(client: ObjectClient, obj: Mapping[str, Any]) -> bool:
    """POST ``obj``: True when created, False when the name exists (409)."""
    return await _unless_conflict(lambda: client.create(obj))


async def _apply_over(
    client: ObjectClient, obj: Mapping[str, Any], existing: Mapping[str, Any]
) -> bool:
    """Server-side apply ``obj`` over ``existing`` (an object of this job), conditional on its
    ``resourceVersion``: False when the object changed since it was read (409) or was deleted
    meanwhile (404: its namespace exists, the object was just read)."""
    body = copy.deepcopy(dict(obj))
    version = (existing.get("metadata") or {}).get("resourceVersion")
    if version:
        body.setdefault("metadata", {})["resourceVersion"] = version
    return await _unless_conflict(
        lambda: client.apply(body, field_manager=FIELD_MANAGER, force=True), gone_too=True
    )


async def _unless_conflict(
    write: Callable[[], Awaitable[object]], *, gone_too: bool = False
) -> bool:
    """One write under the retry policy: True when done, False on 409 (the name exists, or
    the object changed since it was read: the caller reads it again) and, with ``gone_too``,
    on 404."""
    async for attempt in kube_retry():
        with attempt:
            try:
                await write()
            except Exception as exc:
                verdict = verdict_of(exc)
                if verdict is Verdict.RECONCILE or (gone_too and status_of(exc) == 404):
                    return False
                raise
            return True
    raise AssertionError("unreachable: kube_retry re-raises")  # pragma: no cover


async def delete_owned(
    client: ObjectClient,
    ref: ObjectRef,
    *,
    owner: Owner,
    existing: Mapping[str, Any] | None = None,
) -> DeleteResult:
    """Delete ``ref`` if, and only if, it is ``owner``'s; never anything else.

    ``existing``: the object as just listed (saves the read); otherwise it is read first. The
    delete uses background propagation (dependents, e.g. a Job's pods, are removed by the
    member's garbage collector) and the precondition ``uid`` of the object checked, so an
    object replaced after the check is read and checked again. Returns
    :attr:`DeleteResult.KEPT` for an object that is not ``owner``'s (the caller logs it).
    """
    current = existing
    for _ in range(MAX_CONFLICTS):
        if current is None:
            current = await get_object(client, ref)
            if current is None:
                return DeleteResult.GONE
        if holder_of(current, owner) is not Holder.THIS_JOB:
            return DeleteResult.KEPT
        uid = (current.get("metadata") or {}).get("uid") or None
        try:
            existed = await delete_object(client, ref, uid=uid)
        except Exception as exc:
            if verdict_of(exc) is not Verdict.RECONCILE:
                raise
            current = None  # replaced since the check (another UID): check it again
            continue
        return DeleteResult.DELETED if existed else DeleteResult.GONE
    raise _StillChangingError(f"{ref} kept being replaced while gpufed deleted it; retry later")


async def delete_object(client: ObjectClient, ref: ObjectRef, *, uid: str | None = None) -> bool:
    """Delete one object with background propagation, with the ``uid`` precondition when
    given (409 when it does not hold). Returns False when it was already gone. Checks no
    ownership: callers use :func:`delete_owned`."""
    async for attempt in kube_retry():
        with attempt:
            return await client.delete(ref, propagation="Background", uid=uid)
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
