"""etcd restarts under a running hub: the hub pauses, leads again, and resumes where it was
without losing or duplicating anything."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from gpufed.hub.adapters.etcd import EmbeddedEtcd
from gpufed.hub.edge.app import Hub
from gpufed.sandbox.binaries import BinDir
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


async def test_the_hub_pauses_while_etcd_is_down_and_resumes(
    tmp_path: Path, hub_kubeconfig: Path, hub_api: HubAPI, sandbox_bin_dir: BinDir
) -> None:
    token = await hub_api.register_member("m1")
    ca = tmp_path / "tls" / "ca.crt"
    async with EmbeddedEtcd(sandbox_bin_dir.etcd, tmp_path / "etcd") as etcd:
        cfg = hub_config(tmp_path, hub_kubeconfig, etcd.endpoint, "/gpufed/hub/", leader_lease_s=2)
        async with running_hub(cfg) as hub:
            agent = FakeAgent(hub.grpc_port, "m1", token, ca)
            await agent.connect(nodes=hgx_nodes("m1-hgx", 2))
            await hub_api.create_job("before", gpu_job(8))
            first = await agent.next("work_item")
            await agent.ack(first)

            async def acked() -> bool:
                assert hub.store is not None
                try:
                    return ("m1", first.job_uid) in (await hub.store.load()).acks
                except Exception:
                    return False

            await wait_for(acked, "the ack in etcd")

            await etcd.stop()
            # Longer than the leader lease: the hub steps down and closes agent streams.
            await wait_for(_not_leading(hub), "the hub to step down", limit_s=30)
            await agent.closed()
            await agent.close()
            await asyncio.sleep(1)
            await etcd.start()
            await wait_for(_leading(hub), "the hub to lead again", limit_s=60)

            # A term that began while etcd was still slow may step down once more (its first
            # renewal came back late, so its writes are fenced): the agent reconnects, as a real
            # one does, until one term hands it the new job. What must hold in every term: the
            # desired set is the acked job and nothing else, and the new job comes as work.
            created = False
            second_uid = ""
            second = None
            for _ in range(4):
                await wait_for(_leading(hub), "the hub to lead again", limit_s=60)
                agent = FakeAgent(hub.grpc_port, "m1", token, ca)
                await agent.connect(nodes=hgx_nodes("m1-hgx", 2))
                await agent.next("welcome")
                desired = await agent.next("desired_set")
                assert (first.job_uid, first.revision, True) in [
                    (i.job_uid, i.revision, i.applied_before) for i in desired.items
                ]
                assert {i.job_uid for i in desired.items} <= {first.job_uid} | (
                    {second_uid} if created else set()
                )
                if not created:
                    second_uid = (await hub_api.create_job("after", gpu_job(8)))["metadata"]["uid"]
                    created = True
                second = await _work_or_closed(agent)
                if second is not None:
                    break
                await agent.close()
            assert second is not None, "no term handed the agent the new job"
            assert second.job == "team-a/after"
            assert hub.store is not None
            loaded = await hub.store.load()
            assert sorted(r.job for r in loaded.jobs.values()) == ["team-a/after", "team-a/before"]
            await agent.close()


async def _work_or_closed(agent: FakeAgent) -> Any:
    """The next work item, or None once the hub closed the stream first."""
    work = asyncio.ensure_future(agent.next("work_item"))
    closed = asyncio.ensure_future(agent.closed())
    done, _ = await asyncio.wait({work, closed}, return_when=asyncio.FIRST_COMPLETED)
    for t in (work, closed):
        if t not in done:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
    return work.result() if work in done else None


def _not_leading(hub: Hub) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return hub.controller is None

    return check


def _leading(hub: Hub) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return hub.controller is not None and hub.controller.ready

    return check
