"""``gpufed simulate --plot FILE.png``: three panels comparing the policies of one run.

1. the wait-time CDF per policy (fraction of started jobs that waited at most t; t on a
   symlog axis in minutes, so the many zero waits and the long tail both show);
2. GPU utilisation over time per policy (busy GPUs / fleet GPUs, hourly means over the run);
3. mean wait by job size per policy (grouped bars, size classes of
   :func:`gpufed.placement.sim.simreport.size_bucket`, minutes on a log axis).

matplotlib is imported here only (the Agg backend: no display needed), from
:func:`gpufed.cli.simulate.simulate_command` when ``--plot`` is given. The figures come from
:mod:`gpufed.placement.sim.simreport`, the same numbers ``--per-size`` and ``--jobs-out`` print.
"""

from __future__ import annotations

from pathlib import Path

import typer

from gpufed.placement.sim.simreport import size_buckets, utilization_series, wait_by_size, waits
from gpufed.placement.sim.simulate import SimResult

__all__ = ["plot_results"]


def plot_results(results: list[SimResult], path: Path, *, title: str = "") -> None:
    """Draw the three panels (module doc) for ``results`` into the PNG ``path`` (about 1,500 x
    430 pixels at 100 dpi). Exits 2 naming the path when it cannot be written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (cdf, util, size) = plt.subplots(1, 3, figsize=(15, 4.3), dpi=100)
    for r in results:
        ws = [w / 60 for w in waits(r.records)]
        if ws:
            ys = [(i + 1) / len(ws) for i in range(len(ws))]
            cdf.step(ws, ys, where="post", label=r.policy)
        hours = max(1, int((r.extra.get("end_s", 0.0) - _t0(r)) // 3600))
        series = utilization_series(r.records, int(r.extra.get("fleet_gpus", 0)), points=hours)
        util.plot([(t - _t0(r)) / 3600 for t, _ in series], [u for _, u in series], label=r.policy)
    cdf.set_xscale("symlog", linthresh=1)
    cdf.set(xlabel="wait (minutes)", ylabel="fraction of jobs", title="Wait-time CDF")
    util.set(xlabel="hours since the first submission", ylabel="GPUs busy / fleet GPUs")
    util.set(title="GPU utilisation (hourly mean)", ylim=(0, 1.05))
    sizes = sorted({b for r in results for b in size_buckets(r.records)})
    width = 0.8 / max(len(results), 1)
    for k, r in enumerate(results):
        means = wait_by_size(r.records)
        xs = [i + k * width for i in range(len(sizes))]
        size.bar(xs, [means[b][1] / 60 if b in means else 0 for b in sizes], width, label=r.policy)
    size.set_xticks([i + width * (len(results) - 1) / 2 for i in range(len(sizes))])
    size.set_xticklabels([str(b) for b in sizes])
    size.set_yscale("symlog", linthresh=1)
    size.set(xlabel="job size (GPUs)", ylabel="mean wait (minutes)", title="Mean wait by job size")
    # fixed legend places: matplotlib's "best" scans every point of a week's curves (slow)
    for ax, where in ((cdf, "lower right"), (util, "upper right"), (size, "upper left")):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc=where)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as exc:
        typer.echo(f"gpufed simulate: --plot {path}: {exc.strerror or exc}", err=True)
        raise typer.Exit(2) from None
    finally:
        plt.close(fig)


def _t0(r: SimResult) -> float:
    return min((j.submit_s for j in r.records), default=0.0)
