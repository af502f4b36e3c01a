"""PriorityClasses on a real hub API server and real etcd: a GPUJob naming a PriorityClass that
does not exist waits (Pending, the message names the class), is placed as soon as the class is
created (the hub's PriorityClass watch), and its job record keeps the class's value."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

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

CLASS = "gpufed-itest-prod"


async def test_a_job_waits_for_its_priorityclass_and_is_placed_once_it_exists(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    scheduling = client.SchedulingV1Api(hub_api.api)
    with contextlib.suppress(client.ApiException):
        await scheduling.delete_priority_class(CLASS)
    token = await hub_api.register_member("m1")
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix)
    try:
        async with running_hub(cfg) as hub:
            agent = FakeAgent(hub.grpc_port, "m1", token, tmp_path / "tls" / "ca.crt")
            await agent.connect(nodes=hgx_nodes("m1-hgx", 1))
            await hub_api.create_job("a", gpu_job(8), placement={"priorityClassName": CLASS})

            async def waiting() -> dict[str, Any] | None:
                status = ((await hub_api.job("a")) or {}).get("status") or {}
                return status if "PriorityClass" in status.get("message", "") else None

            status = await wait_for(waiting, "job a waiting for its PriorityClass")
            assert status["phase"] == "Pending"
            assert (
                f"PriorityClass {CLASS} (spec.placement.priorityClassName)" in (status["message"])
            )
            placed = next(c for c in status["conditions"] if c["type"] == "Placed")
            assert (placed["status"], placed["reason"]) == ("False", "PriorityClassNotFound")
            assert hub.store is not None
            assert (await hub.store.load()).jobs == {}

            await scheduling.create_priority_class(
                {"metadata": {"name": CLASS}, "value": 100_000, "preemptionPolicy": "Never"}
            )
            item = await agent.next("work_item")
            job = await hub_api.job("a")
            assert job is not None
            assert item.job_uid == job["metadata"]["uid"]
            records = (await hub.store.load()).jobs
            assert [(r.priority, r.preemption_policy) for r in records.values()] == [
                (100_000, "Never")
            ]
            await agent.close()
    finally:
        with contextlib.suppress(client.ApiException):
            await scheduling.delete_priority_class(CLASS)
