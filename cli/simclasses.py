"""``gpufed simulate --per-class`` without ``--json``: the class tables as rich tables.

Called by ``cli/simulate.py`` only; the figures are
:func:`gpufed.placement.sim.simclasses.class_report`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpufed.placement.sim.simclasses import class_report
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
                table.add_row(name, *(_cell(row[k]) for k, _ in _COLUMNS))
            console.print(table)
        pools = Table(title=f"{r.policy}: pool GPU-hours by class", title_justify="left")
        pools.add_column("pool")
        pools.add_column("GPU-hours", justify="right")
        pools.add_column("share by size")
        pools.add_column("share by topology")
        for pool, row in report["pools"].items():
            pools.add_row(
                pool, _cell(row["gpu_hours"]), _shares(row["by_size"]), _shares(row["by_topology"])
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
                idle.add_row(why, f"{row['share']:.2%}", _cell(row["gpu_hours"]), by_pool)
            console.print(idle)
        console.print(
            f"{r.policy}: time-limited jobs {report['time_limited']:,}, stopped at their limit "
            f"{report['time_limit_stops']:,}, backfilled {report['backfilled']:,} "
            f"(of them stopped at their limit {report['backfill_limit_hits']:,})"
        )


def _shares(shares: dict[str, float]) -> str:
    return " ".join(f"{k}:{v:.0%}" for k, v in shares.items())


def _cell(value: Any) -> str:
    return f"{value:,.0f}" if isinstance(value, float) else f"{value:,}"
