"""The hub end to end against real etcd, a real hub API server and a fake agent over gRPC.

Intake -> decision -> work item in etcd -> dispatch -> ack -> status mirroring -> deletion
with the finalizer; a hub restart resumes without creating anything twice.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufed.api.labels import FINALIZER, JOB_UID_LABEL, ORIGIN_LABEL
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol.codec import node_to_pb
from gpufed.hub.adapters.store import Store
from tests.integration.hub.harness import (
    FakeAgent,
    HubAPI,
    gpu_job,
    hgx_nodes,
    hub_config,
    running_hub,
    wait_for,
)

pytestmark = pytest.mark.integration


async def test_a_job_is_placed_dispatched_mirrored_and_deleted(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    token = await hub_api.register_member("m1", labels={"region": "us-east"})
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix)
    async with running_hub(cfg) as hub:
        agent = FakeAgent(hub.grpc_port, "m1", token, tmp_path / "tls" / "ca.crt")
        await agent.connect(nodes=hgx_nodes("m1-hgx", 2))
        welcome = await agent.next("welcome")
        assert welcome.cluster == "m1"
        assert (await agent.next("desired_set")).final

        job = await hub_api.create_job(
            "llama", gpu_job(8, pods=2), placement={"topology": {"nvlink": "Preferred"}}
        )
        uid = job["metadata"]["uid"]

        # 1. intake -> decision -> one work item in etcd, sent on the member's stream
        item = await agent.next("work_item")
        assert (item.job_uid, item.op, item.namespace) == (uid, pb.WorkItem.APPLY, "team-a")
        assert item.job == "team-a/llama"
        (manifest,) = [json.loads(m) for m in item.manifests]
        assert manifest["metadata"]["labels"][JOB_UID_LABEL] == uid
        assert manifest["metadata"]["labels"][ORIGIN_LABEL] == "gpufed-hub"
        pod_labels = manifest["spec"]["template"]["metadata"]["labels"]
        assert pod_labels[JOB_UID_LABEL] == uid
        terms = manifest["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert terms[0]["matchExpressions"] == [
            {
                "key": "kubernetes.io/hostname",
                "operator": "In",
                "values": ["m1-hgx-0", "m1-hgx-1"],
            }
        ]
        assert hub.store is not None
        loaded = await hub.store.load()
        assert loaded.work[("m1", uid)][1] == item.revision
        assert loaded.jobs[uid].cluster == "m1"
        assert uid in loaded.reservations

        obj = await wait_for(
            lambda: _status_where(hub_api, "llama", lambda s: s.get("phase") == "Placed"),
            "phase Placed",
        )
        assert obj["status"]["cluster"] == "m1"
        assert obj["status"]["gpus"] == 16
        assert obj["status"]["placement"]["outcome"] == "Placed"
        assert FINALIZER in obj["metadata"]["finalizers"]
        await wait_for(
            lambda: _reserved_is(hub_api, "m1", {"NVIDIA-H100-80GB-HBM3": 16}),
            "MemberCluster m1 shows the 16 reserved GPUs",
        )

        # 2. ack -> Dispatched; member status -> Running -> Succeeded, conditions in order
        await agent.ack(item)
        await wait_for(
            lambda: _status_where(hub_api, "llama", lambda s: _cond(s, "Dispatched") == "True"),
            "Dispatched=True",
        )
        await agent.report(item, "Running", active=2, ready=2, start_time="2026-01-01T00:00:00Z")
        await wait_for(lambda: _phase_is(hub_api, "llama", "Running"), "phase Running")
        conditions = [
            pb.Condition(type="SuccessCriteriaMet", status="True", reason="CompletionsReached"),
            pb.Condition(type="Complete", status="True", reason="CompletionsReached"),
        ]
        await agent.report(
            item,
            "Succeeded",
            succeeded=2,
            conditions=conditions,
            start_time="2026-01-01T00:00:00Z",
            completion_time="2026-01-01T00:05:00Z",
        )
        obj = await wait_for(lambda: _phase_is(hub_api, "llama", "Succeeded"), "Succeeded")
        status = obj["status"]
        types = [c["type"] for c in status["conditions"]]
        assert types == [
            "Valid",
            "Placed",
            "Dispatched",
            "Finished",
            "SuccessCriteriaMet",
            "Complete",
        ]
        # KEP-1623 conditions, accepted by the real API server's CRD schema: the
        # kind-independent Finished (what `kubectl wait --for=condition=Finished` reads), a
        # reason on each, and the generation each was computed from.
        by_type = {c["type"]: c for c in status["conditions"]}
        assert (by_type["Finished"]["status"], by_type["Finished"]["reason"]) == (
            "True",
            "Succeeded",
        )
        generation = obj["metadata"]["generation"]
        assert all(c["reason"] and c["lastTransitionTime"] for c in status["conditions"])
        assert {c["observedGeneration"] for c in status["conditions"]} == {generation}
        assert status["succeeded"] == 2
        assert status["completionTime"] == "2026-01-01T00:05:00Z"
        assert status["timings"]["placementMs"] >= 0
        assert status["timings"]["dispatchMs"] >= 0
        # The finished job's reservation is released: the product leaves gpusReserved (a
        # merge patch of the status used to keep the old key forever).
        await wait_for(
            lambda: _reserved_is(hub_api, "m1", {}), "MemberCluster m1 shows nothing reserved"
        )

        # 3. terminal phases are final: a later report does not move it
        await agent.report(item, "Running", active=1)
        await agent.send(pb.AgentMessage(heartbeat=pb.Heartbeat(inventory_seq=1)))
        assert hub.controller is not None
        await hub.controller.mirror.jobs.drained()
        assert await hub_api.phase("llama") == "Succeeded"

        # 4. deletion: a Delete work item with a newer revision; the finalizer stays until
        #    the agent confirms, then the GPUJob is gone and etcd forgets it
        await hub_api.delete_job("llama")
        delete = await agent.next("work_item")
        assert (delete.job_uid, delete.op) == (uid, pb.WorkItem.DELETE)
        assert delete.revision > item.revision
        assert delete.applied_before
        still = await hub_api.job("llama")
        assert still is not None
        assert FINALIZER in still["metadata"]["finalizers"]
        await agent.ack(delete, pb.WorkAck.DELETED)
        await wait_for(lambda: _gone(hub_api, "llama"), "the GPUJob to be deleted")
        loaded = await hub.store.load()
        assert ("m1", uid) not in loaded.work
        assert uid not in loaded.jobs
        assert uid not in loaded.reservations

        events = {e.reason for e in await hub_api.events("llama")}
        assert {"Placed", "Running", "Succeeded"} <= events
        await agent.close()


async def test_a_placed_job_on_a_small_fleet_records_why_every_other_member_lost(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    """`gpufed explain` of a placed job names each losing member and why (fleets of at most
    `--explain-members` members), not just the winner."""
    t1 = await hub_api.register_member("m1")
    t2 = await hub_api.register_member("m2")
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix)
    async with running_hub(cfg) as hub:
        agents = []
        for name, token, nodes in (("m1", t1, 2), ("m2", t2, 1)):
            agent = FakeAgent(hub.grpc_port, name, token, tmp_path / "tls" / "ca.crt")
            await agent.connect(nodes=hgx_nodes(f"{name}-hgx", nodes))
            await agent.next("welcome")
            assert (await agent.next("desired_set")).final
            agents.append(agent)

        await hub_api.create_job("wide", gpu_job(8, pods=2))
        obj = await wait_for(
            lambda: _status_where(hub_api, "wide", lambda s: s.get("phase") == "Placed"),
            "phase Placed",
        )
        placement = obj["status"]["placement"]
        assert placement["cluster"] == "m1"
        assert [r["cluster"] for r in placement.get("rejections", [])] == ["m2"]
        for agent in agents:
            await agent.close()


async def test_a_restarted_hub_resumes_without_creating_work_twice(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    token = await hub_api.register_member("m1")
    ca = tmp_path / "tls" / "ca.crt"
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix)
    async with running_hub(cfg) as hub:
        agent = FakeAgent(hub.grpc_port, "m1", token, ca)
        await agent.connect(nodes=hgx_nodes("m1-hgx", 2))
        for name in ("a", "b"):
            await hub_api.create_job(name, gpu_job(8))
        first = sorted(
            [await agent.next("work_item"), await agent.next("work_item")], key=lambda i: i.job
        )
        await agent.ack(first[0])  # team-a/b stays unacknowledged across the restart
        await wait_for(
            lambda: _status_where(hub_api, "a", lambda s: _cond(s, "Dispatched") == "True"),
            "a dispatched",
        )
        assert hub.store is not None
        before = await hub.store.load()
        await agent.close()

    # The hub is down; a new hub process starts on the same etcd state.
    async with running_hub(cfg) as hub:
        agent = FakeAgent(hub.grpc_port, "m1", token, ca)
        await agent.connect(nodes=hgx_nodes("m1-hgx", 2))
        await agent.next("welcome")
        desired = await agent.next("desired_set")
        by_uid = {i.job_uid: i for i in desired.items}
        assert set(by_uid) == {i.job_uid for i in first}
        for old in first:
            assert by_uid[old.job_uid].revision == old.revision, "no new revision after restart"
        assert by_uid[first[0].job_uid].applied_before
        assert not by_uid[first[1].job_uid].applied_before
        assert hub.store is not None
        after = await hub.store.load()
        assert after.jobs.keys() == before.jobs.keys()
        assert {k: v[1] for k, v in after.work.items()} == {k: v[1] for k, v in before.work.items()}
        # A new job after the restart is placed once, on the capacity left.
        await hub_api.create_job("c", gpu_job(8, pods=2))
        obj = await wait_for(
            lambda: _status_where(hub_api, "c", lambda s: bool(s.get("placement"))), "c decided"
        )
        assert obj["status"]["placement"]["outcome"] == "Unschedulable", (
            "the reservation of b and the running a still hold both nodes"
        )
        await agent.close()


async def test_an_invalid_job_gets_a_condition_and_event_naming_the_field(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    await hub_api.register_member("m1")
    template = gpu_job(8)
    template["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/gpu": "0.5"
    }
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "x"},
    }
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix)
    async with running_hub(cfg):
        await hub_api.create_job("half-gpu", template)
        await hub_api.create_job(
            "escape", {"apiVersion": "v1", "kind": "List", "items": [gpu_job(1), role]}
        )
        obj = await wait_for(lambda: _phase_is(hub_api, "half-gpu", "Failed"), "half-gpu Failed")
        valid = next(c for c in obj["status"]["conditions"] if c["type"] == "Valid")
        assert valid["status"] == "False"
        assert "containers[0].resources.limits.nvidia.com/gpu" in valid["message"]
        obj = await wait_for(lambda: _phase_is(hub_api, "escape", "Failed"), "escape Failed")
        assert "spec.template.items[1].kind" in obj["status"]["message"]
        assert "ClusterRole" in obj["status"]["message"]
        evs = await wait_for(lambda: hub_api.events("half-gpu"), "an Event")
        assert any(e.reason == "InvalidSpec" and "nvidia.com/gpu" in e.message for e in evs)


async def test_the_crd_schema_refuses_bad_specs_at_apply(hub_api: HubAPI) -> None:
    from kubernetes_asyncio.client import ApiException

    with pytest.raises(ApiException) as err:
        await hub_api.create_job("bad", gpu_job(8), placement={"topology": {"nvlink": "Always"}})
    assert err.value.status == 422
    assert "spec.placement.topology.nvlink" in err.value.body
    with pytest.raises(ApiException) as err:
        await hub_api.create_job("bad", {"apiVersion": "v1", "kind": "List", "items": []})
    assert "non-empty items" in err.value.body
    job = await hub_api.create_job("ok", gpu_job(8))
    job["spec"]["placement"]["priority"] = 7
    with pytest.raises(ApiException) as err:
        await hub_api.custom.replace_namespaced_custom_object(
            "gpufed.io", "v1alpha1", "team-a", "gpujobs", "ok", job
        )
    assert "spec is immutable" in err.value.body


# --- helpers ---------------------------------------------------------------------------------


def _cond(status: dict, type_: str) -> str | None:  # type: ignore[type-arg]
    for c in status.get("conditions") or []:
        if c["type"] == type_:
            return str(c["status"])
    return None


async def _status_where(api: HubAPI, name: str, pred: object) -> dict | None:  # type: ignore[type-arg]
    obj = await api.job(name)
    status = (obj or {}).get("status") or {}
    return obj if obj and pred(status) else None  # type: ignore[operator]


async def _phase_is(api: HubAPI, name: str, phase: str) -> dict | None:  # type: ignore[type-arg]
    obj = await api.job(name)
    return obj if obj and (obj.get("status") or {}).get("phase") == phase else None


async def _gone(api: HubAPI, name: str) -> bool:
    return await api.job(name) is None


async def _store_of(prefix: str, endpoint: str) -> Store:
    return await Store.connect([endpoint], prefix=prefix, hub_id="reader")


async def _reserved_is(hub_api: HubAPI, member: str, want: dict[str, int]) -> bool:
    status = (await hub_api.member(member)).get("status") or {}
    return bool(status.get("gpusReserved", {}) == want)


async def test_a_settled_reservation_leaves_etcd_only_after_the_inventory_that_covers_it(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    # The e2e burst drill: a hub killed just after a reservation settled restarted from a
    # stored inventory older than the bound pods and an empty ledger, and booked the node twice.
    token = await hub_api.register_member("m1")
    ca = tmp_path / "tls" / "ca.crt"
    # No periodic flush during the test: only the settle itself may write the inventory.
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix, inventory_flush_s=3600)
    async with running_hub(cfg) as hub:
        agent = FakeAgent(hub.grpc_port, "m1", token, ca)
        (node,) = hgx_nodes("m1-hgx", 1)
        await agent.connect(nodes=[node])
        await hub_api.create_job("a", gpu_job(8))
        item = await agent.next("work_item")
        await agent.ack(item)
        assert hub.store is not None
        store = hub.store
        assert (await store.load()).reservations.keys() == {item.job_uid}
        bound = node.model_copy(
            update={
                "requested": {"nvidia.com/gpu": 8},
                "job_requests": {item.job_uid: {"nvidia.com/gpu": 8}},
            }
        )
        await agent.send(
            pb.AgentMessage(inventory_delta=pb.InventoryDelta(seq=2, upserts=[node_to_pb(bound)]))
        )

        async def settled() -> bool:
            return not (await store.load()).reservations

        await wait_for(settled, "the reservation settled and deleted")
        stored = (await store.load()).nodes.get("m1", {}).get("m1-hgx-0")
        assert stored is not None, "the inventory that covers the pods was never written"
        assert stored.requested.get("nvidia.com/gpu") == 8, "the GPUs are used in etcd somewhere"
        await agent.close()
