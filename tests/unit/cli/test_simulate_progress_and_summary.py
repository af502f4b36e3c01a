"""Small CLI messages: ``gpufed simulate``'s progress lines (fake clock) and the hub line of
``gpufed local up``'s summary with and without the MultiKueue peer."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufed.cli import local
from gpufed.cli.simulate import _Progress
from gpufed.placement.sim.simulate import load_fleet, simulate
from gpufed.placement.sim.trace import TraceJob
from gpufed.sandbox.state import SandboxInfo

FLEET = Path(__file__).resolve().parents[3] / "manifests" / "fleets" / "sim-itp.yaml"


def test_progress_prints_one_line_per_interval_of_wall_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    now = [100.0]
    progress = _Progress("gpufed", every_s=10.0, clock=lambda: now[0])
    progress(1, 50, 60.0)  # 0 s in: nothing yet
    now[0] = 109.0
    progress(2, 50, 120.0)
    assert capsys.readouterr().err == ""
    now[0] = 110.5
    progress(20, 50, 86_400.0 * 1.5)
    now[0] = 115.0
    progress(30, 50, 86_400.0 * 2)  # 4.5 s after the last line: nothing
    err = capsys.readouterr().err.splitlines()
    assert err == ["gpufed simulate: gpufed: 20/50 jobs arrived, simulated day 1.5, 10s"]


def test_simulate_reports_every_arrival_to_its_progress_callback() -> None:
    jobs = [TraceJob(str(i), float(i), 8, 60.0, 8, "Preferred") for i in range(5)]
    seen: list[tuple[int, int]] = []
    simulate(load_fleet(FLEET), jobs, progress=lambda a, t, _now: seen.append((a, t)))
    assert seen[-1] == (5, 5)
    assert [a for a, _ in seen] == sorted(a for a, _ in seen)


@pytest.mark.parametrize(
    ("peer", "line"),
    [
        (None, "hub: not started (--clusters-only)"),
        ("multikueue", "hub: not started (--peer multikueue runs the peer instead of gpufed)"),
    ],
)
def test_the_summary_says_why_the_hub_is_not_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], peer: str | None, line: str
) -> None:
    info = SandboxInfo(
        state_dir=tmp_path,
        kubeconfig=tmp_path / "kubeconfig",
        etcd_url="http://127.0.0.1:2379",
        bin_dir=tmp_path / "bin",
        fleet_file=FLEET,
        clusters={},
        token="t",
        ca_file=tmp_path / "ca.crt",
    )
    local.print_summary(info, [], peer=peer)
    out = capsys.readouterr().out
    assert line in out
