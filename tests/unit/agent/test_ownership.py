"""Never touch what the job did not create (gpufed.sync.ownership, gpufed.sync.apply and the
agent's work manager over an in-memory member): foreign objects of every kind are reported and
left alone on apply, on delete and in orphan collection; own objects are adopted after an agent
restart; existing namespaces are used as they are and never deleted."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from gpufed.agent.work import WorkManager
from gpufed.api.labels import DEFAULT_ORIGIN, JOB_UID_LABEL, ORIGIN_LABEL
from gpufed.api.work import WorkAck
from gpufed.sync.apply import (
    ApplyResult,
    DeleteResult,
    apply_object,
    check_manifests,
    delete_owned,
    ref_of,
)
from gpufed.sync.ownership import (
    Holder,
    Owner,
    OwnershipConflictError,
    holder_of,
    origin_selector,
)

from .builders import admins_object, apply_item, config_map, delete_item, gpu_job, owned_by
from .fakes import FakeApiError, MemoryCluster, RecordingStatus

MEMBER = "us-east"


def own(uid: str) -> Owner:
    return Owner(DEFAULT_ORIGIN, uid)


def with_meta(obj: dict[str, Any], **meta: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"].update(meta)
    return out


def before_next_apply(
    api: MemoryCluster, act: Callable[[], object], error: Exception | None = None
) -> None:
    """Run ``act`` on the member just before the next apply lands (then fail it with
    ``error``, if given): a change between gpufed's read and its write."""
    real_apply = api.apply

    async def hooked(obj: Any, *, field_manager: str, force: bool) -> Any:
        api.apply = real_apply  # type: ignore[method-assign]
        act()
        if error is not None:
            raise error
        return await real_apply(obj, field_manager=field_manager, force=force)

    api.apply = hooked  # type: ignore[method-assign]


class Harness:
    """A work manager of member ``us-east`` over an in-memory member with namespace team-a."""

    def __init__(self, api: MemoryCluster | None = None) -> None:
        self.api = api or MemoryCluster()
        self.api.namespaces.setdefault("team-a", {"metadata": {"name": "team-a"}})
        self.acks: list[WorkAck] = []
        self.status = RecordingStatus()
        self.work = WorkManager(self.api, ack=self.acks.append, status=self.status, member=MEMBER)

    def stored(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        return self.api.objects.get(ref_of(with_meta(obj, namespace="team-a")))


# --- who holds an object --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "holder"),
    [
        (owned_by("u1"), Holder.THIS_JOB),
        (owned_by("u2"), Holder.OTHER_JOB),
        (owned_by("u1", origin="other-hub"), Holder.OTHER_HUB),
        ({JOB_UID_LABEL: "u1"}, Holder.OTHER_HUB),  # our job UID but no origin: not ours
        ({ORIGIN_LABEL: DEFAULT_ORIGIN}, Holder.OTHER_JOB),  # our origin, no job UID
        ({"app": "settings"}, Holder.NOT_GPUFED),
        ({}, Holder.NOT_GPUFED),
    ],
)
def test_only_both_labels_of_this_hub_and_job_make_an_object_ours(
    labels: dict[str, str], holder: Holder
) -> None:
    assert holder_of({"metadata": {"labels": labels}}, own("u1")) is holder
    assert holder_of({"metadata": {}}, own("u1")) is Holder.NOT_GPUFED


def test_selectors_name_the_origin_and_the_job() -> None:
    assert own("u1").selector == "gpufed.io/origin=gpufed-hub,gpufed.io/job-uid=u1"
    assert origin_selector("gpufed-hub") == "gpufed.io/origin=gpufed-hub,gpufed.io/job-uid"
    long = Owner("hub.example.com/" + "x" * 80, "u1")
    assert len(long.labels[ORIGIN_LABEL]) <= 63  # hashed the way the hub labels it


# --- apply ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ConfigMap", "Secret", "Service", "Job"])
async def test_a_foreign_object_of_any_kind_is_reported_and_left_untouched(kind: str) -> None:
    h = Harness()
    theirs = h.api.put(admins_object(kind, "settings"))
    mine = admins_object(kind, "settings", **owned_by("u1"))
    del mine["metadata"]["namespace"]
    h.work.submit(apply_item("u1", 1, mine))
    await h.work.idle()
    (ack,) = h.acks
    assert (ack.result, ack.retryable) == ("Failed", False)
    kind_group = "Job.batch" if kind == "Job" else kind
    assert ack.message.startswith(
        f"{kind_group} team-a/settings exists in member us-east and is not owned by this job "
        "(gpufed.io/job-uid=u1"
    )
    assert "carries no gpufed ownership labels" in ack.message
    assert ack.message.endswith("rename it in the GPUJob or delete the member's object")
    assert h.stored(theirs) == theirs  # not one field changed
    assert [op for op, _ in h.api.calls if op == "apply"] == []


async def test_an_object_with_our_job_uid_but_another_origin_is_foreign() -> None:
    h = Harness()
    theirs = h.api.put(
        with_meta(config_map("u1"), namespace="team-a", labels=owned_by("u1", origin="other-hub"))
    )
    h.work.submit(apply_item("u1", 1, config_map("u1")))
    await h.work.idle()
    (ack,) = h.acks
    assert (ack.result, ack.retryable) == ("Failed", False)
    assert "belongs to gpufed origin 'other-hub'" in ack.message
    assert h.stored(theirs) == theirs
    # ... and the job's delete leaves it in place.
    h.work.submit(delete_item("u1", 2, config_map("u1")))
    await h.work.idle()
    assert h.acks[-1].result == "Deleted"
    assert h.stored(theirs) == theirs


async def test_own_objects_are_adopted_by_a_restarted_agent_without_recreating_them() -> None:
    first = Harness()
    first.work.submit(apply_item("u1", 1, config_map("u1"), gpu_job("u1", "train")))
    await first.work.idle()
    uids = {r.kind: o["metadata"]["uid"] for r, o in first.api.objects.items()}
    # A new agent process over the same member: it knows nothing of what it did before.
    again = Harness(first.api)
    again.work.connected()
    again.work.desired_part(
        [apply_item("u1", 1, config_map("u1"), gpu_job("u1", "train"), applied_before=True)],
        final=True,
    )
    await again.work.idle()
    assert again.acks == [WorkAck(job_uid="u1", revision=1, result="Applied")]
    assert {r.kind: o["metadata"]["uid"] for r, o in again.api.objects.items()} == uids


async def test_the_terminating_copy_of_another_job_of_this_hub_is_retried_later() -> None:
    api = MemoryCluster()
    api.namespaces["team-a"] = {}
    api.put(with_meta(config_map("old"), namespace="team-a", deletionTimestamp="2026-01-01T0"))
    cm = check_manifests([config_map("new")], namespace="team-a", owner=own("new"))[0]
    with pytest.raises(OwnershipConflictError) as err:
        await apply_object(api, cm, owner=own("new"), member=MEMBER)
    assert err.value.retryable is True
    assert "it is being deleted; the apply is retried" in str(err.value)


async def test_an_object_replaced_between_read_and_apply_is_checked_again() -> None:
    """The apply is conditional on the version read: a foreign object that took the name in
    between is seen, not overwritten."""
    api = MemoryCluster()
    api.namespaces["team-a"] = {}
    cm = check_manifests([config_map("u1")], namespace="team-a", owner=own("u1"))[0]
    api.put(cm)
    # Deleted and re-made by the admins just before the apply lands.
    before_next_apply(api, lambda: api.put(admins_object("ConfigMap", "train-config")))
    with pytest.raises(OwnershipConflictError, match="carries no gpufed ownership labels"):
        await apply_object(api, cm, owner=own("u1"), member=MEMBER)
    assert api.objects[ref_of(cm)]["data"] == {"theirs": "1"}


# --- delete and orphan collection ---------------------------------------------------------------


async def test_the_jobs_delete_removes_its_own_objects_and_never_a_foreign_one() -> None:
    h = Harness()
    theirs = h.api.put(admins_object("ConfigMap", "settings"))
    h.work.submit(apply_item("u1", 1, config_map("u1", "settings"), gpu_job("u1", "train")))
    await h.work.idle()
    assert h.acks[-1].result == "Failed"  # the conflict
    h.work.submit(apply_item("u2", 1, config_map("u2", "mine"), gpu_job("u2", "other")))
    await h.work.idle()
    # The hub deletes the job; the item may even name the foreign object.
    h.work.submit(delete_item("u1", 2, config_map("u1", "settings"), gpu_job("u1", "train")))
    h.work.submit(delete_item("u2", 3, config_map("u2", "mine")))
    await h.work.idle()
    assert [a.result for a in h.acks[-2:]] == ["Deleted", "Deleted"]
    assert [o for o in h.api.objects.values() if o["kind"] != "RoleBinding"] == [theirs]


async def test_delete_never_removes_an_object_replaced_after_the_check() -> None:
    api = MemoryCluster()
    api.namespaces["team-a"] = {}
    listed = api.put(with_meta(config_map("u1"), namespace="team-a"))
    theirs = api.put(admins_object("ConfigMap", "train-config"))  # replaced after the list
    result = await delete_owned(api, ref_of(listed), owner=own("u1"), existing=listed)
    assert result is DeleteResult.KEPT
    assert api.objects[ref_of(listed)] == theirs


async def test_orphan_collection_deletes_only_this_hubs_objects() -> None:
    h = Harness()
    orphan = h.api.put(with_meta(gpu_job("gone", "orphan"), namespace="team-a"))
    kept = [
        h.api.put(with_meta(gpu_job("gone", name), namespace="team-a", labels=labels))
        for name, labels in (
            ("other-hub", owned_by("gone", origin="other-hub")),  # another hub's job
            ("no-origin", {JOB_UID_LABEL: "gone"}),  # our job's UID, no origin
            ("theirs", {"app": "theirs"}),  # not gpufed's at all
        )
    ]
    h.work.connected()
    h.work.desired_part([], final=True)  # the hub wants nothing here
    await h.work.idle()
    assert ref_of(orphan) not in h.api.objects
    for obj in kept:
        assert h.api.objects[ref_of(obj)] == obj
    assert ("list", origin_selector(DEFAULT_ORIGIN)) in h.api.calls


# --- namespaces ---------------------------------------------------------------------------------


async def test_an_existing_namespace_is_used_as_it_is_and_never_deleted() -> None:
    h = Harness()
    admins = {"metadata": {"name": "team-a", "labels": {"team": "a", "quota": "gold"}}}
    h.api.namespaces["team-a"] = copy.deepcopy(admins)
    h.work.submit(apply_item("u1", 1, gpu_job("u1", "train")))
    await h.work.idle()
    h.work.submit(delete_item("u1", 2))
    await h.work.idle()
    assert [a.result for a in h.acks] == ["Applied", "Deleted"]
    assert h.api.namespaces == {"team-a": admins}  # not relabelled, not deleted
    # Only the agent's workload grant is left (it goes with the namespace, never deleted).
    assert [r.kind for r in h.api.objects] == ["RoleBinding"]


async def test_check_manifests_refuses_a_manifest_labelled_for_another_origin() -> None:
    with pytest.raises(ValueError, match="start the agent with the hub's --origin"):
        check_manifests(
            [with_meta(config_map("u1"), labels=owned_by("u1", origin="prod-hub"))],
            namespace="team-a",
            owner=own("u1"),
        )
    (out,) = check_manifests([admins_object("Secret", "s")], namespace="team-a", owner=own("u1"))
    assert out["metadata"]["labels"] == owned_by("u1")  # added when absent


async def test_created_objects_carry_both_ownership_labels() -> None:
    api = MemoryCluster()
    api.namespaces["team-a"] = {}
    (svc,) = check_manifests([admins_object("Service", "api")], namespace="team-a", owner=own("u1"))
    assert await apply_object(api, svc, owner=own("u1")) is ApplyResult.CREATED
    labels = api.objects[ref_of(svc)]["metadata"]["labels"]
    assert labels == owned_by("u1")


async def test_an_own_object_deleted_between_read_and_apply_is_created_again() -> None:
    api = MemoryCluster()
    api.namespaces["team-a"] = {}
    cm = check_manifests([config_map("u1")], namespace="team-a", owner=own("u1"))[0]
    api.put(cm)
    before_next_apply(
        api,
        lambda: api.objects.pop(ref_of(cm)),
        FakeApiError(404, 'configmaps "train-config" not found'),
    )
    assert await apply_object(api, cm, owner=own("u1")) is ApplyResult.CREATED
    assert api.objects[ref_of(cm)]["metadata"]["labels"] == owned_by("u1")
