"""``gpufed simulate``: replay a job trace against a fleet spec through ``place()``."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import typer

from gpufed.api.fleet import FleetError
from gpufed.api.queue import QueueFileError, load_queues
from gpufed.placement.priomix import load_mix
from gpufed.placement.simfail import SimFailures
from gpufed.placement.simpreempt import VICTIM_RULES, SimPreemption
from gpufed.placement.simulate import (
    HORIZON_AFTER_LAST_ARRIVAL_S,
    POLICIES,
    TraceError,
    load_fleet,
    read_trace,
    simulate,
)


def simulate_command(
    fleet: Path = typer.Option(..., "--fleet", help="Fleet spec YAML (docs/design.md §5)."),
    trace: Path = typer.Option(..., "--trace", help="Trace CSV (docs/design.md §6)."),
    policy: str = typer.Option(
        "gpufed", "--policy", help=f"Placement policy: {', '.join(POLICIES)}."
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
    seed: int = typer.Option(0, "--seed", help="Seed of the node failures."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines only."),
) -> None:
    """Replay TRACE on FLEET in simulated time until every job has finished."""
    if quota_mode not in ("enforce", "none"):
        raise typer.BadParameter("use enforce or none", param_hint="--quota-mode")
    if policy not in POLICIES:
        raise typer.BadParameter(
            f"{policy!r} is not one of {', '.join(POLICIES)}", param_hint="--policy"
        )
    if member_fit not in ("spread", "pack"):
        raise typer.BadParameter("use spread or pack", param_hint="--member-fit")
    if preemption not in (None, "on", "off"):
        raise typer.BadParameter("use on or off", param_hint="--preemption")
    if victims not in VICTIM_RULES:
        raise typer.BadParameter(f"use {' or '.join(VICTIM_RULES)}", param_hint="--victims")
    if retry not in ("on", "off"):
        raise typer.BadParameter("use on or off", param_hint="--retry")
    if checkpoint_s is not None and not checkpoint_s > 0:
        raise typer.BadParameter("must be > 0 seconds", param_hint="--checkpoint-s")
    try:
        members = load_fleet(fleet)
        jobs = read_trace(trace, queue_column=queue_column, queue_prefix=queue_prefix)
        queue_objs = load_queues(queues) if queues is not None else None
        if priority_mix is not None:
            jobs = load_mix(priority_mix).apply(jobs)
        if checkpoint_s is not None:
            jobs = [j if j.checkpoint_s else replace(j, checkpoint_s=checkpoint_s) for j in jobs]
        failures = (
            SimFailures(failure_interval, repair_s=repair_s, retry=retry == "on", seed=seed)
            if failure_interval is not None
            else None
        )
    except (FleetError, TraceError, QueueFileError, OSError, ValueError) as exc:
        typer.echo(f"gpufed simulate: {exc}", err=True)
        raise typer.Exit(2) from None
    t0 = time.perf_counter()
    try:
        result = simulate(
            members,
            jobs,
            policy,  # type: ignore[arg-type]
            horizon_s=horizon,
            member_fit=member_fit,  # type: ignore[arg-type]
            queues=queue_objs,
            quota_mode=quota_mode,  # type: ignore[arg-type]
            half_life_s=half_life,
            preemption=(
                SimPreemption(on=preemption == "on", victims=victims)
                if preemption is not None
                else None
            ),
            failures=failures,
        )
    except ValueError as exc:
        typer.echo(f"gpufed simulate: {exc}", err=True)
        raise typer.Exit(2) from None
    result.runtime_s = time.perf_counter() - t0
    if as_json:
        typer.echo(json.dumps(result.as_json()))
        return
    for key, value in result.as_json().items():
        if key == "queues" or key == "wait_p95_s_by_priority":
            for name, row in value.items():
                label = ("queue " if key == "queues" else "wait p95 s, priority ") + name
                typer.echo(f"{label:>30}: {json.dumps(row)}")
            continue
        typer.echo(f"{key:>30}: {value}")
