"""Applying work in a real member through the agent, driven by the test hub over gRPC:
apply / ack / delete, status of a Job that succeeds and one that fails, a rejected work item,
the reconcile after a reconnect, and a hub outage leaving running workloads alone."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp
import pytest

from gpufed.agent.kube import MemberApi
from gpufed.api.work import WorkItem, WorkloadStatus

from .conftest import Rig

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

UID_LABEL = "gpufed.io/job-uid"


def job_manifest(
    uid: str, name: str, *, gpus: int = 1, duration: str = "2s", exit_code: int | None = None
) -> dict[str, Any]:
    """A prepared batch/v1 Job as the hub sends it (job UID label on it and its pods)."""
    annotations = {"gpufed.io/sim-duration": duration}
    if exit_code is not None:
        annotations["gpufed.io/sim-exit-code"] = str(exit_code)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {UID_LABEL: uid}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {UID_LABEL: uid}, "annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [
                        {
                            "name": "train",
                            "image": "trainer:1",
                            "resources": {"limits": {"nvidia.com/gpu": gpus}},
                        }
                    ],
                },
            },
        },
    }


def apply(
    uid: str, namespace: str, revision: int, *manifests: dict[str, Any], **kw: Any
) -> WorkItem:
    return WorkItem(
        job_uid=uid,
        job=f"{namespace}/{uid}",
        revision=revision,
        op="Apply",
        namespace=namespace,
        manifests=manifests,
        **kw,
    )


def new_uid() -> str:
    return str(uuid.uuid4())


async def get_job(admin: MemberApi, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return await admin.request("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")
    except Exception as exc:
        if getattr(exc, "status", None) == 404:
            return None
        raise


async def poll(fetch: Any, done: Any, *, within: float = 30.0) -> Any:
    """Poll the member (an external process) until ``done(await fetch())``."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        value = await fetch()
        if done(value):
            return value
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"condition not reached in {within}s: {value!r:.300}")
        await asyncio.sleep(0.1)


async def final_status(rig: Rig, uid: str, phase: str, within: float = 60) -> WorkloadStatus:
    return await rig.hub.wait_for(
        lambda: (s := rig.view.latest_status(uid)) is not None and s.phase == phase and s,
        what=f"{uid} {phase}",
        within=within,
    )


async def test_apply_ack_succeed_then_delete(rig: Rig, namespace: str) -> None:
    uid = new_uid()
    rig.hub.send(rig.cluster, apply(uid, namespace, 1, job_manifest(uid, "ok")))
    ack = await rig.hub.wait_for(lambda: rig.view.acks_for(uid), what="ack")
    assert (ack[0].revision, ack[0].result) == (1, "Applied")
    ns = await rig.admin.request("GET", f"/api/v1/namespaces/{namespace}")
    assert ns["metadata"]["labels"]["gpufed.io/managed"] == "true"
    job = await get_job(rig.admin, namespace, "ok")
    assert job is not None
    assert any(m["manager"] == "gpufed" for m in job["metadata"]["managedFields"])

    status = await final_status(rig, uid, "Succeeded")
    assert (status.kind, status.name, status.revision) == ("Job.batch", "ok", 1)
    assert status.succeeded == 1
    assert [c.type for c in status.conditions][-1] == "Complete"
    assert status.start_time
    assert status.completion_time
    assert status.nodes  # where the pod ran
    phases = [s.phase for s in rig.view.statuses if s.job_uid == uid]
    assert phases[-1] == "Succeeded"
    assert "Running" in phases or "Pending" in phases

    rig.hub.send(
        rig.cluster,
        WorkItem(job_uid=uid, job=f"{namespace}/ok", revision=2, op="Delete", namespace=namespace),
    )
    await rig.hub.wait_for(
        lambda: any(a.result == "Deleted" for a in rig.view.acks_for(uid)), what="deleted"
    )
    job = await get_job(rig.admin, namespace, "ok")
    assert job is None or job["metadata"].get("deletionTimestamp")


async def test_failed_job_keeps_the_member_reason(rig: Rig, namespace: str) -> None:
    uid = new_uid()
    rig.hub.send(
        rig.cluster, apply(uid, namespace, 1, job_manifest(uid, "boom", duration="1s", exit_code=3))
    )
    status = await final_status(rig, uid, "Failed")
    failed = [c for c in status.conditions if c.type == "Failed"]
    assert failed[0].status == "True"
    assert failed[0].reason == "BackoffLimitExceeded"
    assert status.failed == 1
    assert status.completion_time == failed[0].last_transition_time
    assert [i.reason for i in status.pod_issues] == ["Error"]


async def test_rejected_work_item_is_acked_failed_with_the_api_message(
    rig: Rig, namespace: str
) -> None:
    uid = new_uid()
    bad = job_manifest(uid, "bad")
    bad["spec"]["template"]["spec"]["containers"][0]["name"] = "Not_A_DNS_Label"
    rig.hub.send(rig.cluster, apply(uid, namespace, 1, bad))
    (ack,) = await rig.hub.wait_for(lambda: rig.view.acks_for(uid), what="ack")
    assert (ack.result, ack.retryable) == ("Failed", False)
    assert "Not_A_DNS_Label" in ack.message
    assert "invalid" in ack.message.lower()

    other = new_uid()
    outside = job_manifest(other, "outside")
    outside["metadata"]["namespace"] = "kube-system"
    rig.hub.send(rig.cluster, apply(other, namespace, 1, outside))
    (refused,) = await rig.hub.wait_for(lambda: rig.view.acks_for(other), what="refusal")
    assert refused.result == "Failed"
    assert "differs from the job namespace" in refused.message
    assert await get_job(rig.admin, "kube-system", "outside") is None


async def test_reconcile_after_reconnect(rig: Rig, namespace: str) -> None:
    """Adopt what runs, keep what finished, create what is missing, never re-create a job that
    ran, delete what the hub no longer wants."""
    running, finished, fresh, vanished, orphan = (new_uid() for _ in range(5))
    items = {
        running: apply(running, namespace, 1, job_manifest(running, "running", duration="1h")),
        finished: apply(finished, namespace, 1, job_manifest(finished, "finished", duration="1s")),
        orphan: apply(orphan, namespace, 1, job_manifest(orphan, "orphan", duration="1h")),
        vanished: apply(vanished, namespace, 1, job_manifest(vanished, "vanished", duration="1h")),
    }
    for item in items.values():
        rig.hub.send(rig.cluster, item)
    await rig.hub.wait_for(lambda: all(rig.view.acks_for(u) for u in items), what="acks")
    await final_status(rig, finished, "Succeeded")
    await final_status(rig, running, "Running")
    member_uids = {
        name: (await get_job(rig.admin, namespace, name))["metadata"]["uid"]  # type: ignore[index]
        for name in ("running", "finished")
    }
    # The vanished job is deleted in the member while the agent is disconnected.
    sessions = rig.view.sessions
    port = rig.hub.port
    await rig.hub.stop()
    await rig.admin.request(
        "DELETE",
        f"/apis/batch/v1/namespaces/{namespace}/jobs/vanished",
        body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
    )
    rig.hub.desired[rig.cluster] = [
        items[running].model_copy(update={"applied_before": True}),
        items[finished].model_copy(update={"applied_before": True}),
        items[vanished].model_copy(update={"applied_before": True}),
        apply(fresh, namespace, 1, job_manifest(fresh, "fresh", duration="1h")),
    ]
    try:
        await rig.hub.start(port)
        await rig.hub.wait_for(lambda: rig.view.sessions > sessions, what="reconnect")
        await rig.hub.wait_for(lambda: rig.view.acks_for(fresh), what="fresh applied")
        gone = await final_status(rig, vanished, "Missing")
        assert gone.revision == 1
        await rig.hub.wait_for(
            lambda: len(rig.view.acks_for(running)) >= 2 and len(rig.view.acks_for(finished)) >= 2,
            what="re-acks",
        )
        # finished stays finished (never re-run), running keeps running (same uid)
        assert (await final_status(rig, finished, "Succeeded")).succeeded == 1
        for name in ("running", "finished"):  # the same objects: adopted, not re-created
            job = await get_job(rig.admin, namespace, name)
            assert job is not None
            assert job["metadata"]["uid"] == member_uids[name]
        assert await get_job(rig.admin, namespace, "fresh") is not None
        await poll(
            lambda: get_job(rig.admin, namespace, "orphan"),
            lambda j: j is None or j["metadata"].get("deletionTimestamp"),
        )
        assert await get_job(rig.admin, namespace, "vanished") is None
    finally:
        rig.hub.desired.pop(rig.cluster, None)


async def test_hub_outage_leaves_running_work_alone_and_statuses_resume(
    rig: Rig, namespace: str
) -> None:
    uid = new_uid()
    rig.hub.send(rig.cluster, apply(uid, namespace, 1, job_manifest(uid, "steady", duration="4s")))
    await final_status(rig, uid, "Running")
    before = await get_job(rig.admin, namespace, "steady")
    port = rig.hub.port
    await rig.hub.stop()
    # The job finishes in the member while the hub is away.
    after = await poll(
        lambda: get_job(rig.admin, namespace, "steady"),
        lambda j: j and j["status"].get("succeeded"),
    )
    assert after["metadata"]["uid"] == before["metadata"]["uid"]  # type: ignore[index]
    rig.hub.desired[rig.cluster] = [
        apply(uid, namespace, 1, job_manifest(uid, "steady"), applied_before=True)
    ]
    try:
        await rig.hub.start(port)
        status = await final_status(rig, uid, "Succeeded")
        assert status.succeeded == 1
    finally:
        rig.hub.desired.pop(rig.cluster, None)


async def test_health_and_metrics_endpoints(rig: Rig) -> None:
    port = rig.agent.health_port
    assert port
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
            assert resp.status == 200
        async with http.get(f"http://127.0.0.1:{port}/readyz") as resp:
            assert resp.status == 200
        async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
            text = await resp.text()
    assert "gpufed_agent_hub_connected 1.0" in text
    assert "gpufed_agent_inventory_nodes" in text
    assert 'gpufed_agent_work_acks_total{result="Applied"}' in text


async def test_job_deleted_in_the_member_is_reported_missing_not_recreated(
    rig: Rig, namespace: str
) -> None:
    uid = new_uid()
    rig.hub.send(rig.cluster, apply(uid, namespace, 1, job_manifest(uid, "doomed", duration="1h")))
    await final_status(rig, uid, "Running")
    await rig.admin.request(
        "DELETE",
        f"/apis/batch/v1/namespaces/{namespace}/jobs/doomed",
        body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
    )
    await final_status(rig, uid, "Missing")
    rig.hub.send(rig.cluster, apply(uid, namespace, 2, job_manifest(uid, "doomed", duration="1h")))
    await rig.hub.wait_for(
        lambda: (
            (s := rig.view.latest_status(uid)) is not None
            and s.revision == 2
            and s.phase == "Missing"
        ),
        what="revision 2 Missing",
    )
    assert await get_job(rig.admin, namespace, "doomed") is None
    assert [a.revision for a in rig.view.acks_for(uid)] == [1]


async def test_a_job_its_ttl_controller_deleted_after_it_succeeded_stays_succeeded(
    rig: Rig, namespace: str
) -> None:
    """Issue 24 item 5: the Job (``ttlSecondsAfterFinished: 0``) completes while the hub is
    away, so its Succeeded is not delivered, and the member's TTL controller deletes it at
    once; after the reconnect the hub hears Succeeded (the DELETED event's final state), not
    Missing, also for a later revision, and nothing is re-created."""
    uid = new_uid()
    manifest = job_manifest(uid, "brief", duration="3s")
    manifest["spec"]["ttlSecondsAfterFinished"] = 0
    rig.hub.send(rig.cluster, apply(uid, namespace, 1, manifest))
    await final_status(rig, uid, "Running")
    port = rig.hub.port
    await rig.hub.stop()
    seen = len(rig.view.statuses)
    await poll(lambda: get_job(rig.admin, namespace, "brief"), lambda j: j is None, within=60)
    rig.hub.desired[rig.cluster] = [apply(uid, namespace, 1, manifest, applied_before=True)]
    try:
        await rig.hub.start(port)
        status = await final_status(rig, uid, "Succeeded", within=30)
        assert status.succeeded == 1
        assert [c.type for c in status.conditions][-1] == "Complete"
        assert status.completion_time
        # A later revision goes through the work manager, which finds the Job gone.
        rig.hub.send(rig.cluster, apply(uid, namespace, 2, manifest, applied_before=True))
        again = await rig.hub.wait_for(
            lambda: (s := rig.view.latest_status(uid)) is not None and s.revision == 2 and s,
            what="revision 2 status",
        )
        assert again.phase == "Succeeded"
        after = [s.phase for s in rig.view.statuses[seen:] if s.job_uid == uid]
        assert "Missing" not in after
        assert await get_job(rig.admin, namespace, "brief") is None
    finally:
        rig.hub.desired.pop(rig.cluster, None)


def schema_only_crd(group: str, version: str, kind: str, plural: str) -> dict[str, Any]:
    """A CRD of ``kind`` that accepts any object (no controller runs for it)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "plural": plural,
                "singular": kind.lower(),
                "kind": kind,
                "listKind": f"{kind}List",
            },
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


JOBSET_CRD = schema_only_crd("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")
RAYJOB_CRD = schema_only_crd("ray.io", "v1", "RayJob", "rayjobs")
_POD = {"spec": {"containers": [{"name": "c", "image": "ray"}]}}
KINDS = {
    # kind: (CRD, the object applied, the status the operator would write, succeeded pods)
    "JobSet.jobset.x-k8s.io": (
        JOBSET_CRD,
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2}]},
        },
        {
            "replicatedJobsStatus": [
                {"name": "workers", "succeeded": 2, "active": 0, "failed": 0, "ready": 0}
            ],
            "conditions": [
                {
                    "type": "Completed",
                    "status": "True",
                    "reason": "AllJobsCompleted",
                    "message": "jobset completed successfully",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        },
        (2, "AllJobsCompleted"),
    ),
    # KubeRay writes states, not conditions: the agent derives a Succeeded condition
    "RayJob.ray.io": (
        RAYJOB_CRD,
        {
            "apiVersion": "ray.io/v1",
            "kind": "RayJob",
            "spec": {
                "entrypoint": "python tune.py",
                "rayClusterSpec": {
                    "headGroupSpec": {"template": _POD},
                    "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "template": _POD}],
                },
            },
        },
        {
            "jobDeploymentStatus": "Complete",
            "jobStatus": "SUCCEEDED",
            "startTime": "2026-01-01T00:00:00Z",
            "endTime": "2026-01-01T00:10:00Z",
        },
        (0, "SUCCEEDED"),
    ),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_a_newly_installed_workload_kind_is_discovered_applied_and_summarised(
    rig: Rig, namespace: str, kind: str
) -> None:
    """A workload CRD (schema only, no controller) installed while the agent runs: served after
    the next connect, applied with server-side apply, its status summarised."""
    crd, body, status, (succeeded, reason) = KINDS[kind]
    crd_path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
    await rig.admin.request(
        "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd
    )
    try:
        await poll(
            lambda: rig.admin.request("GET", crd_path),
            lambda crd: any(
                c["type"] == "Established" and c["status"] == "True"
                for c in (crd.get("status") or {}).get("conditions") or []
            ),
        )
        sessions = rig.view.sessions
        rig.hub.drop(rig.cluster)
        await rig.hub.wait_for(
            lambda: rig.view.sessions > sessions and rig.view.snapshots, what="reconnect"
        )
        await rig.hub.wait_for(lambda: kind in rig.view.served_kinds, what=f"{kind} served")
        assert rig.view.hello is not None
        assert kind in rig.view.hello.served_kinds

        uid = new_uid()
        obj = {**body, "metadata": {"name": "w", "labels": {UID_LABEL: uid}}}
        rig.hub.send(rig.cluster, apply(uid, namespace, 1, obj))
        (ack,) = await rig.hub.wait_for(lambda: rig.view.acks_for(uid), what="ack")
        assert ack.result == "Applied"
        spec = crd["spec"]
        path = (
            f"/apis/{spec['group']}/{spec['versions'][0]['name']}/namespaces/{namespace}/"
            f"{spec['names']['plural']}/w"
        )
        obj = await rig.admin.request("GET", path)
        assert [m["manager"] for m in obj["metadata"]["managedFields"]] == ["gpufed"]
        assert (await final_status(rig, uid, "Pending")).kind == kind
        await rig.admin.request(
            "PATCH",
            f"{path}/status",
            body={"status": status},
            content_type="application/merge-patch+json",
        )
        done = await final_status(rig, uid, "Succeeded")
        assert (done.succeeded, done.conditions[0].reason) == (succeeded, reason)
    finally:
        await rig.admin.request("DELETE", crd_path)
