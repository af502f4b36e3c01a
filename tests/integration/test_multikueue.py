"""MultiKueue in the sandbox (gpufed.sandbox.multikueue): on a clusters-only sandbox of two
members, Kueue runs as the hub's MultiKueue manager and each member's worker; a labelled
batch/v1 Job created on the hub is copied to exactly one member, runs there on kwok nodes, and
its Complete status shows on the hub Job."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from gpufed.sandbox.binaries import BinariesError, BinDir
from gpufed.sandbox.kueue import ensure_kueue
from gpufed.sandbox.multikueue import MultiKueueInfo, _request, start_multikueue
from gpufed.sandbox.runtime import Sandbox, SandboxInfo

pytestmark = pytest.mark.integration

SMALL_FLEET = Path(__file__).resolve().parents[1] / "fleets" / "small.yaml"


@pytest.fixture(scope="module")
def multikueue(
    tmp_path_factory: pytest.TempPathFactory, sandbox_bin_dir: BinDir
) -> Iterator[tuple[SandboxInfo, MultiKueueInfo]]:
    """A sandbox of its own (Kueue's webhooks would intercept every Job of the shared one),
    clusters only, with MultiKueue started at Kueue's default client QPS."""
    try:
        ensure_kueue()  # cold: ~10 min on a shared 2-core machine (see docs/sandbox.md)
    except BinariesError as exc:
        pytest.fail(f"Kueue unavailable: {exc}")
    sb = Sandbox(tmp_path_factory.mktemp("mk"), bin_dir=sandbox_bin_dir)
    info = sb.up(SMALL_FLEET)
    try:
        yield info, start_multikueue(sb, info)
    finally:
        sb.down()


def bench_job(name: str, mk: MultiKueueInfo, gpus: int, duration_s: float) -> dict[str, Any]:
    """A one-pod Job with ``gpus`` GPUs that kwok runs for ``duration_s`` seconds; nothing but
    the queue label marks it for Kueue."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {mk.queue_label: mk.local_queue}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {"gpufed.io/sim-duration": f"{duration_s:g}s"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": "bench:1.0",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def _complete(job: Any) -> bool:
    return any(c.type == "Complete" and c.status == "True" for c in job.status.conditions or [])


def test_each_hub_job_runs_in_exactly_one_member_and_completes_on_the_hub(
    multikueue: tuple[SandboxInfo, MultiKueueInfo],
) -> None:
    info, mk = multikueue
    assert mk.components == ["kueue/hub", "kueue/alpha", "kueue/beta"]
    hub = k8s.BatchV1Api(info.api_client("hub"))
    members = {m: k8s.BatchV1Api(info.api_client(m)) for m in info.members}
    names = [f"mk-{i}" for i in range(3)]
    for name in names:
        hub.create_namespaced_job(mk.namespace, bench_job(name, mk, gpus=4, duration_s=3))
    # The hub Job is suspended and handed to MultiKueue (the webhook's doing, not ours).
    first = hub.read_namespaced_job(names[0], mk.namespace)
    assert first.spec.suspend is True
    assert first.spec.managed_by == "kueue.x-k8s.io/multikueue"
    seen: dict[str, set[str]] = {n: set() for n in names}
    deadline = time.monotonic() + 90
    while True:
        for m, api in members.items():
            for job in api.list_namespaced_job(mk.namespace).items:
                if job.metadata.name in seen:
                    seen[job.metadata.name].add(m)
        done = {
            j.metadata.name for j in hub.list_namespaced_job(mk.namespace).items if _complete(j)
        }
        if done >= set(names):
            break
        assert time.monotonic() < deadline, f"not Complete on the hub after 90 s: {done}, {seen}"
        time.sleep(0.2)
    # Each ran in one member: the member Job was seen there only, and the hub's Workload
    # records that member as where it was admitted.
    workloads = _request(
        info.api_client("hub"),
        "GET",
        f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{mk.namespace}/workloads",
    )["items"]
    placed = {
        w["metadata"]["ownerReferences"][0]["name"]: w["status"].get("clusterName")
        for w in workloads
    }
    for name in names:
        assert len(seen[name]) == 1, f"{name} seen in {seen[name]}"
        assert placed[name] in info.members
        assert seen[name] == {placed[name]}
