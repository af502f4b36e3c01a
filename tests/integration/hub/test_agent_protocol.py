"""Bad agent input closes only that stream, with a reason, and nothing stored is touched."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.protocol.codec import node_to_pb
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


async def test_bad_streams_are_closed_with_a_reason_and_others_carry_on(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    t1 = await hub_api.register_member("m1")
    t2 = await hub_api.register_member("m2")
    ca = tmp_path / "tls" / "ca.crt"
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix, max_message_bytes=65536)
    async with running_hub(cfg) as hub:
        good = FakeAgent(hub.grpc_port, "m1", t1, ca)
        await good.connect(nodes=hgx_nodes("m1-hgx", 2))
        await good.next("desired_set")
        await hub_api.create_job("one", gpu_job(8))
        item = await good.next("work_item")
        await good.ack(item)
        assert hub.store is not None
        store = hub.store

        async def acked() -> bool:
            return ("m1", item.job_uid) in (await store.load()).acks

        await wait_for(acked, "the ack stored")
        before = await store.load()

        async def closed_with(agent: FakeAgent) -> tuple[grpc.StatusCode | None, str]:
            code, details = await agent.closed()
            await agent.close()
            return code, details

        # An unknown token.
        bad = FakeAgent(hub.grpc_port, "m1", "not-a-token", ca)
        await bad.connect(silent=True)  # refused before the Hello is read
        code, details = await closed_with(bad)
        assert code == grpc.StatusCode.UNAUTHENTICATED, details

        # m2's token used to speak for m1.
        bad = FakeAgent(hub.grpc_port, "m1", t2, ca)
        await bad.connect()
        code, details = await closed_with(bad)
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "belongs to member 'm2'" in details

        # Something other than Hello first; then a Hello with a protocol we do not speak.
        bad = FakeAgent(hub.grpc_port, "m2", t2, ca)
        await bad.connect(first=pb.AgentMessage(heartbeat=pb.Heartbeat()))
        code, details = await closed_with(bad)
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "must be a Hello" in details
        bad = FakeAgent(hub.grpc_port, "m2", t2, ca)
        # (A newer agent is answered with the hub's own version, docs/hub.md "Version skew";
        # one older than the hub serves is refused.)
        bad_first = pb.Hello(cluster="m2", protocol_version=0)
        await bad.connect(hello=bad_first)
        code, details = await closed_with(bad)
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "protocol version 0" in details

        # m2 acknowledges a job of m1: refused, stream closed, m1's work untouched.
        m2 = FakeAgent(hub.grpc_port, "m2", t2, ca)
        await m2.connect(nodes=hgx_nodes("m2-hgx", 1))
        await m2.next("desired_set")
        await m2.ack(item, pb.WorkAck.DELETED)
        code, details = await closed_with(m2)
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "assigned to member m1" in details

        # A snapshot part out of order: closed, the stored inventory stays.
        m2 = FakeAgent(hub.grpc_port, "m2", t2, ca)
        await m2.connect(nodes=hgx_nodes("m2-hgx", 1), seq=5)
        await m2.send(
            pb.AgentMessage(
                inventory_snapshot=pb.InventorySnapshot(
                    seq=6, part=1, final=True, nodes=[node_to_pb(n) for n in hgx_nodes("x", 3)]
                )
            )
        )
        code, details = await closed_with(m2)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "out of order" in details

        # An oversized message: gRPC refuses it, only this stream ends.
        m2 = FakeAgent(hub.grpc_port, "m2", t2, ca)
        await m2.connect(nodes=hgx_nodes("m2-big", 1000))
        code, _ = await closed_with(m2)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED

        # A malformed node (unknown MIG strategy) in a snapshot: closed, named.
        m2 = FakeAgent(hub.grpc_port, "m2", t2, ca)
        await m2.connect()
        await m2.send(
            pb.AgentMessage(
                inventory_snapshot=pb.InventorySnapshot(
                    seq=9, part=0, final=True, nodes=[pb.Node(name="odd", mig_strategy="wild")]
                )
            )
        )
        code, details = await closed_with(m2)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "odd" in details

        # An 8-GPU node reporting -1000 requested GPUs (it would show 1,008 free): closed, named.
        m2 = FakeAgent(hub.grpc_port, "m2", t2, ca)
        await m2.connect()
        (negative,) = [node_to_pb(n) for n in hgx_nodes("m2-neg", 1)]
        negative.requested["nvidia.com/gpu"] = -1000
        await m2.send(
            pb.AgentMessage(
                inventory_snapshot=pb.InventorySnapshot(
                    seq=10, part=0, final=True, nodes=[negative]
                )
            )
        )
        code, details = await closed_with(m2)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "node 'm2-neg-0': requested[nvidia.com/gpu]: -1000 is outside" in details

        # The good stream carried on through all of it; nothing stored changed.
        await good.send(pb.AgentMessage(heartbeat=pb.Heartbeat(inventory_seq=1)))
        await hub_api.create_job("two", gpu_job(8))
        second = await good.next("work_item")
        assert second.job == "team-a/two"
        after = await hub.store.load()
        assert after.work[("m1", item.job_uid)] == before.work[("m1", item.job_uid)]
        assert after.acks[("m1", item.job_uid)] == before.acks[("m1", item.job_uid)]
        assert hub.controller is not None
        assert sorted(hub.controller.state.members["m2"].nodes) == ["m2-hgx-0"], "the last good one"

        async def persisted() -> list[str] | None:
            names = sorted((await store.load()).nodes.get("m2", {}))
            return names if names else None

        assert await wait_for(persisted, "m2's inventory in etcd") == ["m2-hgx-0"]
        await good.close()


async def test_a_missing_delta_asks_for_a_resync(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    token = await hub_api.register_member("m1")
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix)
    async with running_hub(cfg) as hub:
        agent = FakeAgent(hub.grpc_port, "m1", token, tmp_path / "tls" / "ca.crt")
        await agent.connect(nodes=hgx_nodes("m1-hgx", 1), seq=3)
        await agent.send(pb.AgentMessage(inventory_delta=pb.InventoryDelta(seq=5)))
        resync = await agent.next("resync_request")
        assert "does not follow 3" in resync.reason
        await agent.close()


async def test_work_in_flight_per_member_is_capped(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    token = await hub_api.register_member("m1")
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix, max_unacked_per_cluster=2)
    async with running_hub(cfg) as hub:
        agent = FakeAgent(hub.grpc_port, "m1", token, tmp_path / "tls" / "ca.crt")
        await agent.connect(nodes=hgx_nodes("m1-hgx", 3))
        for name in ("a", "b", "c"):
            await hub_api.create_job(name, gpu_job(8))

        async def all_placed() -> bool:
            assert hub.store is not None
            return len((await hub.store.load()).work) == 3

        await wait_for(all_placed, "three work items in etcd")
        first = [await agent.next("work_item"), await agent.next("work_item")]
        with pytest.raises(AssertionError, match="no work_item"):
            await agent.next("work_item", limit_s=1.0)
        await agent.ack(first[0])
        third = await agent.next("work_item")
        assert third.job_uid not in {i.job_uid for i in first}
        await agent.close()


async def test_unacknowledged_work_is_sent_again_with_the_same_revision(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    token = await hub_api.register_member("m1")
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix, resend_after_s=1.0)
    async with running_hub(cfg) as hub:
        agent = FakeAgent(hub.grpc_port, "m1", token, tmp_path / "tls" / "ca.crt")
        await agent.connect(nodes=hgx_nodes("m1-hgx", 1))
        await hub_api.create_job("quiet", gpu_job(8))
        first = await agent.next("work_item")
        again = await agent.next("work_item", limit_s=10)
        assert (again.job_uid, again.revision) == (first.job_uid, first.revision)
        await agent.ack(again)
        with pytest.raises(AssertionError, match="no work_item"):
            await agent.next("work_item", limit_s=2.5)
        await agent.close()
