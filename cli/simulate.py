"""``gpufed simulate``: replay a job trace against a fleet spec through ``place()``.

``--policy a,b,c`` runs each policy on the same fleet and trace, in the order given. Output:
``--json``: one JSON line per policy (``SimResult.as_json``; ``--per-size`` adds
``wait_mean_s_by_size``, ``--per-class`` the object ``classes`` of
:func:`gpufed.placement.sim.simclasses.class_report`) and nothing else; otherwise a rich table, one column per policy and
one row per metric, then the per-queue and per-priority rows of each. ``--per-size``: mean wait by job size (size
classes of :func:`gpufed.placement.sim.simreport.size_bucket`). ``--plot FILE.png``: the figures of
:mod:`gpufed.cli.simplot`. ``--jobs-out FILE.csv``: one row per policy and job
(``policy`` + :data:`gpufed.placement.sim.simreport.CSV_COLUMNS`). ``--intervals-out FILE.csv``: one
row per policy, job run and quota key (``policy`` +
:data:`gpufed.placement.sim.simreport.INTERVAL_COLUMNS`). ``--check-invariants``: recompute every
queue's usage from those intervals (:mod:`gpufed.placement.sim.siminvariants`), add
``invariant_violations`` to the output, print the first few on stderr and exit 1 when any is
found (after every output is written). Every ~10 s of wall time a progress line goes to stderr
(jobs arrived / total, simulated day), with ``--json`` too.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from gpufed.api.fleet import FleetError
from gpufed.api.queue import GPUQueue, QueueFileError, load_queues
from gpufed.cli.simclasses import print_classes
from gpufed.placement.queue import (
    DEFAULT_CARRY_HOLDS,
    DEFAULT_HOLDS_PER_SHAPE,
    DEFAULT_SIZE_AGING_S,
    DEFAULT_SPARE_WHOLE_NODES_S,
    HOLD_CHOICES,
    HOLD_NODES,
    QUEUE_ORDERS,
    BackfillRule,
)
from gpufed.placement.sim.priomix import load_mix
from gpufed.placement.sim.simclasses import class_report
from gpufed.placement.sim.simfail import SimFailures
from gpufed.placement.sim.siminvariants import check_intervals
from gpufed.placement.sim.simpreempt import VICTIM_RULES, SimPreemption
from gpufed.placement.sim.simreport import (
    CSV_COLUMNS,
    INTERVAL_COLUMNS,
    csv_rows,
    interval_rows,
    size_buckets,
    wait_by_size,
)
from gpufed.placement.sim.simulate import (
    HORIZON_AFTER_LAST_ARRIVAL_S,
    POLICIES,
    SimResult,
    TraceError,
    load_fleet,
    read_trace,
    simulate,
)
from gpufed.placement.sim.timelimits import (
    DEFAULT_FACTOR,
    SCATTER_SLOWDOWN,
    TimeLimitModel,
    with_time_limits,
)


def simulate_command(
    fleet: Path = typer.Option(..., "--fleet", help="Fleet spec YAML (docs/design.md §5)."),
    trace: Path = typer.Option(..., "--trace", help="Trace CSV (docs/design.md §6)."),
    policy: str = typer.Option(
        "gpufed",
        "--policy",
        help=f"Placement policy, or several comma-separated to compare: {', '.join(POLICIES)}.",
    ),
    horizon: float = typer.Option(
        HORIZON_AFTER_LAST_ARRIVAL_S,
        "--horizon",
        min=0,
        help="Stop this many simulated seconds after the last arrival (default: 30 days).",
    ),
    member_fit: str = typer.Option(
        "spread",
        "--member-fit",
        help="Baselines only: how pods pick nodes inside a member, spread (kube-scheduler "
        "default LeastAllocated) or pack.",
    ),
    queues: Path | None = typer.Option(
        None,
        "--queues",
        help="GPUQueue objects (YAML, one or more documents): admit by quota, order by fair "
        'share (docs/placement.md, "Queues and quotas").',
    ),
    quota_mode: str = typer.Option(
        "enforce", "--quota-mode", help="With --queues: enforce, or none (only accounted)."
    ),
    queue_column: str = typer.Option(
        "queue", "--queue-column", help="Trace column naming each job's queue."
    ),
    queue_prefix: str = typer.Option(
        "", "--queue-prefix", help="Prefix of the queue column's values (vc: 4 -> vc4)."
    ),
    half_life: float = typer.Option(
        86_400.0, "--half-life", min=1, help="Half-life of decayed usage, seconds (fair share)."
    ),
    preemption: str | None = typer.Option(
        None,
        "--preemption",
        help="on: waiting jobs preempt lower-priority (or borrowing) running jobs; off: no "
        "preemption. Either adds preemptions, gpu_hours_lost and wait_p95_s_by_priority.",
    ),
    victims: str = typer.Option(
        "gpufed",
        "--victims",
        help=f"With --preemption on: the victim rule, {' or '.join(VICTIM_RULES)} (the "
        "topology-blind baseline).",
    ),
    priority_mix: str | None = typer.Option(
        None,
        "--priority-mix",
        help="builtin, or a JSON file: set each job's priority and checkpoint interval from "
        'the trace (docs/placement.md, "Preemption").',
    ),
    failure_interval: float | None = typer.Option(
        None,
        "--node-failure-interval-s",
        help="Fleet-wide mean time between node failures, seconds (exponential, seeded): a "
        "failure takes one GPU node down and its jobs lose the work since their checkpoint. "
        "Adds node_failures, retry, goodput, restarts, failed_infra.",
    ),
    repair_s: float = typer.Option(
        3600.0, "--repair-s", help="With node failures: seconds until a failed node is back."
    ),
    retry: str = typer.Option(
        "on",
        "--retry",
        help="With node failures: on, jobs of a failed node are re-placed (up to 6 times, "
        "the GPUJob default); off, they fail.",
    ),
    checkpoint_s: float | None = typer.Option(
        None,
        "--checkpoint-s",
        help="Checkpoint interval, seconds, for trace jobs without a checkpoint_s value.",
    ),
    queue_order: str = typer.Option(
        "smallest-first",
        "--queue-order",
        help="Policy gpufed: order of jobs not yet starving, within a priority: smallest-first "
        "(fewer GPUs first; the hub's default) or fifo (earlier first: arrival order, the old "
        "default).",
    ),
    starvation_s: float = typer.Option(
        1800.0,
        "--queue-starvation",
        help="Policy gpufed: seconds a job waits without fitting before it holds nodes (the "
        "hub's flag of the same name).",
    ),
    oldest_first_s: float = typer.Option(
        57600.0,
        "--queue-oldest-first",
        help="Policy gpufed: seconds a job waits before it goes ahead of every younger job "
        "of its priority, oldest first (with smallest-first), and holds nodes whatever "
        "--queue-max-holds: its wait is bounded by this plus one drain, within a queue (with "
        "--queues, fair share orders the queues first). \\[default: 16 h (57600 s)]",
        show_default=False,
    ),
    max_holds: int = typer.Option(
        4,
        "--queue-max-holds",
        help="Policy gpufed: starving jobs that hold nodes at once, not counting jobs past "
        "--queue-oldest-first (0: no holds at all).",
    ),
    holds_per_shape: int = typer.Option(
        DEFAULT_HOLDS_PER_SHAPE,
        "--queue-holds-per-shape",
        min=1,
        help="Policy gpufed: starving jobs of one shape that may hold (different) nodes in "
        "one pass, within --queue-max-holds (1: one per shape per pass; the hub's flag of the "
        "same name and default).",
    ),
    size_aging_s: float = typer.Option(
        DEFAULT_SIZE_AGING_S,
        "--queue-size-aging",
        min=0,
        help="Policy gpufed, smallest-first: a job's size in the order is divided by 1 + "
        "waited / this (seconds; 0: sizes do not age; the hub's flag of the same name and "
        "default).",
    ),
    backfill_limits: str = typer.Option(
        "on",
        "--queue-backfill-by-limit",
        help="Policy gpufed: on, a job whose time limit ends before a starving job's expected "
        "start may run on the nodes it holds (backfill); off, nothing runs inside a hold.",
    ),
    hold_within_wait: str = typer.Option(
        "off",
        "--queue-hold-within-wait",
        help="Policy gpufed: on, a starving job (not yet past --queue-oldest-first) holds nodes "
        "only when its expected start there is at most as far ahead as it has waited.",
    ),
    hold_candidates: int = typer.Option(
        1,
        "--queue-hold-candidates",
        min=1,
        max=16,
        help="Policy gpufed: node sets a starving job weighs before it holds the one where it "
        "is expected to start first (1: the nodes with the most free GPUs).",
    ),
    hold_choice: str = typer.Option(
        "earliest-start",
        "--queue-hold-choice",
        help="Policy gpufed: of the --queue-hold-candidates node sets, a starving job holds "
        "the one where it is expected to start first (earliest-start) or the one whose GPUs "
        "stand idle least until then (least-idle).",
    ),
    start_accuracy: float = typer.Option(
        1.0,
        "--queue-start-accuracy",
        help="Policy gpufed: a hold's expected start counts each running job as ending at its "
        "start plus this fraction of its time limit (not before now), in (0, 1]; 1: at its "
        "limit. Less than 1 lends held nodes to fewer backfilled jobs.",
    ),
    hold_nodes: str = typer.Option(
        "most-free",
        "--queue-hold-nodes",
        help="Policy gpufed: how a starving job picks the nodes it holds: most-free (the most "
        "free GPUs now), earliest-drain (the nodes the running jobs' time limits free first), "
        "earliest-drain-multi (so only for jobs of several pods) or earliest-drain-multi-free "
        "(as that, and of the nodes drained by that start the most free now first).",
    ),
    oldest_first_one_pod_s: float | None = typer.Option(
        None,
        "--queue-oldest-first-one-pod",
        min=0,
        help="Policy gpufed: seconds a job of one GPU pod (8 GPUs on an HGX node or fewer) "
        "waits before it is walked oldest first and holds whatever the cap, when shorter "
        "than --queue-oldest-first (default: the same bound as every job).",
    ),
    hold_busy_nodes: str = typer.Option(
        "off",
        "--queue-hold-busy-nodes",
        help="Policy gpufed: on, a starving job of one HGX node may hold a node with no free "
        "GPU when every node of the pool is full, the first by name (earliest-drain: the one "
        "where it is expected to start first; off: it holds nothing there).",
    ),
    keep_one_node_hold: str = typer.Option(
        "off",
        "--queue-keep-one-node-hold",
        help="Policy gpufed: on, a starving job of one GPU pod holds again the nodes it held "
        "in the last pass while they can still take it (the other rules choose only for a "
        "new holder); off: every pass chooses afresh.",
    ),
    carry_holds: str = typer.Option(
        "on" if DEFAULT_CARRY_HOLDS else "off",
        "--queue-carry-holds",
        help="Policy gpufed: on, the holds of the previous pass whose holders still wait also "
        "keep off the younger jobs walked before their holder (fresh smaller ones), except "
        "those whose time limit ends before the holder's expected start.",
    ),
    spare_whole_nodes_s: float = typer.Option(
        DEFAULT_SPARE_WHOLE_NODES_S,
        "--queue-spare-whole-nodes",
        min=0,
        help="Policy gpufed: seconds a job smaller than a node is first tried only on partly "
        "used nodes and, if it finds no room there, again after the pass's other jobs: whole "
        "free nodes go first to the jobs that need them whole (0: off; the hub's flag of the "
        "same name and default).",
    ),
    spare_draining_s: float = typer.Option(
        0.0,
        "--queue-spare-draining",
        min=0,
        help="Policy gpufed, with --queue-spare-whole-nodes: seconds; the partly used nodes "
        "whose running jobs all end by their limits within this long are spared too, from "
        "the jobs that would run past that drain (0: off).",
    ),
    old_starvation_s: float | None = typer.Option(None, "--starvation-s", hidden=True),
    old_oldest_first_s: float | None = typer.Option(None, "--oldest-first-s", hidden=True),
    old_max_holds: int | None = typer.Option(None, "--max-holds", hidden=True),
    time_limit_factor: float = typer.Option(
        DEFAULT_FACTOR,
        "--time-limit-factor",
        help="Jobs without a time_limit_s in the trace get a declared limit drawn uniformly in "
        "[runtime, F x runtime], rounded up to a round value users pick (docs/placement.md, "
        '"Simulator"); 0: they get none (no job without a trace limit may backfill or is '
        "stopped).",
    ),
    scatter_slowdown: float = typer.Option(
        SCATTER_SLOWDOWN,
        "--scatter-slowdown",
        help="Run-time factor of an NVLink-Required job of several pods that a policy spreads "
        "over several NVLink domains (>= 1).",
    ),
    seed: int = typer.Option(
        0, "--seed", help="Seed of the node failures and of the drawn time limits."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines only (one per policy)."),
    per_size: bool = typer.Option(False, "--per-size", help="Mean wait by job size, per policy."),
    per_class: bool = typer.Option(
        False,
        "--per-class",
        help="Where the time goes: per job-size and topology class, wait mean / p95, "
        "completion time, GPU-hours; each pool's GPU-hours by class; time-limit stops and "
        "backfilled runs (adds the key classes).",
    ),
    plot: Path | None = typer.Option(
        None,
        "--plot",
        help="Write a PNG: wait-time CDF per policy, GPU utilisation over time, mean wait by "
        "job size.",
    ),
    jobs_out: Path | None = typer.Option(
        None,
        "--jobs-out",
        help="Write a CSV: each job's submit, start, end, member and NVLink domain per policy.",
    ),
    intervals_out: Path | None = typer.Option(
        None,
        "--intervals-out",
        help="Write a CSV: every run of every job per policy (queue, GPU product, GPUs, "
        "start, end, why it ended).",
    ),
    check_invariants: bool = typer.Option(
        False,
        "--check-invariants",
        help="Recompute every queue's usage from the run intervals and check the quota caps "
        "(lending limits at every level), member capacity and overlapping runs; adds "
        "invariant_violations, prints the first few on stderr, exits 1 when any is found.",
    ),
) -> None:
    """Replay TRACE on FLEET in simulated time until every job has finished."""
    if quota_mode not in ("enforce", "none"):
        raise typer.BadParameter("use enforce or none", param_hint="--quota-mode")
    policies = [p.strip() for p in policy.split(",") if p.strip()]
    for name in policies:
        if name not in POLICIES:
            raise typer.BadParameter(
                f"{name!r} is not one of {', '.join(POLICIES)}", param_hint="--policy"
            )
    if not policies or len(set(policies)) < len(policies):
        raise typer.BadParameter("name each policy once", param_hint="--policy")
    if member_fit not in ("spread", "pack"):
        raise typer.BadParameter("use spread or pack", param_hint="--member-fit")
    if preemption not in (None, "on", "off"):
        raise typer.BadParameter("use on or off", param_hint="--preemption")
    if victims not in VICTIM_RULES:
        raise typer.BadParameter(f"use {' or '.join(VICTIM_RULES)}", param_hint="--victims")
    if backfill_limits not in ("on", "off"):
        raise typer.BadParameter("use on or off", param_hint="--queue-backfill-by-limit")
    if hold_within_wait not in ("on", "off"):
        raise typer.BadParameter("use on or off", param_hint="--queue-hold-within-wait")
    if hold_choice not in HOLD_CHOICES:
        raise typer.BadParameter(
            f"use {' or '.join(HOLD_CHOICES)}", param_hint="--queue-hold-choice"
        )
    if hold_nodes not in HOLD_NODES:
        raise typer.BadParameter(f"use {' or '.join(HOLD_NODES)}", param_hint="--queue-hold-nodes")
    if not (0 < start_accuracy <= 1):
        raise typer.BadParameter(
            "must be a number > 0 and <= 1 (1: the time limit)", param_hint="--queue-start-accuracy"
        )
    if carry_holds not in ("on", "off"):
        raise typer.BadParameter("use on or off", param_hint="--queue-carry-holds")
    if not math.isfinite(spare_whole_nodes_s):
        raise typer.BadParameter(
            "must be a number of seconds >= 0", param_hint="--queue-spare-whole-nodes"
        )
    if hold_busy_nodes not in ("on", "off", "earliest-drain"):
        raise typer.BadParameter(
            "use on, off or earliest-drain", param_hint="--queue-hold-busy-nodes"
        )
    if keep_one_node_hold not in ("on", "off"):
        raise typer.BadParameter("use on or off", param_hint="--queue-keep-one-node-hold")
    if retry not in ("on", "off"):
        raise typer.BadParameter("use on or off", param_hint="--retry")
    if checkpoint_s is not None and not checkpoint_s > 0:
        raise typer.BadParameter("must be > 0 seconds", param_hint="--checkpoint-s")
    if queue_order not in QUEUE_ORDERS:
        raise typer.BadParameter(f"use {' or '.join(QUEUE_ORDERS)}", param_hint="--queue-order")
    # the older names (hidden) still work; a value given under either name is checked under it
    starvation_flag, oldest_flag, holds_flag = (
        "--queue-starvation",
        "--queue-oldest-first",
        "--queue-max-holds",
    )
    if old_starvation_s is not None:
        starvation_s, starvation_flag = old_starvation_s, "--starvation-s"
    if old_oldest_first_s is not None:
        oldest_first_s, oldest_flag = old_oldest_first_s, "--oldest-first-s"
    if old_max_holds is not None:
        max_holds, holds_flag = old_max_holds, "--max-holds"
    if not (starvation_s >= 0 and math.isfinite(starvation_s)):
        raise typer.BadParameter("must be a number of seconds >= 0", param_hint=starvation_flag)
    if not (oldest_first_s >= 0 and math.isfinite(oldest_first_s)):
        raise typer.BadParameter("must be a number of seconds >= 0", param_hint=oldest_flag)
    if max_holds < 0:
        raise typer.BadParameter("must be >= 0", param_hint=holds_flag)
    if not (
        time_limit_factor == 0 or (math.isfinite(time_limit_factor) and time_limit_factor >= 1)
    ):
        raise typer.BadParameter(
            "must be 0 (no drawn limits) or a number >= 1", param_hint="--time-limit-factor"
        )
    if not (math.isfinite(scatter_slowdown) and scatter_slowdown >= 1):
        raise typer.BadParameter("must be a number >= 1", param_hint="--scatter-slowdown")
    if "gpufed" not in policies and queue_order != "smallest-first":
        typer.echo(
            "gpufed simulate: warning: --queue-order applies to the gpufed policy only "
            f"(not to {', '.join(policies)})",
            err=True,
        )
    backfill = BackfillRule(
        starvation_s=starvation_s,
        max_holds=max_holds,
        oldest_first_s=oldest_first_s,
        order=queue_order,
        backfill_by_limit=backfill_limits == "on",
        holds_per_shape=holds_per_shape,
        size_aging_s=size_aging_s,
        hold_within_wait=hold_within_wait == "on",
        hold_candidates=hold_candidates,
        carry_holds=carry_holds == "on",
        spare_whole_nodes_s=spare_whole_nodes_s,
        hold_choice=hold_choice,
        start_accuracy=start_accuracy,
        hold_nodes=hold_nodes,
        oldest_first_one_pod_s=oldest_first_one_pod_s,
        hold_busy_nodes=hold_busy_nodes != "off",
        hold_busy_by_drain=hold_busy_nodes == "earliest-drain",
        hold_keep_one_node=keep_one_node_hold == "on",
        spare_draining_s=spare_draining_s,
    )
    try:
        members = load_fleet(fleet)
        jobs = read_trace(trace, queue_column=queue_column, queue_prefix=queue_prefix)
        queue_objs = load_queues(queues) if queues is not None else None
        if priority_mix is not None:
            jobs = load_mix(priority_mix).apply(jobs)
        if checkpoint_s is not None:
            jobs = [j if j.checkpoint_s else replace(j, checkpoint_s=checkpoint_s) for j in jobs]
        model = TimeLimitModel(time_limit_factor, seed) if time_limit_factor else None
        jobs = with_time_limits(jobs, model)
        failures = (
            SimFailures(failure_interval, repair_s=repair_s, retry=retry == "on", seed=seed)
            if failure_interval is not None
            else None
        )
    except (FleetError, TraceError, QueueFileError, OSError, ValueError) as exc:
        typer.echo(f"gpufed simulate: {exc}", err=True)
        raise typer.Exit(2) from None
    results: list[SimResult] = []
    violations = 0
    for name in policies:
        t0 = time.perf_counter()
        try:
            result = simulate(
                members,
                jobs,
                name,  # type: ignore[arg-type]
                horizon_s=horizon,
                member_fit=member_fit,  # type: ignore[arg-type]
                queues=queue_objs,
                quota_mode=quota_mode,  # type: ignore[arg-type]
                half_life_s=half_life,
                backfill=backfill,
                preemption=(
                    SimPreemption(on=preemption == "on", victims=victims)
                    if preemption is not None
                    else None
                ),
                failures=failures,
                scatter_slowdown=scatter_slowdown,
                progress=_Progress(name),
            )
        except ValueError as exc:
            typer.echo(f"gpufed simulate: {exc}", err=True)
            raise typer.Exit(2) from None
        result.runtime_s = time.perf_counter() - t0
        if check_invariants:
            violations += _check(result, queue_objs or ())
        results.append(result)
        if as_json:  # each line as soon as its policy is done
            typer.echo(json.dumps(_json_line(result, per_size, per_class)))
    if jobs_out is not None:
        _write_csv(
            jobs_out, "--jobs-out", CSV_COLUMNS, [(r.policy, csv_rows(r.records)) for r in results]
        )
    if intervals_out is not None:
        _write_csv(
            intervals_out,
            "--intervals-out",
            INTERVAL_COLUMNS,
            [(r.policy, interval_rows(r.intervals)) for r in results],
        )
    if plot is not None:
        from gpufed.cli.simplot import plot_results

        plot_results(results, plot, title=f"{trace.name} on {fleet.name}")
    if not as_json:
        _print_results(results, per_size)
        if per_class:
            print_classes(results)
    if violations:
        raise typer.Exit(1)


class _Progress:
    """``simulate``'s progress callback: one stderr line every ``every_s`` seconds of wall time
    (jobs arrived / total, simulated days), so a long run does not look hung. ``clock``:
    seconds, monotonic (injectable for tests)."""

    def __init__(
        self, policy: str, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.policy, self.every_s, self.clock = policy, every_s, clock
        self.started = self.last = clock()

    def __call__(self, arrived: int, total: int, now_s: float) -> None:
        t = self.clock()
        if t - self.last < self.every_s:
            return
        self.last = t
        typer.echo(
            f"gpufed simulate: {self.policy}: {arrived:,}/{total:,} jobs arrived, "
            f"simulated day {now_s / 86_400:.1f}, {t - self.started:.0f}s",
            err=True,
        )


def _json_line(result: SimResult, per_size: bool, per_class: bool = False) -> dict[str, Any]:
    line = result.as_json()
    if per_class:
        line["classes"] = class_report(result.records)
    if per_size:
        line["wait_mean_s_by_size"] = {
            str(size): round(mean, 1) for size, (_, mean) in wait_by_size(result.records).items()
        }
    return line


#: Violations printed on stderr per policy by ``--check-invariants`` (the count is all of them).
SHOWN_VIOLATIONS = 5


def _check(result: SimResult, queues: Sequence[GPUQueue]) -> int:
    """Run the invariant check on ``result``'s own intervals; set ``invariant_violations``,
    print the first few on stderr; the number found."""
    report = check_intervals(result.intervals, queues, result.capacity)
    result.check_metrics = {"invariant_violations": len(report.violations)}
    for v in report.violations[:SHOWN_VIOLATIONS]:
        typer.echo(f"gpufed simulate: {result.policy}: t={v.time_s:g}s: {v.message}", err=True)
    if len(report.violations) > SHOWN_VIOLATIONS:
        more = len(report.violations) - SHOWN_VIOLATIONS
        typer.echo(f"gpufed simulate: {result.policy}: ... and {more:,} more", err=True)
    return len(report.violations)


def _write_csv(
    path: Path, flag: str, columns: Sequence[str], rows: list[tuple[str, list[list[str]]]]
) -> None:
    """``policy`` + ``columns``, then each policy's rows prefixed with its name."""
    try:
        with path.open("w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["policy", *columns])
            for policy, body in rows:
                out.writerows([policy, *row] for row in body)
    except OSError as exc:
        typer.echo(f"gpufed simulate: {flag} {path}: {exc.strerror or exc}", err=True)
        raise typer.Exit(2) from None


def _print_results(results: list[SimResult], per_size: bool) -> None:
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
