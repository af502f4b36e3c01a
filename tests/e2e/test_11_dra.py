"""A DRA member end to end, in a sandbox of its own (tests/fleets/dra.yaml): the sandbox's
simulated driver publishes dra-h100's GPUs as ResourceSlices, its agent reports them, the hub
sizes a GPUJob from the ResourceClaimTemplate it carries and places it only there, the template
goes to the member with the Job, and the member's real kube-scheduler allocates the claims
(the pods would not bind otherwise). A plain nvidia.com/gpu job goes to plain-h100 only, and a
claim whose selector no member's GPUs pass is rejected by DeviceSelectors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "manifests" / "examples" / "dra" / "claim-h100.yaml"


def _plain_job() -> dict[str, object]:
    return {
        "apiVersion": "gpufed.io/v1alpha1",
        "kind": "GPUJob",
        "metadata": {
            "name": "plain-h100",
            "namespace": "team-a",
            "annotations": {"gpufed.io/expect": "Succeeded on plain-h100"},
        },
        "spec": {
            "template": {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "spec": {
                    "backoffLimit": 0,
                    "template": {
                        "metadata": {"annotations": {"gpufed.io/sim-duration": "2s"}},
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [
                                {
                                    "name": "c",
                                    "image": "t:1",
                                    "resources": {"limits": {"nvidia.com/gpu": 8}},
                                }
                            ],
                        },
                    },
                },
            }
        },
    }


def _no_such_gpu() -> dict[str, object]:
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"]["name"] = "dra-rubin"
    job["metadata"]["annotations"] = {"gpufed.io/expect": "Failed unplaced because Rejected"}
    tpl = job["spec"]["template"]["items"][0]
    exactly = tpl["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    exactly["selectors"] = [
        {"cel": {"expression": "device.attributes['gpu.nvidia.com'].architecture == 'Rubin'"}}
    ]
    return job


def test_a_dra_job_runs_on_the_dra_member_and_only_there(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    shutil.copy(EXAMPLE, jobs / "1-claim-h100.yaml")
    (jobs / "2-plain.yaml").write_text(yaml.safe_dump(_plain_job()))
    (jobs / "3-rubin.yaml").write_text(yaml.safe_dump(_no_such_gpu()))
    run = subprocess.run(
        [
            str(Path(sys.executable).parent / "gpufed"),
            "demo",
            "--fleet",
            str(REPO / "tests" / "fleets" / "dra.yaml"),
            "--jobs",
            str(jobs),
            "--state-dir",
            str(tmp_path / "sandbox"),
            "--json",
            "--down",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    rows = {r["job"]: r for r in json.loads(run.stdout.strip().splitlines()[-1])}
    assert rows["team-a/dra-finetune-h100"]["cluster"] == "dra-h100"
    assert rows["team-a/dra-finetune-h100"]["gpus"] == 8
    assert rows["team-a/plain-h100"]["cluster"] == "plain-h100"
