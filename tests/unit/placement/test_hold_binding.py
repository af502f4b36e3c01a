"""Which jobs a backfill hold binds: never an older job of the holder's priority, and the
``max_holds`` cap never stops a job past ``oldest_first_s`` from holding (hostile repros)."""

from __future__ import annotations

from collections.abc import Mapping

from placement_builders import A100, fleet, hgx_cluster, job, member, node

from gpufed.api.decision import Decision
from gpufed.api.request import PlacementRequest
from gpufed.placement import BackfillRule, FleetSnapshot, Hold, Policy, hold_for, place
from gpufed.placement.queue import gpu_size_of, mig_fraction, pass_key, schedule_pass

POLICY = Policy()
MIG = "nvidia.com/mig-1g.10gb"


class Loop:
    """A minimal scheduling loop over one snapshot: place, reserve on success."""

    def __init__(self, snapshot: FleetSnapshot, now: float) -> None:
        self.s = snapshot
        self.now = now

    def attempt(self, req: PlacementRequest, hold: Mapping[str, Hold]) -> Decision:
        d = place(req, self.s, POLICY, self.now, hold=hold)
        if d.placed:
            self.s.reserve(d, now=self.now, ttl_s=10**9)
        return d

    def hold_for(self, req: PlacementRequest) -> Hold | None:
        return hold_for(req, self.s, POLICY)


def _outcomes(order: str, snapshot: FleetSnapshot, queue: list[PlacementRequest], now: float):
    loop = Loop(snapshot, now)
    rule = BackfillRule(order=order)  # type: ignore[arg-type]
    res = schedule_pass(queue, now, loop.attempt, loop.hold_for, rule)
    return {r.job.removeprefix("ns/"): d.outcome.value for r, d in res.decisions}, res.holds


def test_mig_requests_are_sized_by_their_fraction_of_a_gpu() -> None:
    assert mig_fraction(MIG) == 1 / 7
    assert mig_fraction("nvidia.com/mig-3g.40gb") == 3 / 7
    assert mig_fraction("nvidia.com/mig-1g.10gb+me") == 1 / 7
    assert gpu_size_of(job("m", requests={MIG: 14})) == 2.0
    assert gpu_size_of(job("c", gpus=0, requests={"cpu": 1000})) == 0.0
    assert gpu_size_of(job("g", gpus=2, pods=3)) == 6.0
    now = 10_000.0
    mig = job("mig", requests={MIG: 14}, submitted_at=now - 100)  # 2 GPUs' worth of slices
    one = job("one", gpus=1, submitted_at=now - 50)
    three = job("three", gpus=3, submitted_at=now - 10)
    assert [j.job for j in sorted([three, mig, one], key=pass_key(now))] == [
        "ns/one",
        "ns/mig",
        "ns/three",
    ]


def _mixed(name: str):  # 6 whole GPUs free, 14 MIG slices of which 1 in use
    return node(
        name, gpus=6, product=A100, mig_strategy="mixed", extra_alloc={MIG: 14}, extra_req={MIG: 1}
    )


def test_a_starving_mig_job_does_not_freeze_older_gpu_jobs() -> None:
    # the MIG job (all 14 slices of one node, none free) waits 1 h; three 1-GPU jobs wait 2 h
    # and fit now. Before the fix smallest-first sized the MIG job as 0 GPUs, walked it first,
    # and its hold (the whole member) left the older jobs Unschedulable; fifo placed them.
    now = 10_000.0
    for order in ("smallest-first", "fifo"):
        snap = fleet(member("a", [_mixed("a-n0"), _mixed("a-n1")]))
        hog = job("hog", requests={MIG: 14}, submitted_at=now - 3600)
        older = [
            job(f"gpu{i}", gpus=1, products=(A100,), submitted_at=now - 7200 + i) for i in range(3)
        ]
        got, holds = _outcomes(order, snap, [hog, *older], now)
        assert got == {"hog": "Unschedulable", "gpu0": "Placed", "gpu1": "Placed", "gpu2": "Placed"}
        assert "a" in holds, order


def test_a_younger_cpu_only_job_holds_only_against_younger_jobs() -> None:
    # a CPU-only job (0 GPUs: first under smallest-first) that needs a whole node's CPU waits
    # 1 h and holds its whole member; 1-GPU jobs waiting 2 h are older and still placed, a
    # 1-GPU job younger than it is held off
    now = 10_000.0
    for order in ("smallest-first", "fifo"):
        snap = fleet(hgx_cluster("a", 2, free=[4, 4]))
        hog = job(
            "hog", gpus=0, requests={"cpu": 136_000, "memory": 2**30}, submitted_at=now - 3600
        )
        older = [job(f"gpu{i}", gpus=1, submitted_at=now - 7200 + i) for i in range(3)]
        young = job("young", gpus=1, submitted_at=now - 60)
        got, holds = _outcomes(order, snap, [hog, *older, young], now)
        assert got == {
            "hog": "Unschedulable",
            "gpu0": "Placed",
            "gpu1": "Placed",
            "gpu2": "Placed",
            "young": "Unschedulable",
        }, order
        assert holds["a"].nodes == frozenset(), order  # the whole member


def _capped_fleet(now: float, rule: BackfillRule) -> dict[str, Hold]:
    # member b: one A100 node, full; five jobs of distinct shapes (each asks for its own
    # hold) starve on it. Member a: four H100 nodes with 4 GPUs free each; a 32-GPU job
    # submitted later waits for it.
    snap = fleet(
        hgx_cluster("a", 4, free=[4, 4, 4, 4]), hgx_cluster("b", 1, free=[0], product=A100)
    )
    shapes = [(8, 1), (4, 2), (2, 4), (1, 8), (2, 3)]
    hogs = [
        job(f"hog{i}", gpus=g, pods=p, products=(A100,), submitted_at=10.0 + i)
        for i, (g, p) in enumerate(shapes)
    ]
    victim = job("victim", gpus=8, pods=4, submitted_at=600.0)
    loop = Loop(snap, now)
    res = schedule_pass([*hogs, victim], now, loop.attempt, loop.hold_for, rule)
    assert not res.placed
    return res.holds


def test_a_job_past_oldest_first_holds_whatever_the_cap() -> None:
    # all six jobs have waited past oldest_first_s (16 h); the five older ones fill max_holds
    # (4) with holds on b; before the fix the 32-GPU job on a never held and waited ~90 h
    now = 600.0 + 57_600 + 1
    holds = _capped_fleet(now, BackfillRule())
    assert set(holds) == {"a", "b"}
    assert "victim" in holds["a"].reason
    # before oldest_first_s the cap still applies to everyone: b's first four hold, a nothing
    fresh = BackfillRule(oldest_first_s=10**7)
    assert set(_capped_fleet(now, fresh)) == {"b"}
    # max_holds=0 still turns holds off, even past oldest_first_s
    assert _capped_fleet(now, BackfillRule(max_holds=0)) == {}
