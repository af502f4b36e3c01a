"""Placement policy: how members are scored and how long reservations live.

The hub builds one :class:`Policy` from its configuration and passes it to every
``place()`` call; the simulator and the benchmark use the defaults. Scores are 0-100 per
scorer; the total is their weighted mean (docs/placement.md, "Scores").
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ScoreWeights(BaseModel):
    """Weights of the score plugins (non-negative; at least one positive).

    ``nvlink_fit``: NVLinkBestFit (fewest stranded GPUs in the domains used).
    ``allocation``: ResourceAllocation (``binpack`` or ``spread`` over the member's GPUs of the
    product used). ``topology``: TopologyLocality (NVLink / rack / block wishes met).
    ``topology_cost``: TopologyCost (what the placement destroys: whole nodes and trays broken,
    the pool's largest free NVLink block; :mod:`gpufed.placement.topocost`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    nvlink_fit: float = Field(default=2.0, ge=0)
    allocation: float = Field(default=1.0, ge=0)
    topology: float = Field(default=1.0, ge=0)
    topology_cost: float = Field(default=1.0, ge=0)

    @model_validator(mode="after")
    def _some_weight(self) -> ScoreWeights:
        if self.total <= 0:
            raise ValueError(
                "weights: at least one of nvlink_fit, allocation, topology, topology_cost "
                "must be > 0"
            )
        return self

    @property
    def total(self) -> float:
        """Sum of the weights (the divisor of the weighted mean)."""
        return self.nvlink_fit + self.allocation + self.topology + self.topology_cost


class Policy(BaseModel):
    """Everything about placement that is configuration rather than input.

    ``allocation``: ``binpack`` (default: prefer the member whose GPUs of the product are the
    most used, keeping emptier members whole for large jobs) or ``spread`` (prefer the emptiest
    member; for inference replicas), the default of jobs that do not choose
    (``spec.placement.allocation`` overrides it per job). ``reservation_ttl_s``: how long a reservation holds
    capacity when the job's pods never show up in the member's inventory (seconds).
    ``keep_cliques``: plan a job that has no use for an NVL72 clique in clique pools only when
    no other pool fits it (:func:`gpufed.placement.topocost.clique_tier`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "default"
    allocation: Literal["binpack", "spread"] = "binpack"
    weights: ScoreWeights = ScoreWeights()
    reservation_ttl_s: float = Field(default=600.0, gt=0)
    keep_cliques: bool = True

    def without_topology_cost(self) -> Policy:
        """This policy as placement was before issue 29: no TopologyCost, no clique tier (the
        simulator's ``first-admit`` baseline, which must not change)."""
        return self.model_copy(
            update={
                "weights": self.weights.model_copy(update={"topology_cost": 0.0}),
                "keep_cliques": False,
            }
        )
