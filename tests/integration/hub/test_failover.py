"""Two ``gpufed hub`` processes on one etcd: one leads, the other stands by and takes over when
the leader dies; nothing is placed or created twice. Also the user CLI against that hub."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from typer.testing import CliRunner

from gpufed.api.protocol import agent_pb2 as pb
from gpufed.cli.main import app
from gpufed.hub.adapters.etcd import free_port
from gpufed.hub.adapters.store import Store
from gpufed.hub.edge import certs
from tests.integration.hub.harness import FakeAgent, HubAPI, gpu_job, hgx_nodes, wait_for

pytestmark = pytest.mark.integration


class HubProcess:
    """``gpufed hub`` as a child process."""

    def __init__(self, name: str, tmp: Path, kubeconfig: Path, etcd: str, prefix: str) -> None:
        self.name = name
        self.grpc_port = free_port()
        self.http_port = free_port()
        tls = certs.generate(tmp / "tls")
        self.log = tmp / f"{name}.log"
        args = [
            str(Path(sys.executable).parent / "gpufed"),
            "hub",
            f"--kubeconfig={kubeconfig}",
            f"--etcd={etcd}",
            f"--etcd-prefix={prefix}",
            f"--listen=127.0.0.1:{self.grpc_port}",
            f"--http-listen=127.0.0.1:{self.http_port}",
            f"--tls-cert={tls.server_cert}",
            f"--tls-key={tls.server_key}",
            f"--hub-id={name}",
            "--leader-lease=2",
            "--heartbeat-interval=1",
        ]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=out, start_new_session=True)

    async def ready(self) -> bool:
        """True when /leaderz says this replica leads."""
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited; log:\n{self.log.read_text()[-3000:]}")
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.get(f"http://127.0.0.1:{self.http_port}/leaderz") as r,
            ):
                return r.status == 200
        except aiohttp.ClientError:
            return False

    async def readyz(self) -> tuple[int, str]:
        """Status and body of /readyz (every replica's readiness, not only the leader's)."""
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{self.http_port}/readyz") as r,
        ):
            return r.status, await r.text()

    async def healthy(self) -> bool:
        """True once the process serves HTTP (its gRPC server started before)."""
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited; log:\n{self.log.read_text()[-3000:]}")
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.get(f"http://127.0.0.1:{self.http_port}/healthz") as r,
            ):
                return r.status == 200
        except aiohttp.ClientError:
            return False

    async def metrics(self) -> str:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{self.http_port}/metrics") as r,
        ):
            return await r.text()

    def kill(self) -> None:
        """SIGKILL: no resignation, the standby must wait for the lease to expire."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def hubs(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> Iterator[list[HubProcess]]:
    """Two hub processes, stopped before ``hub_api`` removes the test's objects (the fixture
    depends on it for that order): a hub still running during that cleanup re-adds its
    finalizer to a GPUJob being deleted, and the next test's hub then finds that job."""
    procs = [
        HubProcess(n, tmp_path, hub_kubeconfig, etcd_endpoint, prefix) for n in ("hub-a", "hub-b")
    ]
    try:
        yield procs
    finally:
        for p in procs:
            p.stop()


def cli(kubeconfig: Path, *args: str) -> str:
    result = CliRunner().invoke(app, [*args, f"--kubeconfig={kubeconfig}"])
    assert result.exit_code == 0, result.output
    return result.output


async def test_standby_takes_over_and_nothing_is_created_twice(
    hubs: list[HubProcess],
    hub_api: HubAPI,
    hub_kubeconfig: Path,
    etcd_endpoint: str,
    prefix: str,
    tmp_path: Path,
) -> None:
    # The admin CLI: CRDs (already there: updated in place) and a member join token.
    assert "configured" in cli(hub_kubeconfig, "hub", "install")
    token_file = tmp_path / "m1.token"
    hub_api.track_member("m1")
    cli(
        hub_kubeconfig,
        "hub",
        "join",
        "m1",
        "--label",
        "region=us-east",
        f"--token-file={token_file}",
    )
    token = token_file.read_text().strip()
    assert (await hub_api.member("m1"))["spec"]["labels"] == {"region": "us-east"}
    ca = tmp_path / "tls" / "ca.crt"

    async def leader() -> HubProcess | None:
        for h in hubs:
            if await h.ready():
                return h
        return None

    first = await wait_for(leader, "a leader", limit_s=60)
    standby = next(h for h in hubs if h is not first)
    await wait_for(standby.healthy, "the standby to serve", limit_s=60)
    assert not await standby.ready()
    # Both replicas are Ready (a Deployment's rollout completes); only one leads.
    assert await first.readyz() == (200, "leader\n")

    async def standby_ready() -> bool:
        return await standby.readyz() == (200, "standby\n")

    await wait_for(standby_ready, "the standby to be Ready", limit_s=30)

    # A standby refuses agents (they retry and reach the leader).
    refused = FakeAgent(standby.grpc_port, "m1", token, ca)
    await refused.connect(silent=True)
    code, details = await refused.closed()
    assert code == grpc.StatusCode.UNAVAILABLE, details
    assert "standby" in details
    await refused.close()

    agent = FakeAgent(first.grpc_port, "m1", token, ca)
    await agent.connect(nodes=hgx_nodes("m1-hgx", 4))
    await hub_api.create_job("one", gpu_job(8))
    item = await agent.next("work_item")
    await agent.ack(item)
    await wait_for(lambda: _phase(hub_api, "one"), "job one placed")

    # The user CLI reads what the hub wrote.
    jobs = json.loads(cli(hub_kubeconfig, "get", "jobs", "-n", "team-a", "--json"))
    assert {(j["name"], j["phase"], j["cluster"], j["gpus"]) for j in jobs} == {
        ("one", "Placed", "m1", 8)
    }

    async def reported() -> list[dict[str, object]] | None:
        rows = json.loads(cli(hub_kubeconfig, "get", "clusters", "--json"))
        return rows if rows and rows[0]["gpus_total"] else None

    clusters = await wait_for(reported, "member status")
    assert clusters[0]["name"] == "m1"
    assert clusters[0]["ready"] is True
    assert clusters[0]["gpus_total"] == {"NVIDIA-H100-80GB-HBM3": 32}
    assert clusters[0]["largest_free_nvlink_block"] == 8
    text = cli(hub_kubeconfig, "explain", "one", "-n", "team-a")
    assert "Placed on m1" in text
    assert "pod set main" in text
    metrics = await first.metrics()
    assert "gpufed_agents_connected 1.0" in metrics
    assert (
        'gpufed_cluster_gpus{cluster="m1",product="NVIDIA-H100-80GB-HBM3",state="total"} 32.0'
        in metrics
    )

    # The leader dies without resigning; the standby takes over once the lease expires.
    first.kill()
    await agent.closed()
    await agent.close()
    await wait_for(standby.ready, "the standby to lead", limit_s=30)

    agent = FakeAgent(standby.grpc_port, "m1", token, ca)
    await agent.connect(nodes=hgx_nodes("m1-hgx", 4))
    welcome = await agent.next("welcome")
    assert welcome.hub_id == standby.name
    desired = await agent.next("desired_set")
    assert [(i.job_uid, i.revision, i.applied_before) for i in desired.items] == [
        (item.job_uid, item.revision, True)
    ]
    await hub_api.create_job("two", gpu_job(8))
    second = await agent.next("work_item")
    assert second.job == "team-a/two"
    assert second.op == pb.WorkItem.APPLY
    await agent.ack(second)

    reader = await Store.connect([etcd_endpoint], prefix=prefix, hub_id="reader")
    try:
        loaded = await reader.load()
    finally:
        await reader.close()
    assert sorted(r.job for r in loaded.jobs.values()) == ["team-a/one", "team-a/two"]
    assert all(r.attempt == 1 for r in loaded.jobs.values())
    assert {k: rev for k, (_, rev) in loaded.work.items()} == {
        ("m1", item.job_uid): item.revision,
        ("m1", second.job_uid): second.revision,
    }
    await agent.close()
    await asyncio.sleep(0)


async def _phase(api: HubAPI, name: str) -> str | None:
    phase = await api.phase(name)
    return phase if phase == "Placed" else None
