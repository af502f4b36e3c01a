"""``gpufed simulate``'s rule flags: how the simulated hub preempts, retries, stops jobs at
their time limits, and orders, holds and backfills its queue (the ``--queue-*`` flags, policy
gpufed): each flag declared once here (named after it: ``--queue-hold-nodes`` is
:data:`QUEUE_HOLD_NODES`), checked, and mapped to the
:class:`~gpufed.placement.queue.BackfillRule` the simulator runs (:func:`backfill_rule`).

Used by :mod:`gpufed.cli.simulate` only: its command lists these flags in its signature (the
order ``--help`` shows them in) with the declarations below as their defaults, and calls
:func:`backfill_rule` once its own flags are checked. A new rule flag is a declaration here, a
parameter of :func:`backfill_rule` (its check, its field of the rule), and a line each in the
command's signature and call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import typer

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
from gpufed.placement.sim.simpreempt import VICTIM_RULES
from gpufed.placement.sim.timelimits import DEFAULT_FACTOR
from gpufed.placement.sim.timelimits import SCATTER_SLOWDOWN as DEFAULT_SCATTER_SLOWDOWN

PREEMPTION = typer.Option(
    None,
    "--preemption",
    help="on: waiting jobs preempt lower-priority (or borrowing) running jobs; off: no "
    "preemption. Either adds preemptions, gpu_hours_lost and wait_p95_s_by_priority.",
)
VICTIMS = typer.Option(
    "gpufed",
    "--victims",
    help=f"With --preemption on: the victim rule, {' or '.join(VICTIM_RULES)} (the "
    "topology-blind baseline).",
)
PRIORITY_MIX = typer.Option(
    None,
    "--priority-mix",
    help="builtin, or a JSON file: set each job's priority and checkpoint interval from "
    'the trace (docs/placement.md, "Preemption").',
)
NODE_FAILURE_INTERVAL_S = typer.Option(
    None,
    "--node-failure-interval-s",
    help="Fleet-wide mean time between node failures, seconds (exponential, seeded): a "
    "failure takes one GPU node down and its jobs lose the work since their checkpoint. "
    "Adds node_failures, retry, goodput, restarts, failed_infra.",
)
REPAIR_S = typer.Option(
    3600.0, "--repair-s", help="With node failures: seconds until a failed node is back."
)
RETRY = typer.Option(
    "on",
    "--retry",
    help="With node failures: on, jobs of a failed node are re-placed (up to 6 times, "
    "the GPUJob default); off, they fail.",
)
CHECKPOINT_S = typer.Option(
    None,
    "--checkpoint-s",
    help="Checkpoint interval, seconds, for trace jobs without a checkpoint_s value.",
)
QUEUE_ORDER = typer.Option(
    "smallest-first",
    "--queue-order",
    help="Policy gpufed: order of jobs not yet starving, within a priority: smallest-first "
    "(fewer GPUs first; the hub's default) or fifo (earlier first: arrival order, the old "
    "default).",
)
QUEUE_STARVATION = typer.Option(
    1800.0,
    "--queue-starvation",
    help="Policy gpufed: seconds a job waits without fitting before it holds nodes (the "
    "hub's flag of the same name).",
)
QUEUE_OLDEST_FIRST = typer.Option(
    57600.0,
    "--queue-oldest-first",
    help="Policy gpufed: seconds a job waits before it goes ahead of every younger job "
    "of its priority, oldest first (with smallest-first), and holds nodes whatever "
    "--queue-max-holds: its wait is bounded by this plus one drain, within a queue (with "
    "--queues, fair share orders the queues first). \\[default: 16 h (57600 s)]",
    show_default=False,
)
QUEUE_MAX_HOLDS = typer.Option(
    4,
    "--queue-max-holds",
    help="Policy gpufed: starving jobs that hold nodes at once, not counting jobs past "
    "--queue-oldest-first (0: no holds at all).",
)
QUEUE_HOLDS_PER_SHAPE = typer.Option(
    DEFAULT_HOLDS_PER_SHAPE,
    "--queue-holds-per-shape",
    min=1,
    help="Policy gpufed: starving jobs of one shape that may hold (different) nodes in "
    "one pass, within --queue-max-holds (1: one per shape per pass; the hub's flag of the "
    "same name and default).",
)
QUEUE_SIZE_AGING = typer.Option(
    DEFAULT_SIZE_AGING_S,
    "--queue-size-aging",
    min=0,
    help="Policy gpufed, smallest-first: a job's size in the order is divided by 1 + "
    "waited / this (seconds; 0: sizes do not age; the hub's flag of the same name and "
    "default).",
)
QUEUE_BACKFILL_BY_LIMIT = typer.Option(
    "on",
    "--queue-backfill-by-limit",
    help="Policy gpufed: on, a job whose time limit ends before a starving job's expected "
    "start may run on the nodes it holds (backfill); off, nothing runs inside a hold.",
)
QUEUE_HOLD_WITHIN_WAIT = typer.Option(
    "off",
    "--queue-hold-within-wait",
    help="Policy gpufed: on, a starving job (not yet past --queue-oldest-first) holds nodes "
    "only when its expected start there is at most as far ahead as it has waited.",
)
QUEUE_HOLD_CANDIDATES = typer.Option(
    1,
    "--queue-hold-candidates",
    min=1,
    max=16,
    help="Policy gpufed: node sets a starving job weighs before it holds the one where it "
    "is expected to start first (1: the nodes with the most free GPUs).",
)
QUEUE_HOLD_CHOICE = typer.Option(
    "earliest-start",
    "--queue-hold-choice",
    help="Policy gpufed: of the --queue-hold-candidates node sets, a starving job holds "
    "the one where it is expected to start first (earliest-start) or the one whose GPUs "
    "stand idle least until then (least-idle).",
)
QUEUE_START_ACCURACY = typer.Option(
    1.0,
    "--queue-start-accuracy",
    help="Policy gpufed: a hold's expected start counts each running job as ending at its "
    "start plus this fraction of its time limit (not before now), in (0, 1]; 1: at its "
    "limit. Less than 1 lends held nodes to fewer backfilled jobs.",
)
QUEUE_HOLD_NODES = typer.Option(
    "most-free",
    "--queue-hold-nodes",
    help="Policy gpufed: how a starving job picks the nodes it holds: most-free (the most "
    "free GPUs now), earliest-drain (the nodes the running jobs' time limits free first), "
    "earliest-drain-multi (so only for jobs of several pods) or earliest-drain-multi-free "
    "(as that, and of the nodes drained by that start the most free now first).",
)
QUEUE_OLDEST_FIRST_ONE_POD = typer.Option(
    None,
    "--queue-oldest-first-one-pod",
    min=0,
    help="Policy gpufed: seconds a job of one GPU pod (8 GPUs on an HGX node or fewer) "
    "waits before it is walked oldest first and holds whatever the cap, when shorter "
    "than --queue-oldest-first (default: the same bound as every job).",
)
QUEUE_HOLD_BUSY_NODES = typer.Option(
    "off",
    "--queue-hold-busy-nodes",
    help="Policy gpufed: on, a starving job of one HGX node may hold a node with no free "
    "GPU when every node of the pool is full, the first by name (earliest-drain: the one "
    "where it is expected to start first; off: it holds nothing there).",
)
QUEUE_KEEP_ONE_NODE_HOLD = typer.Option(
    "off",
    "--queue-keep-one-node-hold",
    help="Policy gpufed: on, a starving job of one GPU pod holds again the nodes it held "
    "in the last pass while they can still take it (the other rules choose only for a "
    "new holder); off: every pass chooses afresh.",
)
QUEUE_CARRY_HOLDS = typer.Option(
    "on" if DEFAULT_CARRY_HOLDS else "off",
    "--queue-carry-holds",
    help="Policy gpufed: on, the holds of the previous pass whose holders still wait also "
    "keep off the younger jobs walked before their holder (fresh smaller ones), except "
    "those whose time limit ends before the holder's expected start.",
)
QUEUE_SPARE_WHOLE_NODES = typer.Option(
    DEFAULT_SPARE_WHOLE_NODES_S,
    "--queue-spare-whole-nodes",
    min=0,
    help="Policy gpufed: seconds a job smaller than a node is first tried only on partly "
    "used nodes and, if it finds no room there, again after the pass's other jobs: whole "
    "free nodes go first to the jobs that need them whole (0: off; the hub's flag of the "
    "same name and default).",
)
QUEUE_SPARE_DRAINING = typer.Option(
    0.0,
    "--queue-spare-draining",
    min=0,
    help="Policy gpufed, with --queue-spare-whole-nodes: seconds; the partly used nodes "
    "whose running jobs all end by their limits within this long are spared too, from "
    "the jobs that would run past that drain (0: off).",
)
STARVATION_S = typer.Option(None, "--starvation-s", hidden=True)
OLDEST_FIRST_S = typer.Option(None, "--oldest-first-s", hidden=True)
MAX_HOLDS = typer.Option(None, "--max-holds", hidden=True)
TIME_LIMIT_FACTOR = typer.Option(
    DEFAULT_FACTOR,
    "--time-limit-factor",
    help="Jobs without a time_limit_s in the trace get a declared limit drawn uniformly in "
    "[runtime, F x runtime], rounded up to a round value users pick (docs/placement.md, "
    '"Simulator"); 0: they get none (no job without a trace limit may backfill or is '
    "stopped).",
)
SCATTER_SLOWDOWN = typer.Option(
    DEFAULT_SCATTER_SLOWDOWN,
    "--scatter-slowdown",
    help="Run-time factor of an NVLink-Required job of several pods that a policy spreads "
    "over several NVLink domains (>= 1).",
)


def backfill_rule(
    policies: Sequence[str],
    *,
    preemption: str | None,
    victims: str,
    retry: str,
    checkpoint_s: float | None,
    queue_order: str,
    starvation_s: float,
    oldest_first_s: float,
    max_holds: int,
    holds_per_shape: int,
    size_aging_s: float,
    backfill_limits: str,
    hold_within_wait: str,
    hold_candidates: int,
    hold_choice: str,
    start_accuracy: float,
    hold_nodes: str,
    oldest_first_one_pod_s: float | None,
    hold_busy_nodes: str,
    keep_one_node_hold: str,
    carry_holds: str,
    spare_whole_nodes_s: float,
    spare_draining_s: float,
    old_starvation_s: float | None,
    old_oldest_first_s: float | None,
    old_max_holds: int | None,
    time_limit_factor: float,
    scatter_slowdown: float,
) -> BackfillRule:
    """Check every rule flag (``typer.BadParameter`` naming the first bad one, in the order
    below), warn on stderr when ``--queue-order`` is not smallest-first and ``policies`` (the
    ``--policy`` names) lack gpufed, and return the :class:`BackfillRule` the ``--queue-*``
    flags make. The hidden older names (``--starvation-s``, ``--oldest-first-s``,
    ``--max-holds``) win over the newer ones when given, and a bad value is named under the
    name it was given."""
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
    return BackfillRule(
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
