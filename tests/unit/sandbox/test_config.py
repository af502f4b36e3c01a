"""Sandbox configuration that needs no running process: kubeconfig, scheduler and kwok
configuration, Node manifests, lease scaling, state-dir handling and early bad-input errors
(invalid fleet, missing binary), plus the CLI's one-line errors."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpufed.api.fleet import FleetSpec, node_specs
from gpufed.api.labels import SIM_DURATION_ANNOTATION, SIM_EXIT_CODE_ANNOTATION
from gpufed.cli.main import app
from gpufed.sandbox.binaries import CORE_BINARIES, BinDir
from gpufed.sandbox.components import KWOK_STAGES, kwok_configuration, node_lease_seconds
from gpufed.sandbox.nodes import node_manifest
from gpufed.sandbox.pki import create_pki
from gpufed.sandbox.runtime import Sandbox
from gpufed.sandbox.scheduler import scheduler_configuration
from gpufed.sandbox.state import ClusterEndpoint, SandboxError, default_state_dir, write_kubeconfig

REPO = Path(__file__).resolve().parents[3]
SMALL = REPO / "tests" / "fleets" / "small.yaml"


def fake_bin_dir(tmp_path: Path, without: tuple[str, ...] = ()) -> BinDir:
    d = tmp_path / "bin"
    d.mkdir()
    for name in CORE_BINARIES:
        if name not in without:
            (d / name).write_text("#!/bin/sh\nexit 1\n")
            os.chmod(d / name, 0o755)
    return BinDir(d)


def test_kubeconfig_has_one_context_per_cluster_and_hub_is_current(tmp_path: Path) -> None:
    pki = create_pki(tmp_path / "pki")
    eps = [
        ClusterEndpoint(
            name=n,
            role="hub" if n == "hub" else "member",
            context=n,
            server=f"https://127.0.0.1:{6443 + i}",
            etcd_prefix=f"/sandbox/{n}/registry",
            kubeconfig=tmp_path / f"{n}.kubeconfig",
        )
        for i, n in enumerate(["hub", "alpha", "beta"])
    ]
    path = tmp_path / "kubeconfig"
    write_kubeconfig(path, eps, pki, current="hub")
    doc = yaml.safe_load(path.read_text())
    assert doc["current-context"] == "hub"
    assert [c["name"] for c in doc["contexts"]] == ["hub", "alpha", "beta"]
    assert doc["clusters"][1]["cluster"]["server"] == "https://127.0.0.1:6444"
    ca = base64.b64decode(doc["clusters"][0]["cluster"]["certificate-authority-data"])
    assert ca == pki.ca_crt.read_bytes()
    assert doc["users"][0]["user"]["token"] == pki.token
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert pki.tokens_csv.read_text().startswith(f'{pki.token},admin,admin-uid,"system:masters"')


def test_scheduler_bin_packs_gpus() -> None:
    cfg = scheduler_configuration(Path("/x/admin.kubeconfig"))
    assert cfg["clientConnection"]["kubeconfig"] == "/x/admin.kubeconfig"
    (plugin,) = cfg["profiles"][0]["pluginConfig"]
    strategy = plugin["args"]["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    assert {"name": "nvidia.com/gpu", "weight": 5} in strategy["resources"]


def test_kwok_config_has_options_and_mutually_exclusive_finish_stages() -> None:
    docs = list(yaml.safe_load_all(kwok_configuration() + KWOK_STAGES.read_text()))
    assert docs[0]["kind"] == "KwokConfiguration"
    stages = {d["metadata"]["name"]: d for d in docs[1:]}
    assert set(stages) == {
        "node-initialize",
        "node-heartbeat-with-lease",
        "pod-ready",
        "gpufed-pod-succeed",
        "gpufed-pod-fail",
        "pod-delete",
    }
    succeed = stages["gpufed-pod-succeed"]["spec"]
    fail = stages["gpufed-pod-fail"]["spec"]
    # Both read the annotations gpufed.api.labels defines, and split on the same jq test.
    assert SIM_DURATION_ANNOTATION in succeed["delay"]["durationFrom"]["expressionFrom"]
    assert SIM_DURATION_ANNOTATION in fail["delay"]["durationFrom"]["expressionFrom"]
    split_s = succeed["selector"]["matchExpressions"][-1]
    split_f = fail["selector"]["matchExpressions"][-1]
    assert SIM_EXIT_CODE_ANNOTATION in split_s["key"]
    assert split_s["key"] == split_f["key"]
    assert (split_s["values"], split_f["values"]) == (["false"], ["true"])
    assert "phase: Failed" in fail["next"]["statusTemplate"]
    assert "reason: Error" in fail["next"]["statusTemplate"]


def test_node_manifest_sets_labels_taints_and_status_on_create() -> None:
    fleet = FleetSpec.load(SMALL)
    spec = next(n for n in node_specs(fleet.cluster("alpha")) if n.pool == "mig")
    m = node_manifest(spec)
    assert m["metadata"]["name"] == spec.name
    assert m["metadata"]["labels"] == spec.labels
    assert m["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert m["spec"]["taints"] == [
        {"key": "dedicated", "value": "inference", "effect": "NoSchedule"}
    ]
    assert m["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "14"
    assert m["status"]["nodeInfo"]["architecture"] == "amd64"


def test_lease_duration_grows_with_cluster_size() -> None:
    assert node_lease_seconds(8) == 40
    assert node_lease_seconds(250) == 40
    assert node_lease_seconds(251) == 80
    assert node_lease_seconds(2000) == 320


def test_default_state_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFED_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", "/s")
    assert default_state_dir() == Path("/s/gpufed/sandbox")
    monkeypatch.setenv("GPUFED_STATE_DIR", "/t/sb")
    assert default_state_dir() == Path("/t/sb")


def test_up_rejects_an_invalid_fleet_naming_the_file_before_starting_anything(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("clusters:\n- name: a\n  nodePools: []\n")
    state = tmp_path / "state"
    with pytest.raises(SandboxError, match=r"invalid fleet file .*bad\.yaml") as err:
        Sandbox(state, bin_dir=fake_bin_dir(tmp_path)).up(bad)
    assert "clusters[0].nodePools" in str(err.value)
    assert not state.exists()


def test_up_names_a_missing_binary_and_the_fix(tmp_path: Path) -> None:
    bins = fake_bin_dir(tmp_path, without=("kube-scheduler",))
    with pytest.raises(
        SandboxError, match=r"missing binaries in .*: kube-scheduler; run `gpufed local build`"
    ):
        Sandbox(tmp_path / "state", bin_dir=bins).up(SMALL)


def test_up_refuses_a_directory_that_is_not_a_sandbox(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "notes.txt").write_text("mine")
    with pytest.raises(SandboxError, match="not empty and holds no gpufed sandbox"):
        Sandbox(tmp_path / "state", bin_dir=fake_bin_dir(tmp_path)).up(SMALL)
    assert (tmp_path / "state" / "notes.txt").read_text() == "mine"


def test_up_reuses_a_stale_state_dir_and_cleans_up_after_a_dying_process(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "sandbox.json").write_text("{}")
    (state / "old.log").write_text("stale")
    # The fake etcd exits at once: up fails naming it and its log, stale files are gone.
    with pytest.raises(
        SandboxError, match=r"etcd: exited while starting with code 1 \(log: .*etcd\.log\)"
    ):
        Sandbox(state, bin_dir=fake_bin_dir(tmp_path)).up(SMALL)
    assert not (state / "old.log").exists()
    assert Sandbox(state).running_components() == []
    assert Sandbox(state).info().phase == "failed"


def test_status_and_down_without_a_sandbox(tmp_path: Path) -> None:
    sb = Sandbox(tmp_path / "none")
    assert not sb.status().exists
    assert sb.down() == []


def test_cli_prints_one_clear_error_and_exits_1(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "clusters:\n- name: a\n  nodePools:\n  - {name: p, nodes: 1, gpu: {product: NVIDIA-H200, count: 0}}\n"
    )
    result = CliRunner().invoke(
        app, ["local", "up", "--fleet", str(bad), "--state-dir", str(tmp_path / "s")]
    )
    assert result.exit_code == 1
    assert "error: invalid fleet file" in result.output
    assert "gpu.count" in result.output
    assert "Traceback" not in result.output


def test_cli_status_without_a_sandbox(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["local", "status", "--state-dir", str(tmp_path / "s")])
    assert result.exit_code == 1
    assert "no sandbox in" in result.output


def clashing_etcd(tmp_path: Path) -> tuple[BinDir, Path]:
    """Fake binaries whose etcd always reports a taken port; counts its starts."""
    bins = fake_bin_dir(tmp_path)
    starts = tmp_path / "etcd-starts"
    (bins.path / "etcd").write_text(
        f"#!/bin/sh\necho x >> {starts}\n"
        'echo "listen tcp 127.0.0.1:1: bind: address already in use" >&2\nexit 1\n'
    )
    return bins, starts


def test_a_picked_port_taken_meanwhile_is_retried_once_with_new_ports(tmp_path: Path) -> None:
    bins, starts = clashing_etcd(tmp_path)
    with pytest.raises(SandboxError, match=r"etcd: .* already in use by another process"):
        Sandbox(tmp_path / "state", bin_dir=bins).up(SMALL)
    assert len(starts.read_text().split()) == 2


def test_a_pinned_port_in_use_is_not_retried(tmp_path: Path) -> None:
    bins, starts = clashing_etcd(tmp_path)
    with pytest.raises(SandboxError, match="port clash"):
        Sandbox(tmp_path / "state", bin_dir=bins).up(SMALL, ports={"etcd": 2379})
    assert len(starts.read_text().split()) == 1
