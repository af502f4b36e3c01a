"""Time limits at the hub against real etcd, a real hub API server and a fake agent over gRPC
(issue 29): a short job with a time limit runs in the nodes held for a starving big job and
`gpufed explain` names the hold, a job without a limit does not; a running copy is stopped at
its limit (Failed, TimeLimitExceeded, a Delete sent to its member)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpufed.api.protocol import agent_pb2 as pb
from gpufed.cli.jobs import explain_text
from gpufed.hub.rules import status as st
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

#: Seconds a job waits before it starves and holds nodes (and goes oldest first).
STARVE_S = 2.0


async def _status_where(
    api: HubAPI, name: str, check: Callable[[dict[str, Any]], bool]
) -> dict[str, Any] | None:
    obj = await api.job(name)
    status = (obj or {}).get("status") or {}
    return obj if obj is not None and check(status) else None


async def _apply_of(agent: FakeAgent, uid: str) -> pb.WorkItem:
    """The next Apply work item for job ``uid`` (others are skipped)."""
    while True:
        item = await agent.next("work_item")
        if item.job_uid == uid and item.op == pb.WorkItem.APPLY:
            return item


async def test_a_short_job_with_a_limit_runs_in_a_hold_and_one_without_a_limit_waits(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    token = await hub_api.register_member("m1")
    cfg = hub_config(
        tmp_path,
        hub_kubeconfig,
        etcd_endpoint,
        prefix,
        queue_starvation_s=STARVE_S,
        queue_oldest_first_s=STARVE_S,
    )
    async with running_hub(cfg) as hub:
        agent = FakeAgent(hub.grpc_port, "m1", token, tmp_path / "tls" / "ca.crt")
        await agent.connect(nodes=hgx_nodes("m1-hgx", 2))
        # a (4 GPUs, 1,000 s) and b (8 GPUs, 2,000 s) run on the two nodes
        started = st.rfc3339(time.time())
        for name, gpus, limit in (("a", 4, 1000), ("b", 8, 2000)):
            job = await hub_api.create_job(
                name, gpu_job(gpus), placement={"timeLimitSeconds": limit}
            )
            item = await _apply_of(agent, job["metadata"]["uid"])
            await agent.ack(item)
            await agent.report(item, "Running", active=1, ready=1, start_time=started)
        # c (2 x 8 GPUs) waits, then starves and holds both nodes
        await hub_api.create_job("c", gpu_job(8, pods=2))
        await wait_for(
            lambda: _status_where(hub_api, "c", lambda s: "now" in s.get("message", "")),
            "c waiting for room",
        )
        await asyncio.sleep(STARVE_S + 0.5)
        # d (2 GPUs, 500 s) ends long before c could start (b's end): it runs in the hold
        d = await hub_api.create_job("d", gpu_job(2), placement={"timeLimitSeconds": 500})
        item = await _apply_of(agent, d["metadata"]["uid"])
        (manifest,) = [json.loads(m) for m in item.manifests]
        assert manifest["spec"]["activeDeadlineSeconds"] == 500, "the member stops it too"
        placed = await wait_for(
            lambda: _status_where(hub_api, "d", lambda s: s.get("phase") == "Placed"),
            "d placed",
        )
        text = explain_text(placed)
        assert "backfill: runs on nodes held for team-a/c" in text, text
        assert "its time limit (500 s) ends" in text, text
        # e (2 GPUs, no limit): the 2 free GPUs are held for c, and e may not borrow them
        await hub_api.create_job("e", gpu_job(2))
        waiting = await wait_for(
            lambda: _status_where(hub_api, "e", lambda s: "held for team-a/c" in str(s)),
            "e kept out of the hold",
        )
        assert waiting["status"]["phase"] == "Pending"
        await asyncio.sleep(1.0)  # and it stays out: more cycles place nothing there
        assert await hub_api.phase("e") == "Pending"
        assert await hub_api.phase("c") == "Pending"
        await agent.close()


async def test_a_running_copy_is_stopped_at_its_time_limit(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    token = await hub_api.register_member("m1")
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix)
    async with running_hub(cfg) as hub:
        agent = FakeAgent(hub.grpc_port, "m1", token, tmp_path / "tls" / "ca.crt")
        await agent.connect(nodes=hgx_nodes("m1-hgx", 1))
        job = await hub_api.create_job("short", gpu_job(8), placement={"timeLimitSeconds": 3})
        uid = job["metadata"]["uid"]
        item = await _apply_of(agent, uid)
        await agent.ack(item)
        await agent.report(item, "Running", active=1, ready=1, start_time=st.rfc3339(time.time()))
        while True:  # the hub deletes the member copy once the limit passed
            gone = await agent.next("work_item")
            if gone.job_uid == uid and gone.op == pb.WorkItem.DELETE:
                break
        failed = await wait_for(
            lambda: _status_where(hub_api, "short", lambda s: s.get("phase") == "Failed"),
            "the job Failed at its time limit",
        )
        by_type = {c["type"]: c for c in failed["status"]["conditions"]}
        assert by_type["TimeLimitExceeded"]["status"] == "True"
        assert "stopped at its time limit" in explain_text(failed)
        assert not failed["status"].get("restarts"), "no re-run"
        await agent.close()
