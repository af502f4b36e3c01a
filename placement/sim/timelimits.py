"""Declared time limits of simulated jobs: the over-estimate model for traces that carry none.

Called by ``gpufed simulate`` (``cli/simulate.py``) before :func:`~.simulate.simulate`. Batch
users declare a wall-clock limit (Slurm ``--time``, a Job's ``activeDeadlineSeconds``, a
GPUJob's ``spec.placement.timeLimitSeconds``) and systematically ask for several times what
their jobs use. Public traces without a limit column (the Microsoft Philly/ITP traces among
them) get one drawn here, per job, from two published observations:

* **the f-model** (A. W. Mu'alem and D. G. Feitelson, "Utilization, Predictability, Workloads,
  and User Runtime Estimates in Scheduling the IBM SP2 with Backfilling", IEEE TPDS 12(6),
  2001, section 5): a job's estimate is drawn uniformly between its actual runtime and ``f``
  times it. ``f`` = :data:`DEFAULT_FACTOR` (5): the paper studied f = 1 .. 100; 5 keeps the
  median accuracy (runtime / estimate ~ 0.33) near the ~0.2-0.5 reported from production logs
  (D. Tsafrir, Y. Etsion, D. G. Feitelson, "Modeling User Runtime Estimates", JSSPP 2005,
  LNCS 3834, figure 1);
* **modal estimates** (Tsafrir et al. 2005, section 3): users pick round values (a few
  minutes, half an hour, whole hours, a day ...); about 20 values cover ~90% of jobs. The drawn
  estimate is rounded *up* to the next of :data:`MODAL_LIMITS_S` (beyond the last: whole days).

Drawn limits are never below the trace's runtime, so a job is stopped at its limit only when
the trace declares a tighter one (``time_limit_s`` column) or when it runs slower than its trace
runtime (an NVLink-Required job scattered over several domains, :data:`SCATTER_SLOWDOWN`).
Deterministic: each job's draw depends only on ``seed`` and its ``job_id`` (CRC-32), so every
policy and every run sees the same limits. Pure.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from gpufed.placement.sim.trace import TraceJob

#: ``f`` of the f-model (estimates uniform in [runtime, f x runtime]).
DEFAULT_FACTOR: Final = 5.0

#: Round values users choose, seconds (Tsafrir et al. 2005): 5, 10, 15, 20, 30 min; 1, 2, 3, 4,
#: 6, 8, 10, 12, 18 h; 1, 1.5, 2, 3 days. Longer estimates round up to whole days.
MODAL_LIMITS_S: Final = tuple(
    float(s)
    for s in (
        300,
        600,
        900,
        1200,
        1800,
        *(h * 3600 for h in (1, 2, 3, 4, 6, 8, 10, 12, 18, 24, 36, 48, 72)),
    )
)

#: Completion-time slowdown of an NVLink-Required job of several pods that a policy scatters
#: over several NVLink domains: its collective traffic leaves NVLink (~900 GB/s per GPU) for the
#: scale-out network (~50 GB/s per GPU with one 400 Gb/s NIC per GPU). The project's brief (issue
#: 29) cites 3-8x for communication-heavy jobs; the simulator takes the low end, 3, by default
#: (``--scatter-slowdown``), so a policy that starts such a job early in the wrong place is not
#: rewarded.
SCATTER_SLOWDOWN: Final = 3.0


@dataclass(frozen=True)
class TimeLimitModel:
    """How limits are drawn for jobs without one: ``factor`` (f of the f-model, >= 1),
    ``seed`` (int), ``modal`` (round up to :data:`MODAL_LIMITS_S`). Raises ``ValueError`` for a
    factor below 1 or not finite."""

    factor: float = DEFAULT_FACTOR
    seed: int = 0
    modal: bool = True

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor >= 1.0):
            raise ValueError(
                f"time limit factor: {self.factor!r} must be a finite number >= 1 (users ask "
                "for at least what they use; 5 is the default)"
            )

    def draw(self, job_id: str, runtime_s: float) -> float:
        """The declared limit of a job that ran ``runtime_s`` seconds: seconds, >= runtime_s
        (and >= the first modal value when ``modal``)."""
        rng = random.Random(zlib.crc32(f"{self.seed}:{job_id}".encode()))
        estimate = runtime_s * rng.uniform(1.0, self.factor)
        return round_up_modal(estimate) if self.modal else estimate


def round_up_modal(seconds: float) -> float:
    """``seconds`` rounded up to the next of :data:`MODAL_LIMITS_S`, or to whole days beyond
    the last."""
    for v in MODAL_LIMITS_S:
        if seconds <= v:
            return v
    return math.ceil(seconds / 86_400.0) * 86_400.0


def with_time_limits(jobs: Sequence[TraceJob], model: TimeLimitModel | None) -> list[TraceJob]:
    """``jobs`` with a declared limit each: the trace's own where it has one, else drawn from
    ``model`` (None: left without a limit, so no job is stopped and none may backfill)."""
    if model is None:
        return list(jobs)
    return [
        j
        if j.time_limit_s is not None
        else replace(j, time_limit_s=model.draw(j.job_id, j.duration_s))
        for j in jobs
    ]
