"""Issue 10 items 7 and 8 against a real hub API server and etcd (the session sandbox).

- Rotating a member's join token closes its open stream at once and the old token is refused
  (the hub watches the labelled token Secrets; before, a rotated token kept working).
- An ex-leader's pending status write does not land after the new leader wrote (the
  resourceVersion precondition and the fence), and a stale status that lands anyway is
  corrected by the leader's periodic resync.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpufed.hub.adapters.kube import KubeAPI
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.components.config import HubConfig
from gpufed.hub.components.core import Controller
from gpufed.hub.components.metrics import HubMetrics
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
from tests.unit.hub.fakes import FakeStore

pytestmark = pytest.mark.integration


async def test_a_rotated_token_closes_the_stream_at_once_and_the_old_token_is_refused(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    old = await hub_api.register_member("rot1")
    ca = tmp_path / "tls" / "ca.crt"
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix)
    async with running_hub(cfg) as hub:
        agent = FakeAgent(hub.grpc_port, "rot1", old, ca)
        await agent.connect(nodes=hgx_nodes("rot1-hgx", 1))
        await agent.next("welcome")

        # The MemberCluster status write (a JSON patch with a resourceVersion) lands.
        async def member_status() -> dict[str, Any] | None:
            return (await hub_api.member("rot1")).get("status")

        await wait_for(member_status, "the MemberCluster status")

        rotated_at = time.monotonic()
        new = await hub_api.rotate_token("rot1")
        code, details = await agent.closed(limit_s=10)
        took = time.monotonic() - rotated_at
        await agent.close()
        assert code == grpc.StatusCode.PERMISSION_DENIED, details
        assert "join token of member rot1 was rotated" in details
        print(f"stream closed {took:.3f} s after the rotation")

        stale = FakeAgent(hub.grpc_port, "rot1", old, ca)
        await stale.connect(silent=True)  # refused before the Hello is read
        code, details = await stale.closed()
        await stale.close()
        assert code == grpc.StatusCode.UNAUTHENTICATED, details

        fresh = FakeAgent(hub.grpc_port, "rot1", new, ca)
        await fresh.connect(nodes=hgx_nodes("rot1-hgx", 1))
        assert (await fresh.next("welcome")).cluster == "rot1"
        await fresh.close()


class Lease:
    """The ex-leader's fence: the check before its first write passes (the pause came right
    after it), every later one fails (its lease deadline has passed)."""

    def __init__(self) -> None:
        self.checks = 0

    def __call__(self) -> bool:
        self.checks += 1
        return self.checks == 1


async def test_an_ex_leaders_pending_write_does_not_land_after_the_new_leader_wrote(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    token = await hub_api.register_member("fen1")
    ca = tmp_path / "tls" / "ca.crt"
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix, status_resync_s=1.0)
    created = await hub_api.create_job("fenced", gpu_job(8))
    uid = created["metadata"]["uid"]

    async with running_hub(cfg) as hub:
        agent = FakeAgent(hub.grpc_port, "fen1", token, ca)
        await agent.connect(nodes=hgx_nodes("fen1-hgx", 1))
        item = await agent.next("work_item")
        await agent.ack(item)

        async def placed() -> dict[str, Any] | None:
            status = ((await hub_api.job("fenced")) or {}).get("status") or {}
            return status if status.get("cluster") == "fen1" else None

        await wait_for(placed, "the leader's status (cluster fen1)")

        # The ex-leader: a term that saw the GPUJob as created, with a status it computed
        # then, still queued when it wakes up after the new leader wrote.
        kube = await KubeAPI.connect(hub_kubeconfig)
        # status_hold_s=0: its queued write goes first, before any other fence check.
        config = HubConfig(insecure=True, status_hold_s=0)
        ex = Controller(config, FakeStore(), kube, HubMetrics(), leading=Lease())
        try:
            ex.mirror.start()
            ex.intake.namespaces.seen("team-a", {})  # as its Namespace watch had shown it
            ex.intake.on_job_event(WatchEvent("ADDED", copy.deepcopy(created)))
            job = ex.state.jobs[uid]
            ex.mirror.set_status(
                job, st.resumed(job.status, cluster="stale-member", gpus=8, now="t")
            )
            writes = ex.metrics.status_writes

            async def fenced() -> float:
                return float(writes.labels("job", "fenced")._value.get())

            # The fenced term keeps its value queued (retried every second) until its term
            # ends; nothing of it reaches the API server.
            await wait_for(fenced, "the ex-leader's retry to be fenced", limit_s=10)
            conflicts = writes.labels("job", "conflict")._value.get()
        finally:
            await ex.mirror.stop()
            await kube.close()
        assert conflicts == 1  # the precondition refused the stale write
        assert await placed() is not None

        # A stale write that lands anyway (no precondition: as if an ex-leader paused between
        # its check and the API server's commit, onto an object nobody wrote since) is
        # corrected by the leader's resync (status_resync_s=1 here).
        await hub_api.custom.patch_namespaced_custom_object_status(
            "gpufed.io",
            "v1alpha1",
            "team-a",
            "gpujobs",
            "fenced",
            {"status": {"cluster": "stale-member"}},
            _content_type="application/merge-patch+json",
        )
        await wait_for(placed, "the leader to correct the stale status", limit_s=10)
        await agent.close()
