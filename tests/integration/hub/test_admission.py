"""Admission against a real hub API server: the hub reads each namespace's Pod Security label
(list+watch of real Namespaces), fails a GPUJob whose pods break it with ``Valid=False`` naming
the field and the level, sends nothing of it to the member, and sends an admitted job's work
item with its namespace's level."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

import pytest

from gpufed.api.labels import POD_SECURITY_ENFORCE_LABEL
from gpufed.api.protocol import agent_pb2 as pb
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


async def _label_namespace(api: HubAPI, name: str, level: str | None) -> None:
    await api.core.patch_namespace(
        name, {"metadata": {"labels": {POD_SECURITY_ENFORCE_LABEL: level}}}
    )


async def _failed(api: HubAPI, name: str, namespace: str) -> dict[str, Any] | None:
    obj = await api.job(name, namespace)
    return obj if obj and (obj.get("status") or {}).get("phase") == "Failed" else None


def _valid_message(obj: dict[str, Any]) -> str:
    (cond,) = [c for c in obj["status"]["conditions"] if c["type"] == "Valid"]
    assert cond["status"] == "False"
    return str(cond["message"])


async def test_pod_security_is_enforced_at_intake_from_the_hub_namespace_label(
    tmp_path: Path, hub_kubeconfig: Path, etcd_endpoint: str, prefix: str, hub_api: HubAPI
) -> None:
    await _label_namespace(hub_api, "team-b", "restricted")
    try:
        token = await hub_api.register_member("m1")
        cfg = hub_config(tmp_path, hub_kubeconfig, etcd_endpoint, prefix)
        async with running_hub(cfg) as hub:
            agent = FakeAgent(hub.grpc_port, "m1", token, tmp_path / "tls" / "ca.crt")
            await agent.connect(nodes=hgx_nodes("m1-hgx", 2))
            await agent.next("welcome")
            await agent.next("desired_set")

            # 1. a privileged pod in an unlabelled namespace: baseline refuses it
            bad = copy.deepcopy(gpu_job(8))
            container = bad["spec"]["template"]["spec"]["containers"][0]
            container["securityContext"] = {"privileged": True}
            await hub_api.create_job("root", bad)
            obj = await wait_for(lambda: _failed(hub_api, "root", "team-a"), "root Failed")
            message = _valid_message(obj)
            assert message.startswith(
                "spec.template.spec.template.spec.containers[0].securityContext.privileged:"
            )
            assert "PodSecurity 'baseline'" in message

            # 2. a default pod in the restricted namespace: refused, naming restricted
            await hub_api.create_job("plain", gpu_job(8), namespace="team-b")
            obj = await wait_for(lambda: _failed(hub_api, "plain", "team-b"), "plain Failed")
            assert "PodSecurity 'restricted'" in _valid_message(obj)

            # 3. a good job is sent with its namespace's level; the refused ones never were
            good = await hub_api.create_job("good", gpu_job(8))
            item = await agent.next("work_item")
            assert (item.job_uid, item.op) == (good["metadata"]["uid"], pb.WorkItem.APPLY)
            assert item.pod_security == "baseline"
            assert hub.store is not None
            loaded = await hub.store.load()
            assert [uid for _, uid in loaded.work] == [good["metadata"]["uid"]]
            await agent.close()
    finally:
        with contextlib.suppress(Exception):
            await _label_namespace(hub_api, "team-b", None)
