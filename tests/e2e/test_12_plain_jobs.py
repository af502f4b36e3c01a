"""A plain batch/v1 Job applied to the hub cluster with ``kubectl apply`` and ``spec.managedBy:
gpufed.io/hub`` is federated like a GPUJob: placed, run by a member's Job controller, shown
``Complete`` on the hub (``kubectl wait --for=condition=Complete`` returns), and deleting it on
the hub deletes the member copy (docs/hub.md, "Plain workloads on the hub"). A JobSet applied
the same way (the sandbox installs the CRDs of the fleet's operators in the hub cluster) runs
under the member's real JobSet operator and shows its ``Completed`` condition on the hub."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from typer.testing import CliRunner

from gpufed.api.labels import GROUP, MANAGED_BY, QUEUE_LABEL, VERSION
from gpufed.cli.main import app
from gpufed.sandbox.operators import apply_objects, crds, operator
from tests.e2e.harness import DRILL_NS, E2E, H100, batch_job, unique, wait_until

# 420 s: the first test also waits for the session sandbox when the file runs alone (with the
# example fleet's three operators, minutes on a loaded 2-core machine)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def _kubectl(e2e: E2E, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(e2e.info.kubeconfig), "--context", "hub", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )


def _plain_job(name: str) -> dict[str, Any]:
    job = batch_job(1, run_for="5s")
    job["metadata"] = {
        "name": name,
        "namespace": DRILL_NS,
        # the hub watches only workloads with a queue label (DRILL_NS is in the default queue)
        "labels": {QUEUE_LABEL: "default"},
        "annotations": {"gpufed.io/gpu-products": H100},
    }
    job["spec"]["managedBy"] = "gpufed.io/hub"
    return job


def _hub_job(e2e: E2E, name: str) -> dict[str, Any] | None:
    got = _kubectl(e2e, "get", "job", "-n", DRILL_NS, name, "-o", "json")
    return json.loads(got.stdout) if got.returncode == 0 else None


def test_a_plain_job_applied_to_the_hub_runs_in_a_member_and_completes_there_and_here(
    e2e: E2E,
) -> None:
    hub = e2e.hub
    name = unique("plain")
    applied = _kubectl(e2e, "apply", "-f", "-", stdin=yaml.safe_dump(_plain_job(name)))
    assert applied.returncode == 0, applied.stderr
    gpujob = f"job-{name}"
    wait_until(lambda: hub.job(gpujob), f"GPUJob {gpujob} made for the Job")
    obj = hub.job(gpujob)
    assert obj is not None
    owner = obj["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("Job", name, True)
    assert obj["spec"]["placement"]["gpuProducts"] == [H100]
    assert "managedBy" not in obj["spec"]["template"]["spec"]
    uid = obj["metadata"]["uid"]

    st = hub.wait_phase(gpujob, ("Running", "Succeeded"), timeout_s=90)
    assert st["cluster"] == "us-east-hgx"  # the only H100 member
    copy = e2e.members["us-east-hgx"].jobs_of(uid)
    assert [j.metadata.name for j in copy] == [name]
    assert copy[0].spec.managed_by is None  # the member's own Job controller runs it

    waited = _kubectl(
        e2e, "wait", "-n", DRILL_NS, "--for=condition=Complete", f"job/{name}", "--timeout=120s"
    )
    assert waited.returncode == 0, waited.stderr
    job = _hub_job(e2e, name)
    assert job is not None
    status = job["status"]
    assert status["succeeded"] == 1
    assert status["completionTime"] >= status["startTime"]
    types = {c["type"] for c in status["conditions"] if c["status"] == "True"}
    assert types == {"SuccessCriteriaMet", "Complete"}
    assert hub.phase(gpujob) == "Succeeded"

    # gpufed get jobs lists it like any GPUJob.
    listed = CliRunner().invoke(
        app,
        [
            "get",
            "jobs",
            "-n",
            DRILL_NS,
            "-o",
            "json",
            f"--kubeconfig={e2e.info.kubeconfig}",
            "--context=hub",
        ],
    )
    assert listed.exit_code == 0, listed.output
    assert gpujob in listed.output

    deleted = _kubectl(e2e, "delete", "job", "-n", DRILL_NS, name, "--wait=true")
    assert deleted.returncode == 0, deleted.stderr
    wait_until(lambda: hub.job(gpujob) is None, "the GPUJob gone with its Job", 60)
    assert e2e.copies(uid) == {}


def test_a_running_plain_job_deleted_on_the_hub_is_deleted_in_the_member(e2e: E2E) -> None:
    hub = e2e.hub
    name = unique("plain-run")
    job = _plain_job(name)
    job["spec"]["template"]["metadata"]["annotations"] = {}  # runs until deleted
    applied = _kubectl(e2e, "apply", "-f", "-", stdin=yaml.safe_dump(job))
    assert applied.returncode == 0, applied.stderr
    gpujob = f"job-{name}"
    wait_until(lambda: hub.job(gpujob), f"GPUJob {gpujob} made for the Job")
    uid = hub.job(gpujob)["metadata"]["uid"]  # type: ignore[index]
    hub.wait_phase(gpujob, "Running", timeout_s=90)
    wait_until(lambda: _active(e2e, name), "the hub Job shows an active pod", 60)

    deleted = _kubectl(e2e, "delete", "job", "-n", DRILL_NS, name)
    assert deleted.returncode == 0, deleted.stderr
    wait_until(lambda: hub.job(gpujob) is None, "the GPUJob gone with its Job", 90)
    assert e2e.copies(uid) == {}
    assert not [
        o
        for o in hub.custom.list_namespaced_custom_object(GROUP, VERSION, DRILL_NS, "gpujobs")[
            "items"
        ]
        if o["metadata"]["name"] == gpujob
    ]


def _active(e2e: E2E, name: str) -> bool:
    job = _hub_job(e2e, name)
    return bool(
        job and (job.get("status") or {}).get("active") == 1 and job["status"].get("startTime")
    )


# --- a JobSet, run by the member's real JobSet operator ------------------------------------------

#: A GPUQueue over its own namespace: the managed JobSet names it with the queue label.
QUEUE = "q-plain-js"


@pytest.fixture
def queue(e2e: E2E) -> Iterator[str]:
    """GPUQueue ``q-plain-js`` (64 H100) over namespace ``q-plain-js``; the namespace's
    JobSets, GPUJobs and the queue are removed afterwards."""
    e2e.hub.create_queue(QUEUE, gpu_product=H100, nominal=64)
    try:
        yield QUEUE
    finally:
        _kubectl(e2e, "delete", "jobsets", "--all", "-n", QUEUE, "--wait=false")
        e2e.hub.clear(QUEUE)
        with contextlib.suppress(ApiException):
            e2e.hub.custom.delete_cluster_custom_object(GROUP, VERSION, "gpuqueues", QUEUE)


def _plain_jobset(name: str, queue: str) -> dict[str, Any]:
    """A JobSet of one replicated Job of 2 pods x 8 H100 that end after 5 s, managed by the
    hub, charged to GPUQueue ``queue`` by its label."""
    job = batch_job(8, pods=2, run_for="5s")["spec"]
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": queue,
            "labels": {QUEUE_LABEL: queue},
            "annotations": {"gpufed.io/gpu-products": H100},
        },
        "spec": {
            "managedBy": MANAGED_BY,
            "replicatedJobs": [{"name": "trainer", "replicas": 1, "template": {"spec": job}}],
        },
    }


def test_a_jobset_applied_to_the_hub_runs_under_the_members_jobset_operator_and_completes_here(
    e2e: E2E, queue: str
) -> None:
    """The sandbox installs the JobSet CRD in the hub cluster (no controller there): a JobSet
    applied with ``managedBy: gpufed.io/hub`` and the queue label is federated, its member copy
    (without ``managedBy``) run by us-east-hgx's JobSet controller, whose ``Completed``
    condition comes back into the hub JobSet's own status; deleting it cleans the member."""
    hub = e2e.hub
    name = unique("plain-js")
    t0 = time.monotonic()
    applied = _kubectl(e2e, "apply", "-f", "-", stdin=yaml.safe_dump(_plain_jobset(name, queue)))
    assert applied.returncode == 0, applied.stderr
    gpujob = f"jobset-{name}"
    obj: dict[str, Any] = wait_until(
        lambda: hub.job(gpujob, queue), f"GPUJob {gpujob} made for the JobSet", 60
    )
    owner = obj["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("JobSet", name, True)
    assert obj["spec"]["placement"]["queue"] == queue
    assert "managedBy" not in obj["spec"]["template"]["spec"]
    uid = obj["metadata"]["uid"]

    st = hub.wait_phase(gpujob, ("Running", "Succeeded"), namespace=queue, timeout_s=90)
    running_s = time.monotonic() - t0
    assert st["cluster"] == "us-east-hgx"
    member = e2e.members["us-east-hgx"]
    custom: Any = k8s.CustomObjectsApi(member.api)
    copy = custom.get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", queue, "jobsets", name
    )
    assert "managedBy" not in copy["spec"]  # the member's JobSet controller runs it
    # ... and made the Job, whose pods carry the GPUJob's uid
    jobs = member.batch.list_namespaced_job(
        queue, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}"
    ).items
    assert [[o.kind for o in j.metadata.owner_references] for j in jobs] == [["JobSet"]]

    waited = _kubectl(
        e2e, "wait", "-n", queue, "--for=condition=Completed", f"jobset/{name}", "--timeout=120s"
    )
    assert waited.returncode == 0, waited.stderr
    got = _kubectl(e2e, "get", "jobset", "-n", queue, name, "-o", "json")
    status = json.loads(got.stdout)["status"]
    assert status["terminalState"] == "Completed"
    completed = [c for c in status["conditions"] if c["type"] == "Completed"]
    assert [(c["status"], c["reason"]) for c in completed] == [("True", "AllJobsCompleted")]
    assert hub.phase(gpujob, queue) == "Succeeded"
    print(f"managed JobSet apply->Running {running_s:.1f}s; hub status {status}")

    deleted = _kubectl(e2e, "delete", "jobset", "-n", queue, name, "--wait=true")
    assert deleted.returncode == 0, deleted.stderr
    wait_until(lambda: hub.job(gpujob, queue) is None, "the GPUJob gone with its JobSet", 60)

    def member_left() -> list[str]:
        left = custom.list_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", queue, "jobsets"
        )["items"]
        return [o["metadata"]["name"] for o in left] + [
            j.metadata.name for j in member.batch.list_namespaced_job(queue).items
        ]

    wait_until(lambda: not member_left(), "the member's JobSet and its Jobs gone", 60)
    wait_until(lambda: not member.pods_of(uid), "the member's pods gone", 60)


# --- PyTorchJob and RayJob: their operators' CRDs leave no room for gpufed.io/hub ----------------


def test_a_pytorchjob_or_rayjob_cannot_be_handed_to_the_hub_by_managed_by(e2e: E2E) -> None:
    """With the operators' real CRDs applied to the hub cluster here (the sandbox installs only
    JobSet's there, the kind the hub can accept): KubeRay v1.5.0 refuses a RayJob whose
    ``spec.managedBy`` is ``gpufed.io/hub`` (its CEL rule allows only its own name and
    MultiKueue's), and training-operator v1.8.1's PyTorchJob has no ``runPolicy.managedBy``:
    refused under kubectl's strict field validation, dropped without it, so the hub makes no
    GPUJob for it (docs/hub.md, "Plain workloads
    on the hub": submit those wrapped in a GPUJob)."""
    wanted = {"PyTorchJob", "RayJob"}
    hub_crds = [
        crd
        for op in (operator("training-operator"), operator("kuberay"))
        for crd in crds(op, op.tool.module_dir())
        if crd["spec"]["names"]["kind"] in wanted
    ]
    assert {c["spec"]["names"]["kind"] for c in hub_crds} == wanted
    apply_objects(e2e.hub.api, hub_crds, timeout_s=300)

    name = unique("plain-ray")
    ray = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": DRILL_NS},
        "spec": {"managedBy": MANAGED_BY, "entrypoint": "python -c 'pass'"},
    }
    refused = _kubectl(e2e, "apply", "-f", "-", stdin=yaml.safe_dump(ray))
    assert refused.returncode != 0
    assert "managedBy field value must be either 'ray.io/kuberay-operator'" in refused.stderr

    name = unique("plain-ptj")
    worker = {"replicas": 1, "template": batch_job(8)["spec"]["template"]}
    ptj = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": DRILL_NS},
        "spec": {"runPolicy": {"managedBy": MANAGED_BY}, "pytorchReplicaSpecs": {"Master": worker}},
    }
    # kubectl asks for strict field validation: refused; without it the field is dropped
    strict = _kubectl(e2e, "apply", "-f", "-", stdin=yaml.safe_dump(ptj))
    assert strict.returncode != 0
    assert 'unknown field "spec.runPolicy.managedBy"' in strict.stderr
    applied = _kubectl(e2e, "apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump(ptj))
    assert applied.returncode == 0, applied.stderr
    try:
        got = _kubectl(e2e, "get", "pytorchjob", "-n", DRILL_NS, name, "-o", "json")
        assert "managedBy" not in json.loads(got.stdout)["spec"].get("runPolicy", {})
        assert not [j["metadata"]["name"] for j in e2e.hub.jobs() if name in j["metadata"]["name"]]
    finally:
        _kubectl(e2e, "delete", "pytorchjob", "-n", DRILL_NS, name, "--wait=false")
