"""The real agent with the real hub (in-process, TLS, join token) on the session sandbox: a
GPUJob submitted on the hub runs in member ``alpha`` and its status comes back; deleting the
GPUJob deletes the member copy. A contract check between the two sides of agent.proto."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest

from gpufed.agent.agent import Agent
from gpufed.agent.config import AgentConfig
from gpufed.agent.kube import MemberApi
from gpufed.sandbox.runtime import SandboxInfo
from tests.integration.hub.conftest import (  # noqa: F401 - fixtures used by name
    etcd_endpoint,
    hub_api,
    hub_kubeconfig,
    prefix,
)
from tests.integration.hub.harness import HubAPI, gpu_job, hub_config, running_hub, wait_for

from .conftest import Member

pytestmark = pytest.mark.integration


async def member_job(api: MemberApi, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return await api.request("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}")
    except Exception as exc:
        if getattr(exc, "status", None) == 404:
            return None
        raise


async def test_gpujob_runs_in_the_member_through_the_real_hub_and_agent(
    hub_api: HubAPI,  # noqa: F811 - the imported fixture
    hub_kubeconfig: Path,  # noqa: F811
    etcd_endpoint: str,  # noqa: F811
    prefix: str,  # noqa: F811
    member: Member,
    sandbox: SandboxInfo,
    tmp_path: Path,
) -> None:
    token = await hub_api.register_member(member.name)
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix)
    token_file = tmp_path / "token"
    token_file.write_text(token)
    admin = await MemberApi.connect(kubeconfig=str(member.kubeconfig))
    async with running_hub(cfg) as hub:
        agent_cfg = AgentConfig(
            cluster=member.name,
            hub=f"localhost:{hub.grpc_port}",
            token_file=token_file,
            ca_file=tmp_path / "tls" / "ca.crt",
            kubeconfig=member.kubeconfig,
            health_port=-1,
        )
        api = await MemberApi.connect(kubeconfig=str(member.kubeconfig))
        agent = Agent(agent_cfg, api)
        agent_task = asyncio.create_task(agent.run())
        try:

            async def member_ready() -> bool:
                status = (await hub_api.member(member.name)).get("status") or {}
                return any(
                    c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or []
                )

            await wait_for(member_ready, "the member Ready on the hub", limit_s=60)
            template = gpu_job(gpus=2, name="e2e-train")
            template["spec"]["template"]["metadata"] = {
                "annotations": {"gpufed.io/sim-duration": "2s"}
            }
            await hub_api.create_job("e2e-train", template)

            async def finished() -> dict[str, Any] | None:
                job = await hub_api.job("e2e-train")
                status = (job or {}).get("status") or {}
                return status if status.get("phase") in ("Succeeded", "Failed") else None

            status = await wait_for(finished, "the GPUJob to finish", limit_s=90)
            assert status["phase"] == "Succeeded", status
            assert status["cluster"] == member.name
            assert "Complete" in [c["type"] for c in status["conditions"]]
            copy = await member_job(admin, "team-a", "e2e-train")
            assert copy is not None
            assert copy["metadata"]["labels"]["gpufed.io/job-uid"]

            # An agent with alpha's token but beta's kubeconfig (a wrong --context) is
            # refused: it used to replace alpha's stream, report beta's nodes as alpha's, fail
            # alpha's jobs as Missing and delete beta's gpufed objects as orphans.
            wrong_api = await MemberApi.connect(kubeconfig=str(sandbox.clusters["beta"].kubeconfig))
            wrong = Agent(
                agent_cfg.model_copy(
                    update={
                        "kubeconfig": sandbox.clusters["beta"].kubeconfig,
                        "reconnect_max_s": 0.5,
                    }
                ),
                wrong_api,
            )
            wrong_task = asyncio.create_task(wrong.run())
            try:
                failed = wrong.metrics.hub_connects.labels(result="failed")

                async def refused() -> bool:
                    return failed._value.get() >= 2  # refused, retried, refused again

                await wait_for(refused, "the wrong-cluster agent to be refused", limit_s=60)
                assert not wrong.hub.welcomed.is_set()
                assert agent.hub.sessions == 1, "alpha's own stream was never replaced"
                assert (await hub_api.job("e2e-train") or {})["status"]["phase"] == "Succeeded"
                assert await member_ready()
            finally:
                wrong_task.cancel()
                await asyncio.gather(wrong_task, return_exceptions=True)
                await wrong_api.close()

            await hub_api.delete_job("e2e-train")

            async def gone() -> bool:
                return await hub_api.job("e2e-train") is None

            await wait_for(gone, "the GPUJob's finalizer to be removed", limit_s=60)
            copy = await member_job(admin, "team-a", "e2e-train")
            assert copy is None or copy["metadata"].get("deletionTimestamp")
        finally:
            agent_task.cancel()
            await asyncio.gather(agent_task, return_exceptions=True)
            await api.close()
    with contextlib.suppress(Exception):
        await admin.request("DELETE", "/api/v1/namespaces/team-a")
    await admin.close()
