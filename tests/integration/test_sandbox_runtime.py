"""The session sandbox against the fleet it was built from: kubeconfig contexts, API servers,
etcd prefixes, nodes with GFD labels and device-plugin allocatable, status."""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Callable

import pytest
from kubernetes import client as k8s
from typer.testing import CliRunner

from gpufed.api.fleet import FleetSpec, node_specs
from gpufed.cli.main import app
from gpufed.sandbox.kube import list_nodes_raw
from gpufed.sandbox.runtime import Sandbox, SandboxInfo

pytestmark = pytest.mark.integration

Kube = Callable[[str], k8s.ApiClient]


def test_kubeconfig_has_hub_and_members_and_every_api_server_answers(
    sandbox: SandboxInfo, kube: Kube
) -> None:
    assert list(sandbox.clusters) == ["hub", "alpha", "beta"]
    assert sandbox.members == ["alpha", "beta"]
    kc = k8s_config_doc(sandbox)
    assert kc["current-context"] == "hub"
    assert [c["name"] for c in kc["contexts"]] == ["hub", "alpha", "beta"]
    ports = {ep.server for ep in sandbox.clusters.values()}
    assert len(ports) == 3
    for name in sandbox.clusters:
        version = k8s.VersionApi(kube(name)).get_code()
        assert version.git_version == "v1.36.3"


def k8s_config_doc(sandbox: SandboxInfo) -> dict[str, object]:
    import yaml

    doc: dict[str, object] = yaml.safe_load(sandbox.kubeconfig.read_text())
    return doc


def test_hub_is_a_control_plane_without_nodes(kube: Kube) -> None:
    assert k8s.CoreV1Api(kube("hub")).list_node().items == []


def test_each_api_server_keeps_its_objects_under_its_own_etcd_prefix(
    sandbox: SandboxInfo, kube: Kube
) -> None:
    core = k8s.CoreV1Api(kube("alpha"))
    core.create_namespaced_config_map(
        "default", {"metadata": {"name": "only-in-alpha"}, "data": {"k": "v"}}
    )
    try:
        with pytest.raises(k8s.ApiException) as err:
            k8s.CoreV1Api(kube("beta")).read_namespaced_config_map("only-in-alpha", "default")
        assert err.value.status == 404
        key = "/sandbox/alpha/registry/configmaps/default/only-in-alpha"
        assert etcd_count(sandbox.etcd_url, key) == 1
        assert sandbox.clusters["alpha"].etcd_prefix == "/sandbox/alpha/registry"
        # Nothing of the API servers lands under the prefix reserved for the hub process.
        assert etcd_count(sandbox.etcd_url, sandbox.hub_etcd_prefix, prefix=True) == 0
    finally:
        core.delete_namespaced_config_map("only-in-alpha", "default")


def etcd_count(etcd_url: str, key: str, *, prefix: bool = False) -> int:
    """Keys at ``key`` (or under it) through etcd's JSON gateway."""
    raw = key.encode()
    body: dict[str, object] = {"key": base64.b64encode(raw).decode(), "count_only": True}
    if prefix:
        end = raw[:-1] + bytes([raw[-1] + 1])
        body["range_end"] = base64.b64encode(end).decode()
    req = urllib.request.Request(
        f"{etcd_url}/v3/kv/range", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return int(json.load(resp).get("count", 0))


@pytest.mark.parametrize("cluster", ["alpha", "beta"])
def test_nodes_carry_the_fleets_labels_taints_and_allocatable(
    cluster: str, small_fleet: FleetSpec, kube: Kube
) -> None:
    expected = {n.name: n for n in node_specs(small_fleet.cluster(cluster))}
    nodes = {n["metadata"]["name"]: n for n in list_nodes_raw(kube(cluster))}
    assert set(nodes) == set(expected)
    for name, spec in expected.items():
        node = nodes[name]
        labels = node["metadata"]["labels"]
        assert {k: labels.get(k) for k in spec.labels} == spec.labels
        assert node["status"]["allocatable"] == spec.allocatable
        assert node["status"]["capacity"] == spec.capacity
        taints = [t for t in node["spec"].get("taints") or [] if not t["key"].startswith("node.")]
        assert taints == [t.model_dump() for t in spec.taints]
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True"


def test_inventory_read_back_from_nodes(sandbox_runtime: Sandbox) -> None:
    inv = {g.cluster: g for g in sandbox_runtime.inventory()}
    alpha, beta = inv["alpha"], inv["beta"]
    assert alpha.gpus_total == {"NVIDIA-H100-80GB-HBM3": 16, "NVIDIA-A100-SXM4-80GB": 6}
    assert alpha.mig_total == {"nvidia.com/mig-1g.10gb": 14}
    assert alpha.nvlink_domains == {6: 1, 8: 2}
    assert alpha.taints == ["dedicated=inference:NoSchedule"]
    assert beta.gpus_total == {"NVIDIA-GB200": 16}
    assert beta.nvlink_domains == {8: 2}  # two cliques of 2 trays x 4 GPUs
    assert beta.nodes == beta.nodes_ready == 4


def test_status_reports_every_component_running(sandbox_runtime: Sandbox) -> None:
    st = sandbox_runtime.status()
    assert st.running
    assert st.phase == "running"
    names = [c.name for c in st.components]
    assert names == [
        "etcd",
        "apiserver/hub",
        "apiserver/alpha",
        "apiserver/beta",
        "controller-manager/alpha",
        "scheduler/alpha",
        "kwok/alpha",
        "controller-manager/beta",
        "scheduler/beta",
        "kwok/beta",
    ]
    assert all(c.rss_bytes > 0 for c in st.components)
    assert st.rss_bytes == sum(c.rss_bytes for c in st.components)
    assert all(c.reachable for c in st.clusters)


def test_cli_status_json(sandbox: SandboxInfo) -> None:
    result = CliRunner().invoke(
        app, ["local", "status", "--json", "--state-dir", str(sandbox.state_dir)]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["running"] is True
    assert {c["name"] for c in doc["clusters"]} == {"hub", "alpha", "beta"}


def test_up_refuses_a_state_dir_whose_sandbox_runs(
    sandbox: SandboxInfo, small_fleet: FleetSpec
) -> None:
    from gpufed.sandbox.runtime import SandboxError

    with pytest.raises(SandboxError, match="already running"):
        Sandbox(sandbox.state_dir, bin_dir=sandbox.bin_dir).up(small_fleet)
