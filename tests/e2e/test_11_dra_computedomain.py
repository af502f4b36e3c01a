"""A 32-GPU ComputeDomain job on a DRA NVL72 member, end to end, in a sandbox of its own
(tests/fleets/computedomain.yaml): its 8 pods run in one clique, each holding its GPU claim and
the domain's channel claim (allocated by the member's real kube-scheduler), the ComputeDomain
gpufed created turns Ready (the sandbox's simulated controller), and deleting the GPUJob
deletes the domain and its channel template."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(480)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "manifests" / "examples" / "computedomain" / "pretrain-nvl72.yaml"
GPUFED = str(Path(sys.executable).parent / "gpufed")


def _seen(member: client.ApiClient) -> dict[str, Any]:
    custom, core = client.CustomObjectsApi(member), client.CoreV1Api(member)
    domains = custom.list_cluster_custom_object("resource.nvidia.com", "v1beta1", "computedomains")
    claims = custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceclaims")
    pods = core.list_namespaced_pod("team-a", label_selector="gpufed.io/job-uid").items
    cliques = {
        n.metadata.name: (n.metadata.labels or {}).get("nvidia.com/gpu.clique")
        for n in core.list_node().items
    }
    allocated = {}
    for c in claims["items"]:
        for r in (
            ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
        ):
            allocated.setdefault(r["driver"], []).append(r["pool"])
    return {
        "domains": domains["items"],
        "allocated": allocated,
        "pods": [(p.spec.node_name, p.status.phase) for p in pods],
        "cliques": cliques,
    }


def test_a_compute_domain_job_on_nvl72(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    job = yaml.safe_load(EXAMPLE.read_text())
    pod_meta = job["spec"]["template"]["items"][1]["spec"]["template"]["metadata"]
    pod_meta["annotations"]["gpufed.io/sim-duration"] = "45s"  # long enough to look at it
    (jobs / "cd.yaml").write_text(yaml.safe_dump(job))
    state = tmp_path / "sandbox"
    demo = subprocess.Popen(
        [GPUFED, "demo", "--fleet", str(REPO / "tests" / "fleets" / "computedomain.yaml"),
         "--jobs", str(jobs), "--state-dir", str(state)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        kubeconfig = state / "kubeconfig"
        deadline = time.monotonic() + 360
        while not kubeconfig.exists() and time.monotonic() < deadline:
            time.sleep(2)
        member = config.new_client_from_config(config_file=str(kubeconfig), context="nvl72-dra")
        seen: dict[str, Any] = {}
        while time.monotonic() < deadline and demo.poll() is None:
            try:
                seen = _seen(member)
            except Exception:  # the member is still starting
                time.sleep(2)
                continue
            d = seen["domains"]
            running = [n for n, phase in seen["pods"] if phase == "Running"]
            if d and (d[0].get("status") or {}).get("status") == "Ready" and len(running) == 8:
                break
            time.sleep(1)
        else:
            pytest.fail(f"the domain never turned Ready with 8 running pods: {seen}")
        domain = seen["domains"][0]
        assert domain["metadata"]["name"] == "pretrain-cd"
        assert domain["spec"]["numNodes"] == 8
        nodes = {n for n, _ in seen["pods"]}
        assert len(nodes) == 8
        assert len({seen["cliques"][n] for n in nodes}) == 1
        assert sorted(seen["allocated"]["compute-domain.nvidia.com"]) == sorted(nodes)
        gpus = seen["allocated"]["gpu.nvidia.com"]  # one entry per GPU, its node's pool
        assert len(gpus) == 32
        assert set(gpus) == nodes
        assert sorted(n["name"] for n in domain["status"]["nodes"]) == sorted(nodes)
        out, _ = demo.communicate(timeout=300)
        assert demo.returncode == 0, out[-4000:]
        hub = config.new_client_from_config(config_file=str(kubeconfig), context="hub")
        client.CustomObjectsApi(hub).delete_namespaced_custom_object(
            "gpufed.io", "v1alpha1", "team-a", "gpujobs", "pretrain-cd"
        )
        custom = client.CustomObjectsApi(member)
        gone = time.monotonic() + 60
        while time.monotonic() < gone:
            left = custom.list_cluster_custom_object(
                "resource.nvidia.com", "v1beta1", "computedomains"
            )["items"]
            templates = [
                t["metadata"]["name"]
                for t in custom.list_cluster_custom_object(
                    "resource.k8s.io", "v1", "resourceclaimtemplates"
                )["items"]
            ]
            if not left and "pretrain-cd-imex-channel" not in templates:
                break
            time.sleep(1)
        else:
            pytest.fail(f"the domain outlived its job: {left} {templates}")
    finally:
        if demo.poll() is None:
            demo.kill()
        subprocess.run([GPUFED, "local", "down", "--state-dir", str(state)], check=False,
                       capture_output=True, timeout=120)  # fmt: skip
