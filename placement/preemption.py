"""Preemption's vocabulary and rules of eligibility (pure): running jobs, preemptors, plans,
the cost of a victim and the guard rails.

Called by :mod:`.victims` (the search: :func:`~gpufed.placement.victims.plan_preemption`),
:mod:`.preemptcycle` (several preemptors in one pass), the simulator and, later, the hub's
scheduling cycle; docs/placement.md, "Preemption". No I/O, no clock, no randomness.

* :class:`Running`: a running job as a possible victim; :class:`Preemptor`: the waiting job;
* :class:`PreemptionPlan` / :class:`NoPreemption`: the answer;
* :func:`work_lost_gpu_s`: the cost of one victim, GPUs x seconds since its last checkpoint;
* :func:`preemptible`, :class:`PreemptionRules`: the guard rails (minimum runtime, a cap per
  hour, no cycles) and the bounds of the search.

**Who may be a victim** (docs/placement.md, "Who may preempt whom, when"; the rule is
:meth:`~gpufed.placement.victims.Search.victim`). Without queues, a running job of strictly
lower priority. With queues, the preemptor's queue's ``spec.preemption`` decides: in its own
queue by priority (``withinQueue``); in another queue only while that queue, and each ancestor
below the common one, uses more than its nominal of the GPU product (priority never overrides
nominal), under ``reclaimWithinParent`` when the preemptor's queue stays within its nominal
with the job, else ``borrowWithinParent``; a victim set never takes a queue further below its
nominal than its last victim (no ping-pong). In every case only if :func:`preemptible` allows
it now and it did not preempt the preemptor less than ``cooldown_s`` ago.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufed.api.decision import Decision
from gpufed.api.request import PlacementRequest
from gpufed.placement.quota import QueueTree, QuotaUsage

HOUR_S = 3600.0


class PreemptionRules(BaseModel):
    """Guard rails and search bounds (seconds, counts).

    ``min_runtime_s``: a job runs at least this long before it may be preempted (default 0).
    ``max_per_hour``: a job already preempted this many times in the last hour is not
    preempted again. ``cooldown_s``: a job preempted less than this long ago may not preempt
    the job that preempted it (no cycles). ``reclaim``: a queue within its nominal may preempt
    other queues' borrowing jobs (with queues: each queue's ``spec.preemption`` then decides;
    False turns cross-queue reclaim off everywhere). ``max_blocks``: blocks (NVLink
    domains, racks, blocks, members) searched per decision, the cheapest by estimate over the
    whole fleet; ``max_whatifs``: what-if
    placements per decision.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_runtime_s: float = Field(default=0.0, ge=0)
    max_per_hour: int = Field(default=3, ge=1)
    cooldown_s: float = Field(default=600.0, ge=0)
    reclaim: bool = True
    max_blocks: int = Field(default=8, ge=1)
    max_whatifs: int = Field(default=64, ge=1)


@dataclass(frozen=True)
class PreemptionEvent:
    """One past preemption of a job: when (seconds, same clock as ``now``) and by which job."""

    at: float
    by: str


@dataclass(frozen=True, eq=False)
class Running:
    """A running (or placed) job as a possible victim.

    ``gpus``: node -> GPUs the job holds there (its Decision / Reservation). ``started_at``,
    ``last_checkpoint`` (the ``gpufed.io/last-checkpoint`` annotation, None when not
    reported), ``preemptible_after``: seconds on the ``now`` clock. ``checkpoint_interval_s``:
    ``spec.checkpoint.intervalSeconds`` (None when not declared). ``queue``: its GPUQueue
    (None: the default queue). ``preempted``: its past preemptions (the hourly cap).
    """

    uid: str
    cluster: str
    priority: int
    gpus: Mapping[str, int]
    started_at: float
    queue: str | None = None
    last_checkpoint: float | None = None
    checkpoint_interval_s: float | None = None
    preemptible_after: float = 0.0
    preempted: tuple[PreemptionEvent, ...] = ()
    job: str = ""
    submitted_at: float | None = None

    @property
    def gpu_count(self) -> int:
        """GPUs held in all."""
        return sum(self.gpus.values())


@dataclass(frozen=True)
class Preemptor:
    """The waiting job that may preempt: its request, whether its PriorityClass lets it
    (``preemptionPolicy: PreemptLowerPriority``; ``Never`` -> False) and its own past
    preemptions (no cycles)."""

    request: PlacementRequest
    may_preempt: bool = True
    preempted: tuple[PreemptionEvent, ...] = ()


@dataclass(frozen=True)
class QuotaView:
    """The queue tree and the quota ledger, for reclaim and for admission after the victims
    are gone (:mod:`.quota`). The ledger is read, never changed."""

    tree: QueueTree
    usage: QuotaUsage


@dataclass(frozen=True)
class Victim:
    """One chosen victim: the job, its cost (GPU-seconds of work lost) and why it may go
    (``priority``: lower priority; ``reclaim``: its queue borrows from the preemptor's)."""

    running: Running
    cost_gpu_s: float
    why: Literal["priority", "reclaim"]


@dataclass(frozen=True)
class PreemptionPlan:
    """What to preempt for one job: stop ``victims`` in ``cluster``, which frees ``nodes``, and
    the job is placed as ``decision`` says (its NVLink ``domains``). ``cost_gpu_s``: the work
    lost, GPU-seconds. ``reason``: one line for events and ``gpufed explain``. ``whatifs``:
    what-if placements this decision ran. ``search``: how the victims were found, ``exact
    search`` (the cheapest set of the blocks tried) or ``bounded search (why)``
    (:mod:`.victimsets`)."""

    preemptor: str
    cluster: str
    victims: tuple[Victim, ...]
    nodes: frozenset[str]
    domains: tuple[str, ...]
    decision: Decision
    cost_gpu_s: float
    reason: str
    whatifs: int
    search: str = "exact search"

    @property
    def victim_uids(self) -> tuple[str, ...]:
        """The victims' UIDs, in plan order."""
        return tuple(v.running.uid for v in self.victims)


@dataclass(frozen=True)
class NoPreemption:
    """Why nothing is preempted: one line, and per member where one was searched."""

    preemptor: str
    reason: str
    members: Mapping[str, str] = field(default_factory=dict)
    whatifs: int = 0


def work_lost_gpu_s(run: Running, now: float) -> float:
    """GPUs x seconds since ``run``'s last checkpoint: the reported one (not before its start,
    since a restart resumes from it), else ``(now - start) mod interval``, else since start."""
    since = max(0.0, now - run.started_at)
    if run.last_checkpoint is not None:
        since = max(0.0, now - max(run.last_checkpoint, run.started_at))
    elif run.checkpoint_interval_s:
        since = since % run.checkpoint_interval_s
    return run.gpu_count * since


def cost_anchor(run: Running) -> float:
    """When :func:`work_lost_gpu_s` starts counting ``run``'s work lost, in seconds on the
    ``now`` clock, when that cost is ``gpu_count x max(0, now - anchor)`` (its reported
    checkpoint, not before its start; else its start); ``inf`` when it is not (a checkpoint
    interval and no reported checkpoint: the cost is then only known to be at least 0). A
    victim's cost is at least ``gpus x max(0, now - anchor)`` for any ``gpus`` at most its GPUs
    and ``anchor`` at least this (the cost floor of :func:`~.victimblocks.block_floor`)."""
    if run.last_checkpoint is not None:
        return max(run.last_checkpoint, run.started_at)
    if run.checkpoint_interval_s:
        return math.inf
    return run.started_at


def preemptible(run: Running, rules: PreemptionRules, now: float) -> str | None:
    """Why ``run`` may not be preempted now by anyone (None: it may): its minimum runtime,
    its ``preemptible_after``, or the hourly cap."""
    if now - run.started_at < rules.min_runtime_s:
        return f"ran {now - run.started_at:.0f} s of its minimum {rules.min_runtime_s:.0f} s"
    if now < run.preemptible_after:
        return f"not preemptible before {run.preemptible_after:.0f}"
    recent = sum(1 for e in run.preempted if now - e.at < HOUR_S)
    if recent >= rules.max_per_hour:
        return f"preempted {recent} times in the last hour (cap {rules.max_per_hour})"
    return None
