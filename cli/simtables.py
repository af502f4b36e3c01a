"""``gpufed simulate`` without ``--json``: its rich tables.

The run table (one column per policy, one row per metric) and the mean wait by job size
(``--per-size``), the class tables (``--per-class``; the figures are
:func:`gpufed.placement.sim.simclasses.class_report`'s) and, with ``--seeds``, each policy
against the yardstick seed by seed (:func:`gpufed.placement.sim.simseeds.paired`'s figures).
Called by ``cli/simulate.py`` only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gpufed.placement.sim.simclasses import class_report
from gpufed.placement.sim.simreport import size_buckets, wait_by_size
from gpufed.placement.sim.simulate import SimResult

_COLUMNS = (
    ("jobs", "jobs"),
    ("started", "started"),
    ("wait_mean_s", "wait mean s"),
    ("wait_p95_s", "wait p95 s"),
    ("completion_mean_s", "completion mean s"),
    ("gpu_hours", "GPU-hours"),
)


def print_classes(results: Sequence[SimResult]) -> None:
    """Per policy: the size and topology tables, each pool's GPU-hours by class, the counts."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for r in results:
        report = class_report(r.records)
        for kind in ("by_size", "by_topology"):
            table = Table(title=f"{r.policy}: {kind.replace('_', ' ')}", title_justify="left")
            table.add_column("class")
            for _, label in _COLUMNS:
                table.add_column(label, justify="right")
            for name, row in report[kind].items():
                table.add_row(name, *(_whole(row[k]) for k, _ in _COLUMNS))
            console.print(table)
        pools = Table(title=f"{r.policy}: pool GPU-hours by class", title_justify="left")
        pools.add_column("pool")
        pools.add_column("GPU-hours", justify="right")
        pools.add_column("share by size")
        pools.add_column("share by topology")
        for pool, row in report["pools"].items():
            pools.add_row(
                pool, _whole(row["gpu_hours"]), _shares(row["by_size"]), _shares(row["by_topology"])
            )
        console.print(pools)
        if r.idle is not None:
            idle = Table(
                title=f"{r.policy}: idle GPU time by reason (arrival window)", title_justify="left"
            )
            idle.add_column("reason")
            idle.add_column("share of fleet", justify="right")
            idle.add_column("GPU-hours", justify="right")
            idle.add_column("by pool (GPU-hours)")
            for why, row in r.idle.items():
                by_pool = " ".join(f"{p}:{h:,.0f}" for p, h in row["pools"].items() if h >= 0.5)
                idle.add_row(why, f"{row['share']:.2%}", _whole(row["gpu_hours"]), by_pool)
            console.print(idle)
        console.print(
            f"{r.policy}: time-limited jobs {report['time_limited']:,}, stopped at their limit "
            f"{report['time_limit_stops']:,}, backfilled {report['backfilled']:,} "
            f"(of them stopped at their limit {report['backfill_limit_hits']:,})"
        )


def _shares(shares: dict[str, float]) -> str:
    return " ".join(f"{k}:{v:.0%}" for k, v in shares.items())


def _whole(value: Any) -> str:
    return f"{value:,.0f}" if isinstance(value, float) else f"{value:,}"


def print_results(results: list[SimResult], per_size: bool) -> None:
    """The run table (one column per policy, one row per metric), each policy's per-queue and
    per-priority objects, and with ``per_size`` the mean wait by job size."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    rows = [r.as_json() for r in results]
    # one column per policy (a few), one row per metric (many): fits an 80-column terminal
    flat = [k for k, v in rows[0].items() if not isinstance(v, dict) and k != "policy"]
    table = Table(title="gpufed simulate", title_justify="left")
    table.add_column("")
    for row in rows:
        table.add_column(str(row["policy"]), justify="right")
    for key in flat:
        table.add_row(key, *(_cell(row.get(key)) for row in rows))
    console.print(table)
    for row in rows:
        for key, value in row.items():
            if isinstance(value, dict):
                for name, sub in value.items():
                    label = ("queue " if key == "queues" else f"{key} ") + name
                    console.print(f"{row['policy']}: {label}: {json.dumps(sub)}", soft_wrap=True)
    if per_size:
        sizes = sorted({b for r in results for b in size_buckets(r.records)})
        by_size = Table(title="mean wait by job size (s; started jobs)", title_justify="left")
        by_size.add_column("policy")
        for b in sizes:
            by_size.add_column("1 GPU" if b == 1 else str(b), justify="right")
        for r in results:
            means = wait_by_size(r.records)
            by_size.add_row(
                r.policy, *(f"{means[b][1]:,.0f}" if b in means else "-" for b in sizes)
            )
        console.print(by_size)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4f}".rstrip("0").rstrip(".") if abs(value) < 10 else f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def print_paired(summary: dict[str, Any]) -> None:
    """``--seeds``' last table, one per policy: each figure seed by seed, then the median
    (the least and greatest are in the JSON line; the table stays within 80 columns for
    five seeds)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for name, figures in summary["policies"].items():
        table = Table(
            title=f"{name} against {summary['against']}, seed by seed", title_justify="left"
        )
        table.add_column("")
        for seed in summary["seeds"]:
            table.add_column(f"seed {seed}", justify="right")
        table.add_column("median", justify="right")
        rows = [("mean wait (x)", figures["wait_mean_ratio"], "{:.3f}")]
        rows.append(("utilisation diff", figures["gpu_utilization_diff"], "{:+.4f}"))
        for size, spread in figures["wait_mean_ratio_by_size"].items():
            rows.append((f"{size} GPU{'' if size == '1' else 's'} (x)", spread, "{:.2f}"))
        for label, spread, fmt in rows:
            if spread is None:
                table.add_row(label, *["-"] * (len(summary["seeds"]) + 1))
                continue
            table.add_row(
                label,
                *(fmt.format(v) for v in spread["per_seed"]),
                fmt.format(spread["median"]),
            )
        console.print(table)
