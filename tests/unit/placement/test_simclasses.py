"""``--per-class``: waits, completion times, GPU-hours and pool shares per job class, checked
against figures worked out by hand."""

from __future__ import annotations

from placement_builders import hgx_cluster, nvl72_cluster

from gpufed.placement.sim.simclasses import class_report
from gpufed.placement.sim.simreport import JobRecord
from gpufed.placement.sim.simulate import simulate
from gpufed.placement.sim.trace import TraceJob


def rec(
    job: str, gpus: int, submit: float, start: float | None, end: float | None, **kw: object
) -> JobRecord:
    runs = ((start, end),) if start is not None and end is not None else ()
    return JobRecord(job, gpus, submit, start, end, None, (), runs, **kw)  # type: ignore[arg-type]


def test_classes_add_up_as_worked_out_by_hand() -> None:
    records = [
        rec("a", 1, 0.0, 100.0, 3700.0, pool_s=(("m/H100", 3600.0),)),
        rec("b", 1, 0.0, 300.0, 900.0, pool_s=(("m/H100", 600.0),), limit_hit=True),
        rec(
            "c",
            8,
            0.0,
            1000.0,
            4600.0,
            topology="Preferred",
            pool_s=(("n/GB200", 3600.0),),
            backfill="held for x",
        ),
        rec("d", 3, 0.0, None, None, topology="Required"),
    ]
    r = class_report(records)
    assert r["by_size"]["1"] == {
        "jobs": 2,
        "started": 2,
        "wait_mean_s": 200.0,
        "wait_p95_s": 300.0,
        "wait_max_s": 300.0,
        "completion_mean_s": 2300.0,
        "gpu_hours": round((3600 + 600) / 3600, 1),
    }
    assert r["by_size"]["4"]["started"] == 0  # 3 GPUs count with the 4s
    assert r["by_topology"]["Preferred"]["gpu_hours"] == 8.0
    assert r["pools"]["m/H100"] == {
        "gpu_hours": round(4200 / 3600, 1),
        "by_size": {"1": 1.0},
        "by_topology": {"one-pod": 1.0},
    }
    assert (r["time_limit_stops"], r["backfilled"], r["backfill_limit_hits"]) == (1, 1, 0)


def test_a_scattered_nvlink_required_job_runs_slower() -> None:
    """The GPU-blind baseline spreads a Required 2 x 4 GPU job over two NVL72 cliques that each
    have one free tray: it runs 3 x its trace time; gpufed waits for one clique instead."""
    jobs = [TraceJob("j", 0.0, 8, 1000.0, 4, "Required")]
    free = [[4] + [0] * 17, [4] + [0] * 17]
    members = [nvl72_cluster("a", cliques=2, free=free), hgx_cluster("h", nodes=1, free=[0])]
    base = simulate(members, jobs, "cluster-sum")
    [r] = base.records
    assert r.end_s is not None
    assert r.start_s is not None
    assert r.end_s - r.start_s == 3000.0
    assert len(r.nvlink_domains) == 2
