"""Queue order and the backfill rule of the scheduling loop (pure).

The hub's scheduling loop (and the simulator) call :func:`schedule_pass` whenever the fleet
changes or jobs arrive: it walks the waiting jobs in :func:`order_key` order and asks the
caller's ``attempt`` callback to place each one (the callback runs ``place()`` and, on
``Placed``, reserves at once, so later jobs in the same pass see the capacity as taken).

Order: higher ``priority`` first, then earlier ``submitted_at``, then job name and UID.

Backfill rule (docs/placement.md, "Queue and backfill"):

* a job that does not fit does not block the jobs behind it: smaller jobs that fit are placed
  around it (no head-of-line blocking), so it never blocks them forever;
* but once a job has waited ``starvation_s`` (default 30 min) without fitting, it *holds* the
  member nearest to fitting it (``nearest`` callback: most free GPUs among members that could
  ever hold it): jobs after it in the order may no longer be placed on that member, so running
  work there drains until the starving job fits, however many small jobs keep arriving. A
  higher-priority job is ahead in the order and therefore also holds before lower ones.
  At most ``max_holds`` members are held at once, oldest starving jobs first.

Within one pass the fleet only loses capacity, so a job whose constraints and pod sets equal
those of a job that already failed in the pass is answered from that failure without calling
``place()`` again (:func:`fit_key`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpufed.api.decision import Decision, Outcome
from gpufed.api.request import PlacementRequest


class BackfillRule(BaseModel):
    """Parameters of the backfill rule (seconds, counts)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    starvation_s: float = Field(default=1800.0, ge=0)
    max_holds: int = Field(default=4, ge=0)


def order_key(request: PlacementRequest) -> tuple[int, float, str, str]:
    """Sort key of the queue: priority (high first), submit time, job name, UID."""
    return (-request.priority, request.submitted_at, request.job, request.uid)


def fit_key(request: PlacementRequest) -> Any:
    """Everything about a request that ``place()`` reads, except its identity and order."""
    sel = request.cluster_selector
    return (
        request.gpu_products,
        None if sel is None else (tuple(sorted(sel.match_labels.items())), sel.match_expressions),
        request.topology,
        request.workload_kind,
        tuple(
            (
                ps.count,
                tuple(sorted(ps.requests.items())),
                tuple(sorted(ps.node_selector.items())),
                ps.tolerations,
            )
            for ps in request.pod_sets
        ),
    )


@dataclass
class PassResult:
    """What one pass decided: every attempted job's decision, and the members held."""

    decisions: list[tuple[PlacementRequest, Decision]] = field(default_factory=list)
    holds: dict[str, str] = field(default_factory=dict)

    @property
    def placed(self) -> list[tuple[PlacementRequest, Decision]]:
        """The decisions that placed their job."""
        return [(r, d) for r, d in self.decisions if d.outcome == Outcome.PLACED]


def schedule_pass(
    queue: Iterable[PlacementRequest],
    now: float,
    attempt: Callable[[PlacementRequest, Mapping[str, str]], Decision],
    nearest: Callable[[PlacementRequest], str | None],
    rule: BackfillRule | None = None,
) -> PassResult:
    """Walk ``queue`` in order, placing what fits and applying the backfill rule.

    ``attempt(request, hold)`` places one job with the members in ``hold`` (member -> why) left
    out, and reserves on success. ``nearest(request)`` names the member a starving job should
    hold (or None). ``now``: the same clock as ``submitted_at``.
    """
    rule = rule or BackfillRule()
    out = PassResult()
    failed: dict[Any, tuple[int, Decision]] = {}
    for req in sorted(queue, key=order_key):
        key = fit_key(req)
        prev = failed.get(key)
        if prev is not None and prev[0] == len(out.holds):
            d = prev[1].model_copy(update={"job": req.job, "uid": req.uid, "decided_at": now})
        else:
            d = attempt(req, out.holds)
            if d.outcome == Outcome.UNSCHEDULABLE:
                failed[key] = (len(out.holds), d)
        out.decisions.append((req, d))
        if (
            d.outcome == Outcome.UNSCHEDULABLE
            and now - req.submitted_at >= rule.starvation_s
            and len(out.holds) < rule.max_holds
        ):
            target = nearest(req)
            if target is not None and target not in out.holds:
                out.holds[target] = (
                    f"held for {req.job} (priority {req.priority}, waiting "
                    f"{now - req.submitted_at:.0f} s) by the backfill rule"
                )
    return out
