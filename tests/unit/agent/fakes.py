"""In-memory stand-ins for the member API, for unit tests of pure agent logic only.

:class:`MemoryCluster` behaves like an API server for the calls the apply strategies make
(get, create with 409, server-side apply, delete with 404, namespaces, labelled lists) and can
be told to fail the next calls with a given HTTP status. Like an API server it gives each
object a ``uid`` and a ``resourceVersion`` and honours them as preconditions (an apply that
names a stale ``resourceVersion``, a delete whose ``preconditions.uid`` differs: 409).
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterable, Mapping
from typing import Any

from gpufed.api.work import WorkloadStatus
from gpufed.sync.apply import ObjectRef, ref_of


class FakeApiError(Exception):
    """Shaped like kubernetes_asyncio's ApiException (status, reason, body, headers)."""

    def __init__(self, status: int, message: str = "") -> None:
        super().__init__(f"({status}) {message}")
        self.status = status
        self.reason = {404: "Not Found", 409: "Conflict", 422: "Unprocessable Entity"}.get(
            status, "Error"
        )
        self.body = json.dumps({"kind": "Status", "message": message, "code": status}).encode()
        self.headers: dict[str, str] = {}


class MemoryCluster:
    """A namespaced object store with API-server semantics for the calls gpufed makes."""

    def __init__(self) -> None:
        self.objects: dict[ObjectRef, dict[str, Any]] = {}
        self.namespaces: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail_next: list[FakeApiError] = []  # raised by the next calls, in order
        self.refuse: dict[str, FakeApiError] = {}  # object name -> error on create/apply
        self.served: set[str] = {"Job.batch", "ConfigMap", "Secret", "Service"}
        self.not_allowed_yet = 0  # reviews that answer "not allowed yet"
        self._versions = itertools.count(1)

    def _stamp(self, obj: Mapping[str, Any], *, uid: str | None = None) -> dict[str, Any]:
        """A stored copy with server-set ``uid`` (kept when given) and a new resourceVersion."""
        out = copy.deepcopy(dict(obj))
        meta = out.setdefault("metadata", {})
        n = next(self._versions)
        meta["uid"] = uid or meta.get("uid") or f"uid-{n}"
        meta["resourceVersion"] = str(n)
        return out

    def _maybe_fail(self, op: str, what: str) -> None:
        self.calls.append((op, what))
        if self.fail_next:
            raise self.fail_next.pop(0)

    def _key(self, ref: ObjectRef) -> ObjectRef:
        # apiVersion differences (v1 vs v2 of a group) are irrelevant here.
        return ObjectRef(ref.api_version, ref.kind, ref.namespace, ref.name)

    def put(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Seed an object as if it had been created earlier (by anyone); returns the stored
        copy."""
        stored = self._stamp(obj)
        self.objects[self._key(ref_of(obj))] = stored
        return copy.deepcopy(stored)

    async def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        self._maybe_fail("get", str(ref))
        obj = self.objects.get(self._key(ref))
        return copy.deepcopy(obj) if obj is not None else None

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        ref = ref_of(obj)
        self._maybe_fail("create", str(ref))
        if ref.name in self.refuse:
            raise self.refuse[ref.name]
        if ref.namespace not in self.namespaces:
            raise FakeApiError(404, f'namespaces "{ref.namespace}" not found')
        if self._key(ref) in self.objects:
            raise FakeApiError(409, f'{ref.kind} "{ref.name}" already exists')
        fresh = {**obj, "metadata": {**obj.get("metadata", {}), "uid": None}}
        self.objects[self._key(ref)] = self._stamp(fresh)
        return copy.deepcopy(self.objects[self._key(ref)])

    async def apply(
        self, obj: Mapping[str, Any], *, field_manager: str, force: bool
    ) -> dict[str, Any]:
        ref = ref_of(obj)
        self._maybe_fail("apply", str(ref))
        assert field_manager == "gpufed"
        assert force
        if ref.name in self.refuse:
            raise self.refuse[ref.name]
        if ref.namespace not in self.namespaces:
            raise FakeApiError(404, f'namespaces "{ref.namespace}" not found')
        current = self.objects.get(self._key(ref))
        want = (obj.get("metadata") or {}).get("resourceVersion")
        if want and (current is None or current["metadata"]["resourceVersion"] != want):
            raise FakeApiError(409, "the object has been modified; please apply to the latest")
        uid = current["metadata"]["uid"] if current else None
        if current is not None and set(obj) <= {"apiVersion", "kind", "metadata"}:
            # A metadata-only apply (the epoch re-stamp of a Job): server-side apply merges
            # the fields it names and leaves the rest (the immutable spec) alone.
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            merged = copy.deepcopy(current)
            merged["metadata"]["annotations"] = {
                **(merged["metadata"].get("annotations") or {}),
                **annotations,
            }
            obj = merged
        self.objects[self._key(ref)] = self._stamp(obj, uid=uid)
        return copy.deepcopy(self.objects[self._key(ref)])

    async def delete(self, ref: ObjectRef, *, propagation: str, uid: str | None = None) -> bool:
        self._maybe_fail("delete", str(ref))
        assert propagation == "Background"
        current = self.objects.get(self._key(ref))
        if current is not None and uid and current["metadata"].get("uid") != uid:
            raise FakeApiError(409, f"Precondition failed: UID in precondition: {uid}")
        return self.objects.pop(self._key(ref), None) is not None

    async def get_namespace(self, name: str) -> dict[str, Any] | None:
        self._maybe_fail("get_namespace", name)
        return self.namespaces.get(name)

    async def create_namespace(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        self._maybe_fail("create_namespace", name)
        if name in self.namespaces:
            raise FakeApiError(409, "exists")
        self.namespaces[name] = copy.deepcopy(dict(obj))
        return self.namespaces[name]

    async def allowed(self, verb: str, resource: str, namespace: str) -> bool:
        """What a SelfSubjectAccessReview answers: False for the next ``not_allowed_yet``
        reviews (a grant the authorizer has not caught up with), then True."""
        self._maybe_fail("allowed", f"{verb} {resource} {namespace}")
        if self.not_allowed_yet:
            self.not_allowed_yet -= 1
            return False
        return True

    async def list_labelled(
        self, kinds: Iterable[str], label_selector: str
    ) -> list[dict[str, Any]]:
        self._maybe_fail("list", label_selector)
        # Requirements ``key=value`` and ``key`` (exists), ANDed, as the API server reads them.
        needs = [r.partition("=") for r in label_selector.split(",")]
        wanted = set(kinds) & self.served
        out = []
        for ref, obj in self.objects.items():
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if ref.kind_group in wanted and all(
                key in labels and (not eq or labels[key] == value) for key, eq, value in needs
            ):
                out.append(copy.deepcopy(obj))
        return out


class RecordingStatus:
    """A StatusTracker that records what the work manager tells it."""

    def __init__(self) -> None:
        self.tracked: dict[str, tuple[int, ObjectRef | None, bool]] = {}
        self.untracked: list[str] = []
        self.sent: list[WorkloadStatus] = []
        self.grace: dict[str, float] = {}  # job -> node_grace_s of its last track()

    def track(
        self,
        job_uid: str,
        *,
        revision: int,
        main: ObjectRef | None,
        missing: bool = False,
        attempt: str = "",
        node_grace_s: float = 300,
    ) -> None:
        self.tracked[job_uid] = (revision, main, missing)
        self.grace[job_uid] = node_grace_s

    def untrack(self, job_uid: str) -> None:
        self.tracked.pop(job_uid, None)
        self.untracked.append(job_uid)

    def keep_only(self, job_uids: set[str]) -> None:
        for uid in [u for u in self.tracked if u not in job_uids]:
            self.untrack(uid)
