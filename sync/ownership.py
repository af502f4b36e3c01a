"""Ownership of member objects: which hub and which job an object in a member belongs to.

Owns the rule "never touch what the job did not create" (docs/design.md §4): gpufed creates,
adopts, changes or deletes an object in a member only when it carries this hub's origin label
(``gpufed.io/origin``) and this job's UID label (``gpufed.io/job-uid``). Any other object of the
same name — made by the member's admins, by another hub, by another job of this hub — is a
conflict (:class:`OwnershipConflictError`): never overwritten, never deleted, reported on the
GPUJob. Orphan collection selects by :func:`origin_selector`, never by the job UID alone.

Used by the apply strategies (:mod:`gpufed.sync.apply`) and the agent's work manager. Pure: no
I/O, no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufed.api.errors import GpufedError
from gpufed.api.labels import JOB_UID_LABEL, ORIGIN_LABEL
from gpufed.sync.manifests import label_value


@dataclass(frozen=True, slots=True)
class Owner:
    """One job of one hub as the owner of member objects.

    ``origin``: the hub's full origin (``--origin``; long values are hashed into the label,
    :func:`gpufed.sync.manifests.label_value`); ``job_uid``: the GPUJob's ``metadata.uid``.
    """

    origin: str
    job_uid: str

    @property
    def labels(self) -> dict[str, str]:
        """The ownership labels every object of this job carries (label values, ≤ 63 chars)."""
        return {ORIGIN_LABEL: label_value(self.origin), JOB_UID_LABEL: label_value(self.job_uid)}

    @property
    def selector(self) -> str:
        """Label selector of exactly this job's objects of this hub."""
        return ",".join(f"{k}={v}" for k, v in self.labels.items())


def origin_selector(origin: str) -> str:
    """Label selector of every job object of the hub ``origin``: origin equal, job UID set."""
    return f"{ORIGIN_LABEL}={label_value(origin)},{JOB_UID_LABEL}"


class Holder(enum.Enum):
    """Whose an existing member object is, seen from one :class:`Owner`."""

    THIS_JOB = "this job"
    OTHER_JOB = "another job of this hub"
    OTHER_HUB = "another gpufed hub"
    NOT_GPUFED = "not gpufed"


def holder_of(obj: Mapping[str, Any], owner: Owner) -> Holder:
    """Classify ``obj`` by its ownership labels (``metadata.labels``; absent labels count as
    absent). Only :attr:`Holder.THIS_JOB` may be adopted, changed or deleted."""
    labels = _labels(obj)
    want = owner.labels
    origin, uid = labels.get(ORIGIN_LABEL), labels.get(JOB_UID_LABEL)
    if origin is None and uid is None:
        return Holder.NOT_GPUFED
    if origin != want[ORIGIN_LABEL]:
        return Holder.OTHER_HUB
    return Holder.THIS_JOB if uid == want[JOB_UID_LABEL] else Holder.OTHER_JOB


def job_uid_of(obj: Mapping[str, Any]) -> str:
    """The ``gpufed.io/job-uid`` label value of ``obj`` ("" when absent)."""
    return str(_labels(obj).get(JOB_UID_LABEL, ""))


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


class OwnershipConflictError(GpufedError, RuntimeError):
    """An object with the name a job wants exists in the member and is not that job's.

    ``obj``: what the object is (``ConfigMap team-a/settings``); ``member``: the member
    cluster's name; ``holder``: whose it is; ``retryable``: True only for the terminating copy
    of another job of this hub (a re-created GPUJob whose old objects are still being deleted):
    everything else stays until a person renames or deletes it, so retrying cannot help.
    """

    def __init__(self, obj: str, *, member: str, owner: Owner, existing: Mapping[str, Any]) -> None:
        self.obj = obj
        self.member = member
        self.holder = holder_of(existing, owner)
        meta = existing.get("metadata")
        terminating = isinstance(meta, Mapping) and bool(meta.get("deletionTimestamp"))
        self.retryable = terminating and self.holder is Holder.OTHER_JOB
        labels = _labels(existing)
        where = f"member {member}" if member else "the member"
        whose = {
            Holder.NOT_GPUFED: "it carries no gpufed ownership labels",
            Holder.OTHER_HUB: (
                f"it belongs to gpufed origin {labels[ORIGIN_LABEL]!r}"
                if ORIGIN_LABEL in labels
                else f"it carries {JOB_UID_LABEL} but no {ORIGIN_LABEL}"
            ),
            Holder.OTHER_JOB: f"it belongs to job {labels.get(JOB_UID_LABEL)!r} of this hub",
            Holder.THIS_JOB: "it is this job's",  # never raised for it; kept total
        }[self.holder]
        if self.retryable:
            fix = "it is being deleted; the apply is retried"
        else:
            fix = "rename it in the GPUJob or delete the member's object"
        super().__init__(
            f"{obj} exists in {where} and is not owned by this job "
            f"({JOB_UID_LABEL}={owner.job_uid}, {ORIGIN_LABEL}={owner.origin}; {whose}): {fix}"
        )


def check_owner(existing: Mapping[str, Any], obj: str, *, owner: Owner, member: str = "") -> None:
    """Return when ``existing`` is ``owner``'s; raise :class:`OwnershipConflictError` naming
    ``obj`` and ``member`` otherwise."""
    if holder_of(existing, owner) is not Holder.THIS_JOB:
        raise OwnershipConflictError(obj, member=member, owner=owner, existing=existing)
