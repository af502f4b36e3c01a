"""Priority mixes for traces without priorities (``gpufed simulate --priority-mix``): pure.

Called by the simulator's CLI. The ITP trace has no priority and no checkpoint columns, so a
preemption run needs both; a mix assigns them deterministically from the trace itself:

* **priority**: a job's class is chosen by a SHA-256 hash of its ``job_id`` (the fraction
  ``int(sha256(id)[:8], 16) / 2**32`` against the classes' cumulative ``share``), so the mix is
  the same on every run and machine, and independent of job size, arrival time and tenant:
  high-priority work is then neither systematically small nor large, and the comparison with and
  without preemption is not biased by size;
* **checkpoint interval**: jobs that run at least ``checkpoint_min_duration_s`` checkpoint
  every ``checkpoint_s`` seconds; shorter ones do not checkpoint (they lose everything since
  their start when preempted).

The built-in mix (:data:`BUILTIN`): 10% ``production`` at 1000, 30% ``batch`` at 500, 60%
``development`` at 100 (the ends of the range GPU platforms use, development at 100 as in
the issue; production is a minority, or preemption would have nothing to preempt); jobs of
30 minutes or more checkpoint every 30 minutes (a common trainer default, e.g. hourly or
half-hourly checkpoints of large-model training). A mix file (JSON) has the same fields as
:class:`PriorityMix`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gpufed.placement.sim.trace import TraceJob


class PriorityClassShare(BaseModel):
    """One class of the mix: its priority and its share of the jobs (0-1)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = ""
    priority: int
    share: float = Field(gt=0, le=1)


class PriorityMix(BaseModel):
    """A priority mix (module docstring): classes whose shares sum to 1, and the checkpoint
    rule (seconds)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    classes: tuple[PriorityClassShare, ...] = Field(min_length=1)
    checkpoint_s: float | None = Field(default=1800.0, gt=0)
    checkpoint_min_duration_s: float = Field(default=1800.0, ge=0)

    @model_validator(mode="after")
    def _shares(self) -> PriorityMix:
        total = sum(c.share for c in self.classes)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"classes: shares sum to {total:g}; they must sum to 1")
        return self

    def priority_of(self, job_id: str) -> int:
        """The priority the hash of ``job_id`` picks."""
        x = int(hashlib.sha256(job_id.encode()).hexdigest()[:8], 16) / 2**32
        acc = 0.0
        for c in self.classes:
            acc += c.share
            if x < acc:
                return c.priority
        return self.classes[-1].priority

    def apply(self, jobs: list[TraceJob]) -> list[TraceJob]:
        """``jobs`` with priority and ``checkpoint_s`` set by the mix (copies)."""
        out = []
        for j in jobs:
            ckpt = (
                self.checkpoint_s
                if self.checkpoint_s is not None and j.duration_s >= self.checkpoint_min_duration_s
                else None
            )
            out.append(
                dataclasses.replace(j, priority=self.priority_of(j.job_id), checkpoint_s=ckpt)
            )
        return out


BUILTIN = PriorityMix(
    classes=(
        PriorityClassShare(name="production", priority=1000, share=0.1),
        PriorityClassShare(name="batch", priority=500, share=0.3),
        PriorityClassShare(name="development", priority=100, share=0.6),
    )
)


def load_mix(spec: str) -> PriorityMix:
    """``builtin``, or a JSON file of a :class:`PriorityMix`; ``ValueError`` naming the file and
    the field otherwise."""
    if spec == "builtin":
        return BUILTIN
    try:
        text = Path(spec).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"--priority-mix {spec}: cannot read: {exc.strerror or exc}") from None
    try:
        return PriorityMix.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(file)"
        raise ValueError(f"--priority-mix {spec}: {where}: {first['msg']}") from None
