"""Pod lifecycle in member clusters (kwok stages): GPU Jobs run to Complete or Failed through
the member's own scheduler and Job controller, annotated by gpufed.io/sim-duration and
gpufed.io/sim-exit-code; pods without them keep running until deleted."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from gpufed.api.labels import SIM_DURATION_ANNOTATION, SIM_EXIT_CODE_ANNOTATION

pytestmark = pytest.mark.integration

Kube = Callable[[str], k8s.ApiClient]


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Poll ``check`` until it returns something truthy (external processes: no event to await)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.3)


@pytest.fixture
def ns(kube: Kube) -> Iterator[str]:
    """A fresh namespace in member alpha, deleted afterwards."""
    name = f"lifecycle-{uuid.uuid4().hex[:6]}"
    core = k8s.CoreV1Api(kube("alpha"))
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def gpu_job(name: str, gpus: int, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "trainer:1.0",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def job_condition(batch: k8s.BatchV1Api, name: str, ns: str) -> str | None:
    job = batch.read_namespaced_job(name, ns)
    for c in job.status.conditions or []:
        if c.type in ("Complete", "Failed") and c.status == "True":
            return str(c.type)
    return None


def only_pod(core: k8s.CoreV1Api, ns: str, job: str) -> k8s.V1Pod:
    pods = core.list_namespaced_pod(ns, label_selector=f"job-name={job}").items
    assert len(pods) == 1
    return pods[0]


def test_gpu_job_runs_for_its_duration_then_completes(kube: Kube, ns: str) -> None:
    batch, core = k8s.BatchV1Api(kube("alpha")), k8s.CoreV1Api(kube("alpha"))
    batch.create_namespaced_job(ns, gpu_job("train", 8, {SIM_DURATION_ANNOTATION: "2s"}))
    pod = wait_for(
        "pod Running",
        lambda: next(
            (p for p in core.list_namespaced_pod(ns).items if p.status.phase == "Running"), None
        ),
    )
    assert pod.spec.node_name.startswith("alpha-hgx-")  # 8 GPUs fit the HGX nodes only
    assert wait_for("job finished", lambda: job_condition(batch, "train", ns)) == "Complete"
    pod = only_pod(core, ns, "train")
    assert pod.status.phase == "Succeeded"
    term = pod.status.container_statuses[0].state.terminated
    assert (term.exit_code, term.reason) == (0, "Completed")
    ran = (term.finished_at - pod.status.start_time).total_seconds()
    assert ran >= 1.5


def test_gpu_job_with_exit_code_fails_and_the_pod_shows_why(kube: Kube, ns: str) -> None:
    batch, core = k8s.BatchV1Api(kube("alpha")), k8s.CoreV1Api(kube("alpha"))
    batch.create_namespaced_job(
        ns,
        gpu_job("crash", 4, {SIM_DURATION_ANNOTATION: "1s", SIM_EXIT_CODE_ANNOTATION: "7"}),
    )
    assert wait_for("job finished", lambda: job_condition(batch, "crash", ns)) == "Failed"
    job = batch.read_namespaced_job("crash", ns)
    failed = next(c for c in job.status.conditions if c.type == "Failed")
    assert failed.reason == "BackoffLimitExceeded"
    pod = only_pod(core, ns, "crash")
    assert pod.status.phase == "Failed"
    term = pod.status.container_statuses[0].state.terminated
    assert term.exit_code == 7
    assert term.reason == "Error"
    assert SIM_EXIT_CODE_ANNOTATION in term.message


def bare_pod(
    name: str,
    annotations: dict[str, str],
    resources: dict[str, str],
    tolerate_inference: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{"name": "c", "image": "x:1", "resources": {"limits": resources}}],
    }
    if tolerate_inference:
        spec["tolerations"] = [
            {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}
        ]
    return {"metadata": {"name": name, "annotations": annotations}, "spec": spec}


def phase(core: k8s.CoreV1Api, ns: str, name: str) -> str:
    return str(core.read_namespaced_pod(name, ns).status.phase)


def test_pod_without_duration_keeps_running_until_deleted(kube: Kube, ns: str) -> None:
    core = k8s.CoreV1Api(kube("alpha"))
    core.create_namespaced_pod(ns, bare_pod("server", {}, {"nvidia.com/gpu": "1"}))
    core.create_namespaced_pod(
        ns, bare_pod("short", {SIM_DURATION_ANNOTATION: "1s"}, {"nvidia.com/gpu": "1"})
    )
    # Both start together; once the short one has finished, the other must still run.
    wait_for("short pod Succeeded", lambda: phase(core, ns, "short") == "Succeeded")
    assert phase(core, ns, "server") == "Running"
    core.delete_namespaced_pod("server", ns)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("server", ns)
        except k8s.ApiException as exc:
            return exc.status == 404
        return False

    wait_for("deleted pod gone", gone, timeout=30)


def test_mig_slices_schedule_onto_the_tainted_mig_node(kube: Kube, ns: str) -> None:
    core = k8s.CoreV1Api(kube("alpha"))
    core.create_namespaced_pod(
        ns,
        bare_pod("infer", {}, {"nvidia.com/mig-1g.10gb": "2"}, tolerate_inference=True),
    )
    wait_for("MIG pod Running", lambda: phase(core, ns, "infer") == "Running")
    assert core.read_namespaced_pod("infer", ns).spec.node_name == "alpha-mig-000"
