"""Second sandboxes next to the session one: side by side with other ports, `down` leaves no
process or port behind, and bad input (occupied port, a process dying while starting) ends
with one message naming the cause and the log file, with everything stopped."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import psutil
import pytest

from gpufed.sandbox.binaries import CORE_BINARIES, BinDir
from gpufed.sandbox.runtime import Sandbox, SandboxError, SandboxInfo
from gpufed.sandbox.supervisor import http_ok, port_is_free

pytestmark = pytest.mark.integration

TINY = """
clusters:
  - name: solo
    nodePools:
      - {name: hgx, nodes: 1, gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}}
"""


@pytest.fixture
def tiny_fleet(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def processes_under(state_dir: Path) -> list[psutil.Process]:
    """Live processes whose command line mentions ``state_dir`` (every component's does)."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(str(state_dir) in arg for arg in p.info["cmdline"] or []):
                out.append(p)
        except psutil.Error:
            continue
    return out


def recorded_ports(sb: Sandbox) -> list[int]:
    return [p for name in sb.supervisor.names() for p in sb.supervisor.spec(name).ports]


def test_second_sandbox_runs_beside_the_first_and_down_leaves_nothing(
    sandbox: SandboxInfo, sandbox_bin_dir: BinDir, tiny_fleet: Path, tmp_path: Path
) -> None:
    second = Sandbox(tmp_path / "second", bin_dir=sandbox_bin_dir)
    info = second.up(tiny_fleet)
    try:
        assert info.members == ["solo"]
        assert info.etcd_url != sandbox.etcd_url
        assert {e.server for e in info.clusters.values()}.isdisjoint(
            {e.server for e in sandbox.clusters.values()}
        )
        assert second.inventory()[0].gpus_total == {"NVIDIA-H100-80GB-HBM3": 8}
        pids = [second.supervisor.pid(n) for n in second.supervisor.names()]
        assert all(pids)
        ports = recorded_ports(second)
    finally:
        stopped = second.down()
    assert len(stopped) == 1 + 2 + 3  # etcd, 2 API servers, KCM + scheduler + kwok
    assert processes_under(second.state_dir) == []
    assert all(port_is_free(p) for p in ports)
    assert second.status().phase == "stopped"
    # The session sandbox is untouched.
    assert http_ok(f"{sandbox.clusters['alpha'].server}/readyz")


def test_occupied_port_is_named_and_everything_started_is_stopped(
    sandbox_bin_dir: BinDir, tiny_fleet: Path, tmp_path: Path
) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    sb = Sandbox(tmp_path / "clash", bin_dir=sandbox_bin_dir)
    try:
        with pytest.raises(SandboxError) as err:
            sb.up(tiny_fleet, ports={"apiserver/hub": port})
    finally:
        holder.close()
    msg = str(err.value)
    assert msg.startswith("sandbox failed to start: apiserver/hub:")
    assert f"port {port}" in msg
    assert "already in use" in msg
    assert str(tmp_path / "clash" / "logs" / "apiserver" / "hub.log") in msg
    assert sb.running_components() == []
    assert processes_under(sb.state_dir) == []
    assert sb.info().phase == "failed"


def test_process_dying_at_start_is_named_with_its_log_and_the_rest_is_stopped(
    sandbox_bin_dir: BinDir, tiny_fleet: Path, tmp_path: Path
) -> None:
    bins = tmp_path / "bin"
    bins.mkdir()
    for name in CORE_BINARIES:
        (bins / name).symlink_to(sandbox_bin_dir.binary(name))
    (bins / "kube-scheduler").unlink()
    (bins / "kube-scheduler").write_text(
        "#!/bin/sh\necho 'E0101 scheduler: config invalid' >&2\nexit 2\n"
    )
    os.chmod(bins / "kube-scheduler", 0o755)
    sb = Sandbox(tmp_path / "dying", bin_dir=BinDir(bins))
    with pytest.raises(SandboxError) as err:
        sb.up(tiny_fleet)
    msg = str(err.value)
    assert "scheduler/solo: exited while starting with code 2" in msg
    assert str(tmp_path / "dying" / "logs" / "scheduler" / "solo.log") in msg
    assert "scheduler: config invalid" in msg
    assert sb.running_components() == []
    assert processes_under(sb.state_dir) == []
    assert all(port_is_free(p) for p in recorded_ports(sb))
