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
found (after every output is written). ``--seeds 0-4``: every policy on each seed, then each
against first-admit seed by seed (:mod:`gpufed.placement.sim.simseeds`). Every ~10 s of wall time a progress line goes to stderr
(jobs arrived / total, simulated day), with ``--json`` too. The simulated hub's rule flags
(preemption, retries, time limits, the ``--queue-*`` flags) are declared, checked and mapped
to a :class:`~gpufed.placement.queue.BackfillRule` in :mod:`gpufed.cli.simflags`.
"""

from __future__ import annotations

import csv
import functools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer

from gpufed.api.fleet import FleetError
from gpufed.api.queue import GPUQueue, QueueFileError, load_queues
from gpufed.cli import simflags
from gpufed.cli.simtables import print_classes, print_paired, print_results
from gpufed.placement.sim.priomix import load_mix
from gpufed.placement.sim.simclasses import class_report
from gpufed.placement.sim.simfail import SimFailures
from gpufed.placement.sim.siminvariants import check_intervals
from gpufed.placement.sim.simpreempt import SimPreemption
from gpufed.placement.sim.simreport import (
    CSV_COLUMNS,
    INTERVAL_COLUMNS,
    csv_rows,
    interval_rows,
    wait_by_size,
)
from gpufed.placement.sim.simseeds import paired, parse_seeds, yardstick_of
from gpufed.placement.sim.simulate import (
    HORIZON_AFTER_LAST_ARRIVAL_S,
    POLICIES,
    SimResult,
    TraceError,
    TraceJob,
    load_fleet,
    read_trace,
    simulate,
)
from gpufed.placement.sim.timelimits import (
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
    preemption: str | None = simflags.PREEMPTION,
    victims: str = simflags.VICTIMS,
    priority_mix: str | None = simflags.PRIORITY_MIX,
    failure_interval: float | None = simflags.NODE_FAILURE_INTERVAL_S,
    repair_s: float = simflags.REPAIR_S,
    retry: str = simflags.RETRY,
    checkpoint_s: float | None = simflags.CHECKPOINT_S,
    queue_order: str = simflags.QUEUE_ORDER,
    starvation_s: float = simflags.QUEUE_STARVATION,
    oldest_first_s: float = simflags.QUEUE_OLDEST_FIRST,
    max_holds: int = simflags.QUEUE_MAX_HOLDS,
    holds_per_shape: int = simflags.QUEUE_HOLDS_PER_SHAPE,
    size_aging_s: float = simflags.QUEUE_SIZE_AGING,
    backfill_limits: str = simflags.QUEUE_BACKFILL_BY_LIMIT,
    hold_within_wait: str = simflags.QUEUE_HOLD_WITHIN_WAIT,
    hold_candidates: int = simflags.QUEUE_HOLD_CANDIDATES,
    hold_choice: str = simflags.QUEUE_HOLD_CHOICE,
    start_accuracy: float = simflags.QUEUE_START_ACCURACY,
    hold_nodes: str = simflags.QUEUE_HOLD_NODES,
    oldest_first_one_pod_s: float | None = simflags.QUEUE_OLDEST_FIRST_ONE_POD,
    hold_busy_nodes: str = simflags.QUEUE_HOLD_BUSY_NODES,
    keep_one_node_hold: str = simflags.QUEUE_KEEP_ONE_NODE_HOLD,
    carry_holds: str = simflags.QUEUE_CARRY_HOLDS,
    spare_whole_nodes_s: float = simflags.QUEUE_SPARE_WHOLE_NODES,
    spare_draining_s: float = simflags.QUEUE_SPARE_DRAINING,
    old_starvation_s: float | None = simflags.STARVATION_S,
    old_oldest_first_s: float | None = simflags.OLDEST_FIRST_S,
    old_max_holds: int | None = simflags.MAX_HOLDS,
    time_limit_factor: float = simflags.TIME_LIMIT_FACTOR,
    scatter_slowdown: float = simflags.SCATTER_SLOWDOWN,
    seed: int = typer.Option(
        0, "--seed", help="Seed of the node failures and of the drawn time limits."
    ),
    seeds: str | None = typer.Option(
        None,
        "--seeds",
        help="Run every policy on each of these seeds (0-4, or 0,1,2) instead of --seed, and "
        "end with each policy against first-admit (or the last policy named), seed by seed, "
        "with the medians: one seed does not separate two rules on the big size classes.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines only (one per policy)."),
    per_size: bool = typer.Option(False, "--per-size", help="Mean wait by job size, per policy."),
    per_class: bool = typer.Option(
        False,
        "--per-class",
        help="Where the time goes: per job-size and topology class, wait mean / p95, "
        "completion time, GPU-hours; each pool's GPU-hours by class; idle GPU time by reason "
        "(no job waiting, held, fragment, kept off, down) and pool; time-limit stops and backfilled "
        "runs (adds the key classes).",
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
    backfill = simflags.backfill_rule(
        policies,
        preemption=preemption,
        victims=victims,
        retry=retry,
        checkpoint_s=checkpoint_s,
        queue_order=queue_order,
        starvation_s=starvation_s,
        oldest_first_s=oldest_first_s,
        max_holds=max_holds,
        holds_per_shape=holds_per_shape,
        size_aging_s=size_aging_s,
        backfill_limits=backfill_limits,
        hold_within_wait=hold_within_wait,
        hold_candidates=hold_candidates,
        hold_choice=hold_choice,
        start_accuracy=start_accuracy,
        hold_nodes=hold_nodes,
        oldest_first_one_pod_s=oldest_first_one_pod_s,
        hold_busy_nodes=hold_busy_nodes,
        keep_one_node_hold=keep_one_node_hold,
        carry_holds=carry_holds,
        spare_whole_nodes_s=spare_whole_nodes_s,
        spare_draining_s=spare_draining_s,
        old_starvation_s=old_starvation_s,
        old_oldest_first_s=old_oldest_first_s,
        old_max_holds=old_max_holds,
        time_limit_factor=time_limit_factor,
        scatter_slowdown=scatter_slowdown,
    )
    seed_list = _seed_list(seed, seeds, jobs_out=jobs_out, intervals_out=intervals_out, plot=plot)
    try:
        members = load_fleet(fleet)
        traced = read_trace(trace, queue_column=queue_column, queue_prefix=queue_prefix)
        queue_objs = load_queues(queues) if queues is not None else None
        if priority_mix is not None:
            traced = load_mix(priority_mix).apply(traced)
        if checkpoint_s is not None:
            traced = [
                j if j.checkpoint_s else replace(j, checkpoint_s=checkpoint_s) for j in traced
            ]
    except (FleetError, TraceError, QueueFileError, OSError, ValueError) as exc:
        typer.echo(f"gpufed simulate: {exc}", err=True)
        raise typer.Exit(2) from None
    replay = functools.partial(
        simulate,
        members,
        horizon_s=horizon,
        member_fit=member_fit,  # type: ignore[arg-type]
        queues=queue_objs,
        quota_mode=quota_mode,  # type: ignore[arg-type]
        half_life_s=half_life,
        backfill=backfill,
        preemption=(
            SimPreemption(on=preemption == "on", victims=victims)  # type: ignore[arg-type]
            if preemption is not None
            else None
        ),
        scatter_slowdown=scatter_slowdown,
        idle=per_class,
    )
    lines: list[dict[str, Any]] = []  # with --seeds: each run's line, for the paired summary
    violations = 0
    for seed in seed_list:
        jobs, failures = _seed_inputs(
            traced, seed, time_limit_factor, failure_interval, repair_s=repair_s, retry=retry
        )
        if seeds is not None and not as_json:
            typer.echo(f"seed {seed}")
        results: list[SimResult] = []
        for name in policies:
            result = _replay(replay, jobs, name, failures)
            if check_invariants:
                violations += _check(result, queue_objs or ())
            results.append(result)
            # --seeds pairs the per-size figures even when --per-size does not print them
            full = _json_line(result, per_size or seeds is not None, per_class)
            line = full if per_size else _without(full, "wait_mean_s_by_size")
            if seeds is not None:
                line = {"seed": seed, **line}
                lines.append({"seed": seed, **full})
            if as_json:  # each line as soon as its policy is done
                typer.echo(json.dumps(line))
        if jobs_out is not None:
            rows = [(r.policy, csv_rows(r.records)) for r in results]
            _write_csv(jobs_out, "--jobs-out", CSV_COLUMNS, rows)
        if intervals_out is not None:
            rows = [(r.policy, interval_rows(r.intervals)) for r in results]
            _write_csv(intervals_out, "--intervals-out", INTERVAL_COLUMNS, rows)
        if plot is not None:
            from gpufed.cli.simplot import plot_results

            plot_results(results, plot, title=f"{trace.name} on {fleet.name}")
        if not as_json:
            print_results(results, per_size)
            if per_class:
                print_classes(results)
    if seeds is not None and len(policies) > 1:
        summary = paired(lines, yardstick_of(policies))
        if as_json:
            typer.echo(json.dumps({"paired": summary}))
        else:
            print_paired(summary)
    if violations:
        raise typer.Exit(1)


def _seed_inputs(
    traced: list[TraceJob],
    seed: int,
    time_limit_factor: float,
    failure_interval: float | None,
    *,
    repair_s: float,
    retry: str,
) -> tuple[list[TraceJob], SimFailures | None]:
    """One seed's jobs (a drawn time limit for each job the trace gives none; no limits with
    ``time_limit_factor`` 0) and node failures (None without ``--node-failure-interval-s``).
    Exits 2 naming the bad value."""
    try:
        model = TimeLimitModel(time_limit_factor, seed) if time_limit_factor else None
        jobs = with_time_limits(traced, model)
        failures = (
            SimFailures(failure_interval, repair_s=repair_s, retry=retry == "on", seed=seed)
            if failure_interval is not None
            else None
        )
    except ValueError as exc:
        typer.echo(f"gpufed simulate: {exc}", err=True)
        raise typer.Exit(2) from None
    return jobs, failures


def _replay(
    replay: Callable[..., SimResult],
    jobs: list[TraceJob],
    name: str,
    failures: SimFailures | None,
) -> SimResult:
    """One policy's run of ``jobs`` (``replay``: :func:`simulate` with the command's fleet and
    rules bound), its wall time in ``runtime_s``. Exits 2 naming the bad value."""
    t0 = time.perf_counter()
    try:
        result = replay(jobs, name, failures=failures, progress=_Progress(name))
    except ValueError as exc:
        typer.echo(f"gpufed simulate: {exc}", err=True)
        raise typer.Exit(2) from None
    result.runtime_s = time.perf_counter() - t0
    return result


def _without(line: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in line.items() if k != key}


def _seed_list(seed: int, seeds: str | None, **one_run: Path | None) -> list[int]:
    """The seeds to run: ``[seed]``, or those ``--seeds`` names. Raises ``typer.BadParameter``
    for a bad ``--seeds``, for both flags given, and for an output that holds one run
    (``one_run``: ``--jobs-out``, ``--intervals-out``, ``--plot``) given with ``--seeds``."""
    if seeds is None:
        return [seed]
    if seed != 0:
        raise typer.BadParameter("give --seed or --seeds, not both", param_hint="--seeds")
    for name, value in one_run.items():
        if value is not None:
            flag = "--" + name.replace("_", "-")
            raise typer.BadParameter(
                "writes one run: give it with --seed, not --seeds", param_hint=flag
            )
    try:
        return parse_seeds(seeds)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--seeds") from None


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
        if result.idle is not None:
            line["classes"]["idle"] = result.idle
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
