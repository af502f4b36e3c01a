"""A GPUJob nested deeper than Python's default recursion limit, stored in a real hub API server
(which accepts up to 10,000 levels): the hub's list and watch decode it, intake refuses it for
its depth, and every other job is placed as usual. It used to fail every GPUJob list with
RecursionError, which ended every leader term: one stored object kept the hub from leading."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from gpufed.api.protocol import agent_pb2 as pb
from gpufed.hub.adapters.kubewire import deep_decoding
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

DEPTH = 2_000  # twice the interpreter's default recursion limit


def nested(depth: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    cur = root
    for _ in range(depth):
        cur["x"] = {}
        cur = cur["x"]
    return root


async def _phase(api: HubAPI, name: str) -> str | None:
    with deep_decoding():  # the test's own client decodes the deep object too
        obj = await api.job(name)
    return (obj or {}).get("status", {}).get("phase")


async def test_a_gpujob_nested_thousands_deep_is_refused_and_the_hub_keeps_leading(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    deep = copy.deepcopy(gpu_job(8))
    deep["spec"]["template"]["metadata"] = {"annotations": {}}
    deep["spec"]["template"]["spec"]["nodeSelector"] = {}
    deep["spec"]["template"]["spec"]["deep"] = nested(DEPTH)
    with deep_decoding():  # the client encodes and decodes it recursively
        await hub_api.create_job("deep", deep)  # stored before any hub runs: the first list
    token = await hub_api.register_member("m1")
    cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix)
    async with running_hub(cfg) as hub:
        agent = FakeAgent(hub.grpc_port, "m1", token, tmp_path / "tls" / "ca.crt")
        await agent.connect(nodes=hgx_nodes("m1-hgx", 1))
        await agent.next("welcome")
        await agent.next("desired_set")
        await wait_for(lambda: _is(hub_api, "deep", "Failed"), "the deep job Failed (first list)")
        with deep_decoding():
            obj = await hub_api.job("deep")
        assert obj is not None
        (valid,) = [c for c in obj["status"]["conditions"] if c["type"] == "Valid"]
        assert "nested more than 64" in valid["message"]
        # The watch path: a second deep job arrives while the hub runs; a good one is placed.
        with deep_decoding():
            await hub_api.create_job("deeper", deep)
        await wait_for(lambda: _is(hub_api, "deeper", "Failed"), "the deeper job Failed (watch)")
        good = await hub_api.create_job("good", gpu_job(8))
        item = await agent.next("work_item")
        assert (item.job_uid, item.op) == (good["metadata"]["uid"], pb.WorkItem.APPLY)
        assert hub.controller is not None, "still leading"
        with deep_decoding():  # the harness's cleanup lists jobs with a default client
            for name in ("deep", "deeper"):
                await hub_api.delete_job(name)
        await wait_for(lambda: _gone(hub_api), "the deep jobs deleted")


async def _gone(api: HubAPI) -> bool | None:
    with deep_decoding():
        return ((await api.job("deep")) is None and (await api.job("deeper")) is None) or None


async def _is(api: HubAPI, name: str, phase: str) -> bool | None:
    return (await _phase(api, name)) == phase or None
