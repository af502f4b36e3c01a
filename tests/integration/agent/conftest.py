"""Fixtures for the agent's integration tests: a real member API server (member ``alpha`` of
the session sandbox, tests/conftest.py), a test hub over real gRPC, and an agent between them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import structlog

from gpufed.agent.agent import Agent
from gpufed.agent.config import AgentConfig
from gpufed.agent.kube import MemberApi
from gpufed.api.fleet import FleetSpec, NodeSpec, node_specs
from gpufed.sandbox.runtime import SandboxInfo
from tests.integration.agent.hub_peer import HubPeer

pytestmark = pytest.mark.integration


def log_to_stdlib() -> None:
    """Route structlog through the logging module: pytest captures it per test, whereas a
    print logger would keep writing to the stream of the test that first logged (closed
    afterwards) and crash a module-scoped agent."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )


@pytest.fixture(scope="session", autouse=True)
def _structlog_to_stdlib() -> None:
    log_to_stdlib()


@dataclass
class Member:
    """One member cluster under test: its name, an admin kubeconfig for it alone, and the
    nodes the fleet spec says it has."""

    name: str
    kubeconfig: Path
    fleet_nodes: list[NodeSpec] = field(default_factory=list)


def sandbox_member(sandbox: SandboxInfo, fleet: FleetSpec, name: str) -> Member:
    cluster = next(c for c in fleet.clusters if c.name == name)
    return Member(
        name=name, kubeconfig=sandbox.clusters[name].kubeconfig, fleet_nodes=node_specs(cluster)
    )


@pytest.fixture(scope="session")
def member(sandbox: SandboxInfo, small_fleet: FleetSpec) -> Member:
    """Member ``alpha``: 2 HGX H100 nodes and 1 tainted A100 node with mixed MIG."""
    return sandbox_member(sandbox, small_fleet, "alpha")


@dataclass
class Rig:
    """A running agent connected to a test hub, plus an admin client for the member."""

    member: Member
    hub: HubPeer
    agent: Agent
    admin: MemberApi
    cluster: str
    task: asyncio.Task[None]
    tmp: Path

    @property
    def view(self) -> Any:
        return self.hub.view(self.cluster)


async def start_rig(
    member: Member,
    tmp: Path,
    *,
    cluster: str | None = None,
    hub: HubPeer | None = None,
    **config: Any,
) -> Rig:
    cluster = cluster or member.name
    token = uuid.uuid4().hex
    token_file = tmp / f"token-{cluster}"
    token_file.write_text(token)
    own_hub = hub is None
    if hub is None:
        hub = HubPeer({token: cluster}, heartbeat_ms=500)
        await hub.start()
    else:
        hub.tokens[token] = cluster
    cfg = AgentConfig(
        cluster=cluster,
        hub=hub.address,
        token_file=token_file,
        kubeconfig=member.kubeconfig,
        health_port=0,
        health_host="127.0.0.1",
        reconnect_max_s=0.5,
        **config,
    )
    api = await MemberApi.connect(kubeconfig=str(member.kubeconfig))
    agent = Agent(cfg, api)
    task = asyncio.create_task(agent.run())
    admin = await MemberApi.connect(kubeconfig=str(member.kubeconfig))
    rig = Rig(member=member, hub=hub, agent=agent, admin=admin, cluster=cluster, task=task, tmp=tmp)
    try:
        await hub.wait_for(lambda: rig.view.snapshots, what="first snapshot", within=60)
    except BaseException:
        await stop_rig(rig, stop_hub=own_hub)
        raise
    return rig


async def stop_rig(rig: Rig, *, stop_hub: bool = True) -> None:
    errors = list(rig.view.errors)
    rig.task.cancel()
    await asyncio.gather(rig.task, return_exceptions=True)
    await rig.agent.api.close()
    await rig.admin.close()
    if stop_hub:
        await rig.hub.stop()
    assert not errors, f"the test hub could not decode agent messages: {errors}"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def rig(member: Member, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    """One agent per test module (agent start-up and the first list are paid once)."""
    r = await start_rig(member, tmp_path_factory.mktemp("agent"))
    yield r
    await stop_rig(r)


@pytest_asyncio.fixture(loop_scope="module")
async def namespace(rig: Rig) -> AsyncIterator[str]:
    """A fresh namespace name per test (created by the agent or the test); deleted after."""
    name = f"agent-it-{uuid.uuid4().hex[:8]}"
    yield name
    try:
        await rig.admin.request(
            "DELETE",
            f"/api/v1/namespaces/{name}",
            body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
        )
    except Exception as exc:  # already gone, or never created
        if getattr(exc, "status", None) != 404:
            raise
