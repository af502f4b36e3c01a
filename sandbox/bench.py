"""Sandbox benchmark: bring-up time, resident memory and idle CPU for a fleet, as JSON.

    python -m gpufed.sandbox.bench --fleet manifests/fleets/example.yaml --runs 3

Each run starts a fresh sandbox in a temporary state dir, records ``up`` seconds, lets it
settle, sums the RSS of every component, measures CPU over an idle window, and stops it.
Prints one JSON object with every run and the medians. Figures feed docs/sandbox.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog

from gpufed.api.fleet import FleetSpec
from gpufed.sandbox.runtime import Sandbox


def run_once(fleet: Path, settle_s: float, idle_s: float) -> dict[str, Any]:
    """One bring-up/measure/teardown cycle."""
    with tempfile.TemporaryDirectory(prefix="gpufed-bench-") as tmp:
        sb = Sandbox(Path(tmp) / "state")
        t0 = time.monotonic()
        sb.up(fleet)
        up_s = time.monotonic() - t0
        try:
            time.sleep(settle_s)
            st = sb.status(with_nodes=False)
            cpu0 = sum(c.cpu_seconds for c in st.components)
            time.sleep(idle_s)
            cpu1 = sum(c.cpu_seconds for c in sb.status(with_nodes=False).components)
        finally:
            sb.down()
    return {
        "up_seconds": round(up_s, 1),
        "rss_mib": round(st.rss_bytes / 2**20),
        "rss_mib_by_component": {c.name: round(c.rss_bytes / 2**20) for c in st.components},
        "idle_cpu_cores": round((cpu1 - cpu0) / idle_s, 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleet", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--settle", type=float, default=15.0, help="seconds before measuring RSS")
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of idle CPU measurement")
    args = ap.parse_args(argv)
    # Progress logs would mix with the JSON on stdout.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    spec = FleetSpec.load(args.fleet)
    runs = [run_once(args.fleet, args.settle, args.idle) for _ in range(args.runs)]
    out = {
        "fleet": str(args.fleet),
        "clusters": 1 + len(spec.clusters),
        "nodes": sum(c.node_count for c in spec.clusters),
        "runs": runs,
        "median": {
            k: statistics.median(r[k] for r in runs)
            for k in ("up_seconds", "rss_mib", "idle_cpu_cores")
        },
    }
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
