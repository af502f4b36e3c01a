"""The simulator's idle GPU time by reason (``--per-class``, :mod:`gpufed.placement.sim.simidle`).

Hand-worked scenarios give every reason's GPU-seconds; the identity tests check, for every
policy on random small traces (and with node failures), that the idle shares and the
utilisation (computed from the job records, not by the meter) add up to the whole fleet.
"""

from __future__ import annotations

import random

import pytest
from test_simulate import hgx_fleet

from gpufed.api.fleet import FleetSpec
from gpufed.placement.sim.simfail import SimFailures
from gpufed.placement.sim.simidle import IDLE_REASONS
from gpufed.placement.sim.simstate import SimResult
from gpufed.placement.sim.simulate import TraceJob, fleet_members, simulate


@pytest.mark.parametrize(("pod_gpus", "why"), [(8, "fragment"), (4, "kept-off")])
def test_first_admit_waiting_gpus_then_nothing_waiting(pod_gpus: int, why: str) -> None:
    # 0 s: A (4 GPUs) starts, B (8) cannot: the 4 free GPUs idle until A ends at 100 s, as
    # fragment when B is one 8-GPU pod, as kept off when B is two 4-GPU pods that must share
    # the node's NVLink domain (one fits by size, the gang does not); B runs 100-150 s; then
    # nothing waits until C arrives at 200 s (the window's end)
    jobs = [
        TraceJob("a", 0.0, 4, 100.0, 4, "Required"),
        TraceJob("b", 0.0, 8, 50.0, pod_gpus, "Required"),
        TraceJob("c", 200.0, 1, 10.0, 1, "Required"),
    ]
    r = simulate(fleet_members(hgx_fleet(m=1)), jobs, "first-admit", idle=True)
    assert r.idle is not None
    assert list(r.idle) == list(IDLE_REASONS)
    assert {k: row["share"] for k, row in r.idle.items()} == {
        "no-job-waiting": 0.25,  # 8 GPUs x 50 s of 8 x 200
        "held": 0.0,
        "fragment": 0.25 if why == "fragment" else 0.0,  # 4 GPUs x 100 s
        "kept-off": 0.25 if why == "kept-off" else 0.0,
        "down": 0.0,
    }
    assert r.idle[why]["gpu_hours"] == 0.1  # 400 GPU-seconds, rounded
    assert r.idle[why]["pools"] == {"m/NVIDIA-H100-80GB-HBM3": 0.1}
    assert r.gpu_utilization == 0.5


def test_gpufed_counts_the_free_gpus_of_a_held_node_as_held() -> None:
    # A (4 GPUs, 10,000 s) runs from 0, alone until B (8) arrives at 1,000 s: nothing waits,
    # then B's pod does not fit (fragment) until 3,000 s, when C (1 GPU, 10 s) arrives and B,
    # past the 1,800 s starvation bound, holds the node: 3 GPUs held while C runs, then 4 until
    # D arrives at 5,000 s (the window's end)
    jobs = [
        TraceJob("a", 0.0, 4, 10_000.0, 4, "Required", time_limit_s=10_000.0),
        TraceJob("b", 1_000.0, 8, 100.0, 8, "Required"),
        TraceJob("c", 3_000.0, 1, 10.0, 1, "Required"),
        TraceJob("d", 5_000.0, 1, 10.0, 1, "Required"),
    ]
    r = simulate(fleet_members(hgx_fleet(m=1)), jobs, "gpufed", idle=True)
    assert r.idle is not None
    window = 8 * 5_000
    assert r.idle["no-job-waiting"]["share"] == 4 * 1_000 / window
    assert r.idle["fragment"]["share"] == 4 * 2_000 / window
    assert r.idle["held"]["share"] == pytest.approx((3 * 10 + 4 * 1_990) / window, abs=5e-5)
    assert r.idle["kept-off"]["share"] == 0
    assert r.gpu_utilization == pytest.approx((4 * 5_000 + 10) / window)


def test_off_by_default() -> None:
    jobs = [TraceJob("a", 0.0, 1, 10.0, 1, "Required")]
    assert simulate(fleet_members(hgx_fleet(m=1)), jobs, "gpufed").idle is None


def _jobs(seed: int) -> list[TraceJob]:
    rnd = random.Random(seed)
    out = []
    for i in range(60):
        gpus = rnd.choice([1, 1, 1, 2, 4, 8, 16])
        out.append(
            TraceJob(
                f"j{i}",
                round(rnd.uniform(0, 20_000)),
                gpus,
                float(rnd.randint(100, 9_000)),
                min(gpus, 8),
                rnd.choice(["Required", "Preferred"]),
                time_limit_s=float(rnd.choice([10_000, 30_000])) if rnd.random() < 0.7 else None,
            )
        )
    return sorted(out, key=lambda j: j.submit_s)


@pytest.mark.parametrize("policy", ["gpufed", "first-admit", "cluster-sum", "round-robin"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_idle_shares_and_utilisation_add_up_to_the_fleet(policy: str, seed: int) -> None:
    r = simulate(fleet_members(two_members()), _jobs(seed), policy, idle=True)  # type: ignore[arg-type]
    _adds_up(r)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_failed_nodes_are_down_and_still_add_up(seed: int) -> None:
    # a node fails every ~2,000 s fleet-wide and is back 3,000 s later: its GPUs are down,
    # neither busy nor idle for a reason jobs or holds explain
    fails = SimFailures(2_000.0, repair_s=3_000.0, seed=seed)
    r = simulate(fleet_members(two_members()), _jobs(seed), "gpufed", idle=True, failures=fails)
    assert fails.node_failures > 0
    assert r.idle is not None
    assert r.idle["down"]["share"] > 0
    _adds_up(r)


def _adds_up(r: SimResult) -> None:
    assert r.idle is not None
    total = sum(row["share"] for row in r.idle.values()) + r.gpu_utilization
    assert total == pytest.approx(1.0, abs=6e-4)
    for row in r.idle.values():
        assert sum(row["pools"].values()) == pytest.approx(
            row["gpu_hours"], abs=0.05 * len(row["pools"]) + 1e-6
        )


def two_members() -> FleetSpec:
    return FleetSpec.loads(
        """clusters:
  - name: a
    nodePools:
      - name: h100
        nodes: 3
        gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}
        nvlink: node
  - name: b
    nodePools:
      - name: gb200
        nodes: 4
        gpu: {product: NVIDIA-GB200, count: 4}
        nvlink: {nodesPerDomain: 2}
"""
    )
