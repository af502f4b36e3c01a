"""Never touch what the job did not create, against a real member API server: a ConfigMap the
member's admins made in their own namespace is neither taken over by a work item naming it nor
deleted with the job; the job's own objects are applied (conditional server-side apply) and
deleted (uid precondition) as before; the admins' namespace stays as it was."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.agent.kube import ApiException
from gpufed.api.work import WorkItem

from .conftest import Rig
from .test_work import apply, job_manifest, new_uid

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

OWNED = {"gpufed.io/origin": "gpufed-hub"}


def config_map(uid: str, name: str, data: dict[str, str]) -> dict[str, Any]:
    """A ConfigMap as the hub prepares it for job ``uid``."""
    labels = {**OWNED, "gpufed.io/job-uid": uid}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels},
        "data": data,
    }


def delete(uid: str, namespace: str, revision: int, *manifests: dict[str, Any]) -> WorkItem:
    return WorkItem(
        job_uid=uid,
        job=f"{namespace}/{uid}",
        revision=revision,
        op="Delete",
        namespace=namespace,
        manifests=manifests,
    )


async def get_cm(rig: Rig, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return await rig.admin.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
    except Exception as exc:
        if getattr(exc, "status", None) == 404:
            return None
        raise


async def test_a_members_own_configmap_is_never_taken_over_nor_deleted(
    rig: Rig, namespace: str
) -> None:
    # The member's admins made the namespace (with their own label) and a ConfigMap in it.
    await rig.admin.request(
        "POST",
        "/api/v1/namespaces",
        body={
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {"team": "a"}},
        },
    )
    theirs = await rig.admin.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/configmaps",
        body={
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings"},
            "data": {"owner": "admins"},
        },
    )

    uid = new_uid()
    rig.hub.send(
        rig.cluster,
        apply(
            uid,
            namespace,
            1,
            config_map(uid, "settings", {"owner": "tenant"}),
            job_manifest(uid, "train", duration="1h"),
        ),
    )
    (ack,) = await rig.hub.wait_for(lambda: rig.view.acks_for(uid), what="ack")
    assert (ack.result, ack.retryable) == ("Failed", False)
    assert ack.message.startswith(
        f"ConfigMap {namespace}/settings exists in member {rig.cluster} and is not owned by "
        f"this job (gpufed.io/job-uid={uid}"
    ), ack.message
    assert ack.message.endswith("rename it in the GPUJob or delete the member's object")
    after = await get_cm(rig, namespace, "settings")
    assert after is not None
    assert after["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
    assert after["data"] == {"owner": "admins"}
    assert "gpufed" not in {m["manager"] for m in after["metadata"].get("managedFields") or []}

    # The hub fails the job and deletes it; even a Delete naming the ConfigMap leaves it.
    rig.hub.send(rig.cluster, delete(uid, namespace, 2, config_map(uid, "settings", {})))
    await rig.hub.wait_for(
        lambda: any(a.result == "Deleted" for a in rig.view.acks_for(uid)), what="deleted"
    )
    after = await get_cm(rig, namespace, "settings")
    assert after is not None
    assert after["metadata"]["uid"] == theirs["metadata"]["uid"]
    assert after["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
    ns = await rig.admin.request("GET", f"/api/v1/namespaces/{namespace}")
    assert ns["metadata"]["labels"].get("team") == "a"
    assert "gpufed.io/managed" not in ns["metadata"]["labels"]  # used as it is
    assert not ns["metadata"].get("deletionTimestamp")


async def test_the_jobs_own_configmap_is_applied_again_and_deleted_with_it(
    rig: Rig, namespace: str
) -> None:
    """A second revision server-side applies over the job's own object with the
    resourceVersion read as precondition (accepted by a real API server); the Delete removes
    it with the uid precondition."""
    uid = new_uid()
    rig.hub.send(rig.cluster, apply(uid, namespace, 1, config_map(uid, "mine", {"v": "1"})))
    await rig.hub.wait_for(lambda: rig.view.acks_for(uid), what="ack 1")
    created = await get_cm(rig, namespace, "mine")
    assert created is not None
    rig.hub.send(rig.cluster, apply(uid, namespace, 2, config_map(uid, "mine", {"v": "2"})))
    await rig.hub.wait_for(lambda: len(rig.view.acks_for(uid)) >= 2, what="ack 2")
    assert [(a.revision, a.result) for a in rig.view.acks_for(uid)] == [
        (1, "Applied"),
        (2, "Applied"),
    ], rig.view.acks_for(uid)
    applied = await get_cm(rig, namespace, "mine")
    assert applied is not None
    assert applied["metadata"]["uid"] == created["metadata"]["uid"]
    assert applied["data"] == {"v": "2"}
    assert ("gpufed", "Apply") in {
        (m["manager"], m["operation"]) for m in applied["metadata"]["managedFields"]
    }
    # What the conditional apply relies on: a stale resourceVersion is refused with 409.
    stale = config_map(uid, "mine", {"v": "3"})
    stale["metadata"].update(
        namespace=namespace, resourceVersion=created["metadata"]["resourceVersion"]
    )
    with pytest.raises(ApiException) as err:
        await rig.admin.apply(stale, field_manager="gpufed", force=True)
    assert err.value.status == 409
    rig.hub.send(rig.cluster, delete(uid, namespace, 3))
    await rig.hub.wait_for(
        lambda: any(a.result == "Deleted" for a in rig.view.acks_for(uid)), what="deleted"
    )
    assert await get_cm(rig, namespace, "mine") is None
