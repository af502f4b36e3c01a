"""The Job statuses the hub writes back into a managed plain Job are accepted by the real hub
API server (kube-apiserver of the sandbox, v1.36), step by step, for the GPUJob status
sequences the unit tests check against their list of rules
(tests/unit/hub/test_managed_rules.py), and ``kubectl``'s view of the end (``Complete`` /
``Failed`` True) is the GPUJob's outcome."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from gpufed.hub.rules.managed import job_status
from gpufed.sandbox.runtime import SandboxInfo
from tests.unit.hub.test_managed_rules import GPUJOB_STATUSES, NOW

pytestmark = [pytest.mark.integration]
NAMESPACE = "managed-status"


@pytest.fixture
def batch(sandbox: SandboxInfo) -> Iterator[Any]:
    api = sandbox.api_client("hub")
    core = k8s.CoreV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise
    yield api
    k8s.BatchV1Api(api).delete_collection_namespaced_job(NAMESPACE)
    api.close()  # type: ignore[no-untyped-call]


def _managed_job(api: Any) -> str:
    name = f"m-{uuid.uuid4().hex[:8]}"
    k8s.BatchV1Api(api).create_namespaced_job(
        NAMESPACE,
        {
            "metadata": {"name": name},
            "spec": {
                "managedBy": "gpufed.io/hub",
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "trainer:1"}],
                    }
                },
            },
        },
    )
    return name


SEQUENCES = [
    ("pending", "placed", "running", "succeeded"),
    ("running", "rerun", "failed"),
    ("rerun", "running", "succeeded", "failed"),
    ("placed", "lost"),
    ("invalid",),
    ("pending", "rejected"),
    ("succeeded-bare",),
    ("pending", "failed", "succeeded"),
]


@pytest.mark.parametrize("sequence", SEQUENCES, ids=["-".join(s) for s in SEQUENCES])
def test_the_api_server_accepts_every_status_the_hub_writes_into_a_managed_job(
    batch: Any, sequence: tuple[str, ...]
) -> None:
    custom = k8s.CustomObjectsApi(batch)
    name = _managed_job(batch)
    current: dict[str, Any] = {}
    for step in sequence:
        want = job_status(GPUJOB_STATUSES[step], current, now=NOW)
        if want == current:
            continue
        obj = custom.get_namespaced_custom_object("batch", "v1", NAMESPACE, "jobs", name)
        patch = [
            {
                "op": "replace",
                "path": "/metadata/resourceVersion",
                "value": obj["metadata"]["resourceVersion"],
            },
            {"op": "add", "path": "/status", "value": want},
        ]
        got = custom.patch_namespaced_custom_object_status(
            "batch",
            "v1",
            NAMESPACE,
            "jobs",
            name,
            patch,
            _content_type="application/json-patch+json",
        )
        current = got["status"]
    first_end = next(
        (s for s in sequence if GPUJOB_STATUSES[s].phase in ("Succeeded", "Failed", "Lost")), None
    )
    true = {c["type"] for c in current.get("conditions", []) if c["status"] == "True"}
    if first_end is None:
        assert true == set()
    elif GPUJOB_STATUSES[first_end].phase == "Succeeded":
        assert true == {"SuccessCriteriaMet", "Complete"}
    else:
        assert true == {"FailureTarget", "Failed"}


def test_every_sequence_covers_each_gpujob_status() -> None:
    assert set(itertools.chain(*SEQUENCES)) == set(GPUJOB_STATUSES)


async def test_the_hub_lists_opted_in_workloads_in_pages_at_one_resource_version(
    batch: Any, hub_kubeconfig: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``KubeAPI.list_resource`` reads pages (limit/continue) against the real API server and
    keeps only what the label selector names: the managed workloads' opt-in label."""
    from gpufed.hub.adapters import kuberesources
    from gpufed.hub.adapters.kube import KubeAPI

    jobs = k8s.BatchV1Api(batch)
    template = {
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox"}],
        }
    }
    for i in range(7):
        labels = {"gpufed.io/queue": "default"} if i % 2 == 0 else {}
        jobs.create_namespaced_job(
            NAMESPACE,
            {
                "metadata": {"name": f"page-{i}", "labels": labels},
                "spec": {"suspend": True, "template": template},
            },
        )
    monkeypatch.setattr(kuberesources, "LIST_PAGE", 2)
    kube = await KubeAPI.connect(hub_kubeconfig)
    try:
        everything, rv = await kube.list_resource("batch", "v1", "jobs")
        opted, _ = await kube.list_resource("batch", "v1", "jobs", label_selector="gpufed.io/queue")
    finally:
        await kube.close()

    def ours(items: list[dict[str, Any]]) -> list[str]:
        # other tests' Jobs of this namespace may still be terminating
        return sorted(
            j["metadata"]["name"]
            for j in items
            if j["metadata"]["namespace"] == NAMESPACE and j["metadata"]["name"].startswith("page-")
        )

    assert ours(everything) == [f"page-{i}" for i in range(7)]  # 4 pages of at most 2
    assert ours(opted) == ["page-0", "page-2", "page-4", "page-6"]
    assert rv.isdigit()
