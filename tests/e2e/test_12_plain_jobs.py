"""A plain batch/v1 Job applied to the hub cluster with ``kubectl apply`` and ``spec.managedBy:
gpufed.io/hub`` is federated like a GPUJob: placed, run by a member's Job controller, shown
``Complete`` on the hub (``kubectl wait --for=condition=Complete`` returns), and deleting it on
the hub deletes the member copy (docs/hub.md, "Plain workloads on the hub"). The e2e hub
cluster has no JobSet CRD: the Job path works all the same."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpufed.api.labels import GROUP, VERSION
from gpufed.cli.main import app
from tests.e2e.harness import DRILL_NS, E2E, H100, batch_job, unique, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


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
