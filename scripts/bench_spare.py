#!/usr/bin/env python3
"""CPU cost of the backfill rule's whole-free-node read (``placement.holds.whole_free_nodes``),
called once per scheduling pass when ``--queue-spare-whole-nodes`` is on, on the fleet of
``gpufed bench placement`` (``placement/sim/synthetic.py``: HGX and GB200 NVL72 members, 50-80 %
of GPUs in use).

Usage::

    nice -n 19 .venv/bin/python scripts/bench_spare.py [--members 100] [--nodes 5000]
        [--changes 10 --passes 20] [--mixed]

``--mixed``: every member has an HGX pool and a GB200 NVL72 pool (half its nodes each), as
``gpufed bench scale``'s members do, so a member's whole free nodes span two pools (the
synthetic fleet's members have one pool each).

Prints one JSON line (milliseconds of process CPU time, medians over ``--passes`` passes):
``cold_ms``: the first call on the fleet (every pool read); ``idle_ms``: a pass with nothing
changed since the last; ``churn_ms``: a pass after ``--changes`` random nodes changed their
requested GPUs (what a pass sees under pod churn); each ``*_ms`` is the call plus the answers
for jobs of 1, 4 and 8 GPUs in one pod and 8 GPUs x 2 pods (what a pass asks).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpufed.api.inventory import MemberClusterState, NodeInventory  # noqa: E402
from gpufed.api.labels import GPU_RESOURCE  # noqa: E402
from gpufed.api.request import PlacementRequest, PodSet  # noqa: E402
from gpufed.placement import FleetSnapshot  # noqa: E402
from gpufed.placement.holds import whole_free_nodes  # noqa: E402
from gpufed.placement.sim.synthetic import synthetic_fleet  # noqa: E402

#: (GPUs per pod, pods) of the jobs whose answers a pass asks for
SHAPES = ((1, 1), (4, 1), (8, 1), (8, 2))


def _request(gpus: int, pods: int) -> PlacementRequest:
    return PlacementRequest(
        job=f"bench/j{gpus}x{pods}",
        uid=f"j{gpus}x{pods}",
        pod_sets=(PodSet(name="w", count=pods, requests={GPU_RESOURCE: gpus}),),
    )


def _pass(snapshot: FleetSnapshot, requests: list[PlacementRequest]) -> tuple[float, int]:
    """CPU seconds of one pass's call and answers; nodes held for the first job (a check)."""
    t0 = time.process_time()
    spare = whole_free_nodes(snapshot)
    held = [spare(r) for r in requests]
    spent = time.process_time() - t0
    return spent, sum(len(h.nodes) for h in held[0].values())


def _churn(
    snapshot: FleetSnapshot, nodes: list[tuple[str, NodeInventory]], k: int, rng: random.Random
) -> None:
    """``k`` random nodes report other requested GPUs (the same shape: updated in place)."""
    for _ in range(k):
        cluster, inv = nodes[rng.randrange(len(nodes))]
        gpus = inv.allocatable.get(GPU_RESOURCE, 0)
        used = rng.randint(0, gpus)
        snapshot.upsert_node(
            cluster, inv.model_copy(update={"requested": {**inv.requested, GPU_RESOURCE: used}})
        )


def _mixed(members: int, nodes: int, seed: int) -> list[MemberClusterState]:
    """``members`` members of ``nodes`` nodes, each the HGX nodes of one synthetic member and
    the NVL72 nodes of another (half each; the NVL72 members are reused in turn)."""
    fleet, _ = synthetic_fleet(members * 2, max(1, nodes // 2), seed)
    kind = "gpufed.io/kind"
    hgx = [m for m in fleet if m.labels.get(kind) == "hgx"]
    nvl = [m for m in fleet if m.labels.get(kind) == "nvl72"]
    out = []
    for i in range(members):
        h, n = hgx[i % len(hgx)], nvl[i % len(nvl)]
        name = f"mixed-{i:03d}"
        inv = h.inventory.model_copy(
            update={"cluster": name, "nodes": h.inventory.nodes + n.inventory.nodes}
        )
        out.append(h.model_copy(update={"name": name, "inventory": inv}))
    return out


def bench(
    members: int, nodes: int, changes: int, passes: int, seed: int, mixed: bool = False
) -> dict[str, Any]:
    t0 = time.monotonic()
    if mixed:
        fleet = _mixed(members, nodes, seed)
    else:
        fleet, _ = synthetic_fleet(members, nodes, seed)
    snapshot = FleetSnapshot(fleet)
    every = [(m.name, inv) for m in fleet for inv in m.inventory.nodes]
    del fleet
    build_s = time.monotonic() - t0
    requests = [_request(g, p) for g, p in SHAPES]
    rng = random.Random(seed)
    cold, held = _pass(snapshot, requests)
    idle = [_pass(snapshot, requests)[0] for _ in range(passes)]
    churn = []
    for _ in range(passes):
        _churn(snapshot, every, changes, rng)
        churn.append(_pass(snapshot, requests)[0])
    return {
        "members": members,
        "nodes_per_member": nodes,
        "nodes": len(every),
        "mixed": mixed,
        "whole_free_nodes_kept_for_1_gpu": held,
        "cold_ms": round(cold * 1e3, 2),
        "idle_ms": round(statistics.median(idle) * 1e3, 3),
        "churn_ms": round(statistics.median(churn) * 1e3, 3),
        "changes_per_pass": changes,
        "passes": passes,
        "build_s": round(build_s, 1),
        "clock": "process_time, median of passes",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=5000, help="nodes per member")
    parser.add_argument("--changes", type=int, default=10, help="nodes changed between passes")
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--mixed", action="store_true", help="an HGX and an NVL72 pool in every member"
    )
    args = parser.parse_args()
    for name in ("members", "nodes", "passes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: {getattr(args, name)}; use at least 1")
    if args.changes < 0:
        parser.error(f"--changes: {args.changes}; use 0 or more")
    print(
        json.dumps(
            bench(args.members, args.nodes, args.changes, args.passes, args.seed, args.mixed)
        )
    )


if __name__ == "__main__":
    main()
