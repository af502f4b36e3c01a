"""Command lines of the sandbox's cluster processes (gpufed.sandbox.components): which
processes a fleet gets, in which order, on which ports, and the flags that tie them together."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpufed.api.fleet import FleetSpec
from gpufed.sandbox import components
from gpufed.sandbox.binaries import BinDir
from gpufed.sandbox.pki import create_pki
from gpufed.sandbox.scheduler import scheduler_configuration
from gpufed.sandbox.state import ClusterEndpoint, SandboxInfo
from gpufed.sandbox.supervisor import ComponentSpec

REPO = Path(__file__).resolve().parents[3]
SMALL = REPO / "tests" / "fleets" / "small.yaml"


def small_sandbox(state: Path) -> tuple[SandboxInfo, dict[str, int], list[ComponentSpec]]:
    """tests/fleets/small.yaml (hub, alpha, beta) with ports from 20000 on: its SandboxInfo,
    the ports and the command lines."""
    fleet = FleetSpec.load(SMALL)
    ports = {name: 20000 + i for i, name in enumerate(components.port_names(fleet))}
    pki = create_pki(state / "pki")
    clusters = {
        n: ClusterEndpoint(
            name=n,
            role="hub" if n == "hub" else "member",
            context=n,
            server=f"https://127.0.0.1:{ports[f'apiserver/{n}']}",
            etcd_prefix=f"/sandbox/{n}/registry",
            kubeconfig=state / "clusters" / n / "admin.kubeconfig",
            nodes=0 if n == "hub" else fleet.cluster(n).node_count,
        )
        for n in ["hub", *fleet.names]
    }
    info = SandboxInfo(
        state_dir=state,
        kubeconfig=state / "kubeconfig",
        etcd_url=f"http://127.0.0.1:{ports['etcd']}",
        bin_dir=state / "bin",
        fleet_file=SMALL,
        clusters=clusters,
        token=pki.token,
        ca_file=pki.ca_crt,
    )
    return info, ports, components.cluster_components(info, BinDir(state / "bin"), pki, ports)


def test_a_fleet_gets_etcd_then_api_servers_then_each_members_processes(tmp_path: Path) -> None:
    _, ports, specs = small_sandbox(tmp_path)
    assert [s.name for s in specs] == [
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
    # Every named port is listened on by exactly one process; kwok listens on none.
    assert sorted(p for s in specs for p in s.ports) == sorted(ports.values())
    assert not (tmp_path / "clusters").exists()  # building command lines writes nothing


def test_api_servers_share_one_etcd_under_their_own_prefix(tmp_path: Path) -> None:
    info, _, specs = small_sandbox(tmp_path)
    for s in specs:
        if s.name.startswith("apiserver/"):
            cluster = s.name.removeprefix("apiserver/")
            assert f"--etcd-servers={info.etcd_url}" in s.argv
            assert f"--etcd-prefix=/sandbox/{cluster}/registry" in s.argv


def test_node_grace_period_and_kwok_lease_follow_the_member_size(tmp_path: Path) -> None:
    info, _, specs = small_sandbox(tmp_path)
    by_name = {s.name: s for s in specs}
    lease = components.node_lease_seconds(info.clusters["alpha"].nodes)
    assert f"--node-monitor-grace-period={lease}s" in by_name["controller-manager/alpha"].argv
    assert f"--node-lease-duration-seconds={lease}" in by_name["kwok/alpha"].argv
    kwok_dir = tmp_path / "clusters" / "alpha" / "kwok"
    assert by_name["kwok/alpha"].env == {"KWOK_WORKDIR": str(kwok_dir)}


def test_config_files_are_where_the_command_lines_point(tmp_path: Path) -> None:
    info, _, specs = small_sandbox(tmp_path)
    for m in info.members:
        (tmp_path / "clusters" / m).mkdir(parents=True)
    components.write_config_files(info)
    by_name = {s.name: s for s in specs}

    def config_of(component: str) -> Path:
        (flag,) = [a for a in by_name[component].argv if a.startswith("--config=")]
        return Path(flag.removeprefix("--config="))

    for m in info.members:
        written = yaml.safe_load(config_of(f"scheduler/{m}").read_text())
        assert written == scheduler_configuration(info.clusters[m].kubeconfig)
        docs = list(yaml.safe_load_all(config_of(f"kwok/{m}").read_text()))
        assert docs[0]["kind"] == "KwokConfiguration"
        assert {d["kind"] for d in docs[1:]} == {"Stage"}
        assert (tmp_path / "clusters" / m / "kwok").is_dir()
