"""A member that stops reporting: NotReady after its lease, then lost; its jobs become Lost or
are placed again (``reschedule: OnClusterLoss``) and the old copy is fenced on reconnect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufed.api.protocol import agent_pb2 as pb
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


async def test_a_lost_member_loses_or_reschedules_its_jobs_and_is_fenced_on_return(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    t1 = await hub_api.register_member("m1", labels={"zone": "a"})
    t2 = await hub_api.register_member("m2", labels={"zone": "b"})
    ca = tmp_path / "tls" / "ca.crt"
    cfg = hub_config(
        tmp_path, hub_kubeconfig, etcd_endpoint, prefix, member_lease_s=1.5, member_lost_s=4.0
    )
    async with running_hub(cfg) as hub:
        m1 = FakeAgent(hub.grpc_port, "m1", t1, ca)
        await m1.connect(nodes=hgx_nodes("m1-hgx", 3))
        only_m1 = {"clusterSelector": {"matchLabels": {"zone": "a"}}}
        await hub_api.create_job("stay", gpu_job(8), placement=only_m1)
        await hub_api.create_job("move", gpu_job(8), placement={"reschedule": "OnClusterLoss"})
        await hub_api.create_job("gone", gpu_job(8), placement=only_m1)
        items = {}
        for _ in range(3):
            item = await m1.next("work_item")
            items[item.job.split("/")[1]] = item
            await m1.ack(item)
        await m1.report(items["stay"], "Running", active=1)
        await wait_for(lambda: _phase(hub_api, "stay", "Running"), "stay Running")
        for name in ("move", "gone"):
            await wait_for(lambda n=name: _dispatched(hub_api, n), f"{name} dispatched")

        # m1 goes silent (its agent dies without a word).
        await m1.close()
        await wait_for(lambda: _ready(hub_api, "m1", "False"), "m1 NotReady")
        assert await hub_api.phase("stay") == "Running", "NotReady alone changes no job"

        # After the member-lost timeout: Lost (Never) / Pending again (OnClusterLoss).
        obj = await wait_for(lambda: _phase(hub_api, "stay", "Lost"), "stay Lost", limit_s=30)
        lost = next(c for c in obj["status"]["conditions"] if c["type"] == "ClusterLost")
        assert "reschedule: Never" in lost["message"]
        member = await hub_api.member("m1")
        ready = next(c for c in member["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "ClusterLost")

        # A job on a lost member is deleted at once: nobody can confirm, the member is lost.
        await hub_api.delete_job("gone")
        await wait_for(lambda: _gone(hub_api, "gone"), "gone deleted without the agent")

        # m2 arrives: the rescheduled job goes there.
        m2 = FakeAgent(hub.grpc_port, "m2", t2, ca)
        await m2.connect(nodes=hgx_nodes("m2-hgx", 1))
        moved = await m2.next("work_item")
        assert moved.job == "team-a/move"
        assert moved.job_uid == items["move"].job_uid
        await m2.ack(moved)
        # Placed on m2, not the Placed on m1 of before the loss: a non-terminal status is
        # written status_hold_s after it changed, so the API may still show that one.
        obj = await wait_for(lambda: _placed_on(hub_api, "move", "m2"), "move placed on m2")
        assert obj["status"]["cluster"] == "m2"
        assert hub.store is not None
        record = (await hub.store.load()).jobs[moved.job_uid]
        assert (record.cluster, record.attempt) == ("m2", 2)

        # m1 returns: its desired set leaves out the moved and the deleted job (so the agent
        # deletes their old copies first), keeps the Lost one; explicit deletes follow.
        m1 = FakeAgent(hub.grpc_port, "m1", t1, ca)
        await m1.connect(nodes=hgx_nodes("m1-hgx", 3))
        await m1.next("welcome")
        desired = await m1.next("desired_set")
        assert [i.job for i in desired.items] == ["team-a/stay"]
        assert desired.items[0].applied_before
        deletes = [await m1.next("work_item"), await m1.next("work_item")]
        assert {(d.job, d.op) for d in deletes} == {
            ("team-a/move", pb.WorkItem.DELETE),
            ("team-a/gone", pb.WorkItem.DELETE),
        }
        for d in deletes:
            await m1.ack(d, pb.WorkAck.DELETED)
        await wait_for(lambda: _ready(hub_api, "m1", "True"), "m1 Ready again")

        async def fenced() -> bool:
            assert hub.store is not None
            work = (await hub.store.load()).work
            return set(work) == {("m1", items["stay"].job_uid), ("m2", moved.job_uid)}

        await wait_for(fenced, "old copies forgotten after the agent deleted them")
        assert await hub_api.phase("stay") == "Lost", "Lost is final"
        await m1.report(items["stay"], "Succeeded")
        assert await hub_api.phase("stay") == "Lost"
        await m1.close()
        await m2.close()


async def _ready(api: HubAPI, name: str, want: str) -> bool:
    member = await api.member(name)
    for c in (member.get("status") or {}).get("conditions") or []:
        if c["type"] == "Ready":
            return bool(c["status"] == want)
    return False


async def _phase(api: HubAPI, name: str, phase: str) -> dict[str, Any] | None:
    obj = await api.job(name)
    return obj if obj and (obj.get("status") or {}).get("phase") == phase else None


async def _placed_on(api: HubAPI, name: str, cluster: str) -> dict[str, Any] | None:
    obj = await _phase(api, name, "Placed")
    return obj if obj and obj["status"].get("cluster") == cluster else None


async def _dispatched(api: HubAPI, name: str) -> bool:
    obj = await api.job(name)
    conds = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Dispatched" and c["status"] == "True" for c in conds)


async def _gone(api: HubAPI, name: str) -> bool:
    return await api.job(name) is None
