"""The simulator's first-admit baseline (placement/sim/simfirstadmit.py): one global queue in
arrival order, best effort, each job to the first member in fleet-file order that fits it."""

from __future__ import annotations

import hashlib

import pytest
from test_simulate import ROOT, hgx_fleet, tj

from gpufed.api.fleet import FleetSpec
from gpufed.placement import Policy
from gpufed.placement.sim.simfirstadmit import run_first_admit
from gpufed.placement.sim.simstate import _drain, _Sim
from gpufed.placement.sim.simulate import fleet_members, load_fleet, read_trace, simulate


def _clusters(spec: FleetSpec, jobs: list, order: list[str] | None = None) -> dict[str, str]:  # type: ignore[type-arg]
    """job id -> the member first-admit started it in (members in ``order``, else file order)."""
    members = fleet_members(spec)
    sim = _Sim(members, jobs)
    run_first_admit(sim, _drain(sim, 1e9), Policy(), order or [m.name for m in members])
    return {r.job.job_id: r.cluster or "" for r in sim.runs}


def test_a_big_job_is_skipped_while_small_ones_behind_it_start() -> None:
    """One 8-GPU node: the 8-GPU job cannot start while 4 GPUs run; the long 4-GPU job behind
    it starts at once (no hold for the big one), which then waits for it to end."""
    members = fleet_members(hgx_fleet(a=1))
    jobs = [tj("small0", 0, 4, 100), tj("big", 1, 8, 100), tj("small1", 2, 4, 1000)]
    r = simulate(members, jobs, "first-admit")
    assert (r.placed, r.unstarted, r.stranded) == (3, 0, 0)
    # small0 and small1 wait 0 s; big starts when small1 ends, at 1002 (submitted at 1)
    assert r.wait_mean_s == pytest.approx(1001 / 3)
    # in strict arrival order (head-of-line blocking) small1 would wait for big: 99 + 198


def test_each_job_goes_to_the_first_member_in_fleet_file_order_that_fits_it() -> None:
    spec = hgx_fleet(zeta=1, alpha=2)  # in this order in the file
    jobs = [tj("1", 0, 8, 100), tj("2", 1, 4, 100), tj("3", 2, 4, 100), tj("4", 3, 4, 100)]
    # zeta is first in the file (not by name): job 1 fills it, the rest go to alpha
    assert _clusters(spec, jobs) == {"1": "zeta", "2": "alpha", "3": "alpha", "4": "alpha"}
    assert _clusters(spec, jobs, ["alpha", "zeta"])["1"] == "alpha"


def test_a_job_no_member_could_ever_hold_is_never_started() -> None:
    members = fleet_members(hgx_fleet(a=1))
    jobs = [tj("ok", 0, 8, 10), tj("never", 1, 16, 10, gpus_per_pod=16), tj("next", 2, 8, 10)]
    r = simulate(members, jobs, "first-admit")
    assert (r.placed, r.unstarted) == (2, 1)


def test_the_yardstick_does_not_move() -> None:
    """Issue 29: first-admit is the yardstick every scheduling goal is measured against, "do
    not change what it does". It shares ``place()`` and the planner with gpufed, so a change
    to them can move it silently (a best-fit-node rule for one-pod jobs in clique pools,
    tried in stop 44, took its loaded-fleet mean from 4,000.6 s to 4,962.3 s). Pinned here:
    its first 3,000 jobs of the loaded week, each job's start, member and NVLink domains. If
    this fails on purpose, the baseline changed: rerun its rows in docs/benchmarks.md and
    say so there before updating the pin."""
    members = load_fleet(ROOT / "manifests" / "fleets" / "sim-itp-loaded.yaml")
    jobs = read_trace(ROOT / "manifests" / "traces" / "msft-itp-week-nvl.csv")[:3000]
    r = simulate(members, jobs, "first-admit")
    rows = ";".join(f"{x.start_s},{x.member},{'/'.join(x.nvlink_domains)}" for x in r.records)
    assert (r.placed, round(r.wait_mean_s, 4), round(r.gpu_utilization, 6)) == (
        3000,
        91.7533,
        0.738437,
    )
    assert hashlib.sha256(rows.encode()).hexdigest()[:16] == "362f62f2fe5611de"
