"""kind provider configuration (gpufed.sandbox.kind): generated without a Docker engine."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpufed.api.fleet import FleetSpec
from gpufed.sandbox.binaries import K8S_VERSION
from gpufed.sandbox.kind import (
    kind_bundle,
    kind_cluster_name,
    kind_config,
    scheduler_config,
    stage_manifests,
)
from gpufed.sandbox.scheduler import scheduler_configuration

REPO = Path(__file__).resolve().parents[3]
SMALL = REPO / "tests" / "fleets" / "small.yaml"


def test_member_kind_config_runs_the_gpu_bin_packing_scheduler(tmp_path: Path) -> None:
    cfg = kind_config("alpha", scheduler_dir=tmp_path)
    assert cfg["kind"] == "Cluster"
    assert cfg["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    assert cfg["name"] == "gpufed-alpha"
    assert cfg["networking"] == {"apiServerAddress": "127.0.0.1", "apiServerPort": 0}
    (node,) = cfg["nodes"]
    assert node["role"] == "control-plane"
    assert node["image"] == f"kindest/node:{K8S_VERSION}"
    assert node["extraMounts"][0]["hostPath"] == str(tmp_path)
    (patch_text,) = node["kubeadmConfigPatches"]
    patch = yaml.safe_load(patch_text)
    assert patch["kind"] == "ClusterConfiguration"
    assert patch["scheduler"]["extraArgs"] == [
        {"name": "config", "value": "/etc/kubernetes/gpufed/scheduler.yaml"}
    ]


def test_hub_kind_config_is_a_plain_control_plane() -> None:
    cfg = kind_config("hub", scheduler_dir=None)
    assert cfg["name"] == kind_cluster_name("hub") == "gpufed-hub"
    assert "extraMounts" not in cfg["nodes"][0]


def test_bundle_writes_configs_nodes_and_stages_per_cluster(tmp_path: Path) -> None:
    fleet = FleetSpec.load(SMALL)
    files = kind_bundle(fleet, tmp_path)
    assert [f.name for f in files] == ["hub", "alpha", "beta"]
    alpha = files[1]
    assert alpha.nodes is not None
    assert alpha.scheduler is not None
    assert alpha.stages is not None
    nodes = list(yaml.safe_load_all(alpha.nodes.read_text()))
    assert [n["metadata"]["name"] for n in nodes] == [
        "alpha-hgx-000",
        "alpha-hgx-001",
        "alpha-mig-000",
    ]
    # In-cluster kwok manages only nodes with this annotation (kind's own node stays real).
    assert all(n["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake" for n in nodes)
    assert nodes[2]["status"]["allocatable"]["nvidia.com/gpu"] == "6"
    sched = yaml.safe_load(alpha.scheduler.read_text())
    assert sched["clientConnection"]["kubeconfig"] == "/etc/kubernetes/scheduler.conf"
    stages = list(yaml.safe_load_all(alpha.stages.read_text()))
    assert stages == stage_manifests()
    assert {s["kind"] for s in stages} == {"Stage"}
    cfg = yaml.safe_load(alpha.kind_config.read_text())
    assert cfg["nodes"][0]["extraMounts"][0]["hostPath"] == str((tmp_path / "alpha").absolute())


def test_kind_members_run_the_process_sandboxs_scheduler_configuration() -> None:
    kind, process = scheduler_config(), scheduler_configuration("/x/admin.kubeconfig")
    assert kind["clientConnection"].pop("kubeconfig") == "/etc/kubernetes/scheduler.conf"
    assert process["clientConnection"].pop("kubeconfig") == "/x/admin.kubeconfig"
    assert kind == process
