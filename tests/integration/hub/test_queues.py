"""GPUQueues on a real hub API server and real etcd: the hub admits by quota, writes the
GPUQueue status, and a restarted hub rebuilds quota usage from etcd without doubling it; a
raised quota admits the waiting job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.hub.harness import (
    H100,
    FakeAgent,
    HubAPI,
    gpu_job,
    hgx_nodes,
    hub_config,
    running_hub,
    wait_for,
)

pytestmark = pytest.mark.integration


def team_a(nominal: int) -> dict[str, Any]:
    return {"namespaces": ["team-a"], "quotas": [{"gpuProduct": H100, "nominal": nominal}]}


async def test_quota_admission_status_and_a_restart_that_rebuilds_usage_once(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    await hub_api.put_queue("team-a", team_a(8))
    token = await hub_api.register_member("m1")
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix)
    ca = tmp_path / "tls" / "ca.crt"

    async def queue_status(check: Any) -> dict[str, Any] | None:
        status = (await hub_api.queue("team-a")).get("status") or {}
        return status if check(status) else None

    async with running_hub(cfg) as hub:
        agent = FakeAgent(hub.grpc_port, "m1", token, ca)
        await agent.connect(nodes=hgx_nodes("m1-hgx", 3))
        await hub_api.create_job("a", gpu_job(8))
        first = await agent.next("work_item")
        await hub_api.create_job("b", gpu_job(8))
        status = await wait_for(
            lambda: queue_status(lambda s: s.get("pendingJobs") == 1), "team-a: 1 pending"
        )
        assert status["usage"] == [{"gpuProduct": H100, "nominal": 8, "used": 8, "borrowed": 0}]
        assert status["admittedJobs"] == 1
        active = next(c for c in status["conditions"] if c["type"] == "Active")
        assert active["status"] == "True"

        async def b_waits() -> dict[str, Any] | None:
            b = await hub_api.job("b")
            message = ((b or {}).get("status") or {}).get("message", "")
            return b if "team-a uses 8 of 8" in message else None

        # (the job's status is written status_hold_s after it changed, the queue's at once)
        await wait_for(b_waits, "job b waiting for team-a's quota")
        assert hub.store is not None
        records = (await hub.store.load()).jobs
        assert [(r.queue, r.charged) for r in records.values()] == [("team-a", {H100: 8})]
        await agent.close()

    # A new leader term over the same etcd: usage is rebuilt from the job record, once.
    async with running_hub(cfg) as hub:
        agent = FakeAgent(hub.grpc_port, "m1", token, ca)
        await agent.connect(nodes=hgx_nodes("m1-hgx", 3))
        ctrl = hub.controller
        assert ctrl is not None

        async def rebuilt() -> dict[str, Any] | None:
            shown = ctrl.queues.shown.get("team-a")
            return shown.model_dump(by_alias=True) if shown is not None else None

        shown = await wait_for(rebuilt, "the new term's team-a status")
        assert [(u["used"], u["nominal"]) for u in shown["usage"]] == [(8, 8)]
        assert (shown["pendingJobs"], shown["admittedJobs"]) == (1, 1)
        assert await hub_api.phase("b") == "Pending"
        # raised to 16: the waiting job is admitted at the next cycle, usage 16 of 16
        await hub_api.put_queue("team-a", team_a(16))
        second = await agent.next("work_item")
        assert second.job_uid != first.job_uid
        await wait_for(
            lambda: queue_status(
                lambda s: (
                    [u["used"] for u in s.get("usage", [])] == [16] and s.get("admittedJobs") == 2
                )
            ),
            "team-a: 16 of 16 used",
        )
        assert hub.store is not None
        assert len((await hub.store.load()).jobs) == 2
        await agent.close()


async def test_a_broken_queue_is_inactive_naming_the_field_and_its_jobs_wait(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    await hub_api.put_queue("team-a", {**team_a(8), "parent": "no-such-org"})
    token = await hub_api.register_member("m1")
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix)
    async with running_hub(cfg) as hub:
        agent = FakeAgent(hub.grpc_port, "m1", token, tmp_path / "tls" / "ca.crt")
        await agent.connect(nodes=hgx_nodes("m1-hgx", 1))
        await hub_api.create_job("a", gpu_job(8))

        async def inactive() -> dict[str, Any] | None:
            status = (await hub_api.queue("team-a")).get("status") or {}
            conds = [c for c in status.get("conditions", []) if c["type"] == "Active"]
            return conds[0] if conds and conds[0]["status"] == "False" else None

        active = await wait_for(inactive, "team-a Active=False")
        assert active["message"].startswith("spec.parent: queue no-such-org does not exist")

        async def waiting() -> str | None:
            job = await hub_api.job("a")
            message = str(((job or {}).get("status") or {}).get("message", ""))
            return message if "is not active" in message else None

        assert "queue team-a is not active: spec.parent" in await wait_for(waiting, "a waits")
        assert hub.controller is not None
        assert not hub.controller.stopped, "a broken queue ends nothing"
        await agent.close()


async def test_reject_refuses_a_job_of_an_unlisted_namespace_until_a_queue_lists_it(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    """--unlisted-namespaces reject: a GPUJob in team-a, which no GPUQueue lists, stays Pending
    with Placed=False NamespaceNotListed naming the namespace and the fix, and nothing reaches
    the member; listing team-a in a GPUQueue places it."""
    await hub_api.put_queue("team-b", {"namespaces": ["team-b"]})
    token = await hub_api.register_member("m1")
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix, unlisted_namespaces="reject")
    ca = tmp_path / "tls" / "ca.crt"

    async def refused() -> dict[str, Any] | None:
        status = ((await hub_api.job("a")) or {}).get("status") or {}
        placed = [c for c in status.get("conditions", []) if c["type"] == "Placed"]
        return placed[0] if placed and placed[0]["reason"] == "NamespaceNotListed" else None

    async with running_hub(cfg) as hub:
        agent = FakeAgent(hub.grpc_port, "m1", token, ca)
        await agent.connect(nodes=hgx_nodes("m1-hgx", 1))
        await hub_api.create_job("a", gpu_job(8))
        placed = await wait_for(refused, "job a refused: NamespaceNotListed")
        assert placed["status"] == "False"
        assert "namespace team-a is listed by no GPUQueue" in placed["message"]
        assert placed["message"].endswith(
            "list namespace team-a in a GPUQueue's spec.namespaces, or run the hub with "
            "--unlisted-namespaces default-queue"
        )
        assert await hub_api.phase("a") == "Pending"
        assert hub.store is not None
        assert (await hub.store.load()).jobs == {}, "nothing placed"
        # The administrator lists team-a: the job is judged again and placed.
        await hub_api.put_queue("team-b", {"namespaces": ["team-b", "team-a"]})
        item = await agent.next("work_item")
        job = await hub_api.job("a")
        assert job is not None
        assert item.job_uid == job["metadata"]["uid"]
        await agent.close()
