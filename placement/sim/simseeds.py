"""Paired comparison over several seeds (``gpufed simulate --seeds``): each policy against a
yardstick policy, seed by seed, and the median, least and greatest of each figure.

Why: one seed does not separate two rules on the big job-size classes (docs/benchmarks.md,
"Idle GPU time by reason, now in the simulator; how much one seed tells"): a class of a few
dozen jobs moves by up to 0.25x between seeds of one rule. The seed draws each job's time
limit (:mod:`gpufed.placement.sim.timelimits`) and the node failures; every policy runs on
every seed, so a ratio pairs two runs that saw the same limits and failures.

Pure: reads the JSON lines ``gpufed simulate --json`` prints (one per policy and seed).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

#: The yardstick when it is among the policies run (issue 29's goals are against it).
YARDSTICK = "first-admit"

#: Most seeds one run takes: each runs every policy over the whole trace (minutes apiece).
MAX_SEEDS = 100


def parse_seeds(text: str) -> list[int]:
    """``"0-4"`` or ``"0,1,2"`` (or both, ``"0-2,7"``) -> the seeds in the order given.

    Raises ValueError naming the bad part, a repeated seed, an empty list or more than
    :data:`MAX_SEEDS` seeds."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = (int(lo), int(hi)) if sep else (int(part), int(part))
        except ValueError:
            raise ValueError(f"{part!r} is not a seed or a range like 0-4") from None
        if first < 0 or last < first:
            raise ValueError(f"{part!r}: seeds are >= 0 and a range goes up, like 0-4")
        if len(seeds) + last - first + 1 > MAX_SEEDS:
            raise ValueError(f"{text!r}: at most {MAX_SEEDS} seeds (each runs every policy)")
        seeds.extend(range(first, last + 1))
    if not seeds:
        raise ValueError("name at least one seed, like 0-4 or 0,1,2")
    if len(set(seeds)) < len(seeds):
        raise ValueError(f"{text!r} names a seed twice")
    return seeds


def yardstick_of(policies: Sequence[str]) -> str:
    """``first-admit`` when it is among ``policies``, else the last one named."""
    return YARDSTICK if YARDSTICK in policies else policies[-1]


def _spread(values: list[float], digits: int) -> dict[str, Any]:
    return {
        "per_seed": [round(v, digits) for v in values],
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def paired(lines: Sequence[Mapping[str, Any]], yardstick: str) -> dict[str, Any]:
    """Each policy other than ``yardstick`` against it, seed by seed.

    ``lines``: one mapping per (seed, policy) with ``seed``, ``policy``, ``wait_mean_s`` (s),
    ``gpu_utilization`` (0-1) and, when ``--per-size`` was asked, ``wait_mean_s_by_size``
    (size in GPUs as a string -> s). Returns ``{"against", "seeds", "policies": {name:
    {"wait_mean_ratio", "gpu_utilization_diff", "wait_mean_ratio_by_size": {size: ...}}}}``,
    each figure ``{"per_seed", "median", "min", "max"}`` over the seeds in the order of
    ``lines``: the policy's mean wait over the yardstick's of the same seed (x), its
    utilisation minus the yardstick's (``wait_mean_ratio`` is None when the yardstick waited
    0 s on average on some seed), and per size class the ratio of the class means (a
    class the yardstick started no job of, or waited 0 s on average, has no ratio that seed;
    a class is listed when it has one on every seed).

    Raises ValueError when a seed has no line of ``yardstick``.
    """
    seeds: list[int] = []
    by_seed: dict[int, dict[str, Mapping[str, Any]]] = {}
    for line in lines:
        seed = int(line["seed"])
        if seed not in by_seed:
            seeds.append(seed)
            by_seed[seed] = {}
        by_seed[seed][str(line["policy"])] = line
    policies: list[str] = []
    for seed in seeds:
        if yardstick not in by_seed[seed]:
            raise ValueError(f"seed {seed} has no run of the yardstick {yardstick!r}")
        policies += [p for p in by_seed[seed] if p != yardstick and p not in policies]
    out: dict[str, Any] = {"against": yardstick, "seeds": seeds, "policies": {}}
    for name in policies:
        runs = [(by_seed[s][name], by_seed[s][yardstick]) for s in seeds if name in by_seed[s]]
        ratios = [r["wait_mean_s"] / y["wait_mean_s"] for r, y in runs if y["wait_mean_s"]]
        diffs = [r["gpu_utilization"] - y["gpu_utilization"] for r, y in runs]
        by_size: dict[str, list[float]] = {}
        for r, y in runs:
            mine, theirs = r.get("wait_mean_s_by_size", {}), y.get("wait_mean_s_by_size", {})
            for size, wait in mine.items():
                if theirs.get(size):
                    by_size.setdefault(size, []).append(wait / theirs[size])
        out["policies"][name] = {
            "wait_mean_ratio": _spread(ratios, 3) if len(ratios) == len(runs) else None,
            "gpu_utilization_diff": _spread(diffs, 4),
            "wait_mean_ratio_by_size": {
                size: _spread(vals, 2)
                for size, vals in sorted(by_size.items(), key=lambda kv: int(kv[0]))
                if len(vals) == len(runs)
            },
        }
    return out
