"""The answer of placement for one job, and the reservation the hub records for it.

:class:`Decision` is what ``gpufed.placement.place`` returns; the hub writes it into
``GPUJob.status.placement`` and ``gpufed explain`` renders it
(``gpufed.placement.render_explanation``). :class:`Reservation` is one entry of the
reservation ledger: the resources a placed job holds on each node until the member reports its
pods as bound; the hub persists it in etcd (``Reservation.model_dump_json`` /
``Reservation.model_validate_json``) and reloads it after a restart.

Resource amounts are canonical integers (:mod:`gpufed.api.resources`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufed.api.resources import ResourceList


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Outcome(StrEnum):
    """How placement answered.

    ``Placed``: a member cluster (and nodes) was chosen. ``Unschedulable``: the job fits the
    fleet's shape but not its free capacity now; it waits for the fleet to change.
    ``Rejected``: no member of the fleet could ever hold it (for example 16 GPUs in one pod
    when the largest node has 8, or no member serves its GPU product); it is not queued.
    """

    PLACED = "Placed"
    UNSCHEDULABLE = "Unschedulable"
    REJECTED = "Rejected"


RejectionCode = Literal["Unschedulable", "UnschedulableAndUnresolvable", "Error"]


class PodSetAssignment(_Frozen):
    """Where the pods of one pod set go inside the chosen member.

    ``requests``: per-pod effective request (canonical units), copied from the pod set so the
    reservation can be derived from the decision alone. ``nodes``: node name -> number of pods
    of this pod set to pin to that node (``spec.nodeName`` / node affinity on the member).
    """

    name: str
    requests: dict[str, int] = Field(default_factory=dict)
    nodes: dict[str, int] = Field(default_factory=dict)


class ClusterRejection(_Frozen):
    """Why one member cannot take the job: the plugin that said no, its code and reason.

    ``code``: ``Unschedulable`` (may change as jobs finish or health returns),
    ``UnschedulableAndUnresolvable`` (only a change of the member's configuration or shape would
    help: GPU product, labels, taints, node size) or ``Error`` (broken input).
    """

    cluster: str
    plugin: str
    code: RejectionCode
    reason: str


class ClusterScore(_Frozen):
    """The score of one member that could take the job: total (0-100) and each scorer's part."""

    cluster: str
    score: float
    gpu_product: str | None = None
    parts: dict[str, float] = Field(default_factory=dict)


class Decision(_Frozen):
    """One placement decision (``GPUJob.status.placement``).

    ``cluster``/``gpu_product``/``nvlink_domains``/``pod_sets``/``score``/``score_parts`` are
    set when ``outcome`` is ``Placed``. ``nvlink_domains``: ids of the NVLink domains the pods
    use (``node:<name>`` for an HGX node, ``clique:<nvidia.com/gpu.clique>`` for a multi-node
    domain). ``score_parts``: the winner's score per scorer (0-100). ``cluster_scores``: member
    -> total score for the members that could take the job (all of them when ``explained``;
    otherwise those evaluated before the winner was certain); ``scores``: the same with each
    scorer's part, best first, only when ``explained``. ``rejections``:
    for every member that cannot take the job, the plugin and reason; filled when the job did
    not fit or when an explanation was asked for (``explained``). ``decided_at``: the ``now``
    given to placement (seconds since the epoch, or simulated seconds). ``compute_domain``: the
    job gets a ComputeDomain in ``cluster``, named after the job (its GPU pods span several
    nodes of one clique of a member serving the CRD: :mod:`gpufed.placement.computedomain`).
    """

    job: str
    uid: str
    outcome: Outcome
    cluster: str | None = None
    gpu_product: str | None = None
    nvlink_domains: tuple[str, ...] = ()
    pod_sets: tuple[PodSetAssignment, ...] = ()
    score: float | None = None
    score_parts: dict[str, float] = Field(default_factory=dict)
    cluster_scores: dict[str, float] = Field(default_factory=dict)
    scores: tuple[ClusterScore, ...] = ()
    rejections: tuple[ClusterRejection, ...] = ()
    message: str = ""
    explained: bool = False
    policy: str = "default"
    decided_at: float = 0.0
    compute_domain: bool = False

    @model_validator(mode="after")
    def _placed_has_target(self) -> Decision:
        if self.outcome == Outcome.PLACED and (self.cluster is None or not self.pod_sets):
            raise ValueError("a Placed decision needs cluster and pod_sets")
        return self

    @property
    def placed(self) -> bool:
        """True when the job was given a member cluster."""
        return self.outcome == Outcome.PLACED

    def node_requests(self) -> dict[str, ResourceList]:
        """Resources the decision puts on each node: node -> resource -> amount."""
        out: dict[str, ResourceList] = {}
        for ps in self.pod_sets:
            for node, pods in ps.nodes.items():
                acc = out.setdefault(node, {})
                for res, amount in ps.requests.items():
                    if amount:
                        acc[res] = acc.get(res, 0) + amount * pods
        return out


class Reservation(_Frozen):
    """One reservation-ledger entry: what a dispatched job holds until its pods are bound.

    ``nodes``: node name -> resource -> amount promised on that node. ``created_at``: seconds
    (the ``now`` of the reservation); the entry expires at ``created_at + ttl_s`` if the job's
    pods never show up in the member's inventory. ``compute_domain``: the job gets a
    ComputeDomain (placement keeps other ComputeDomain jobs out of the cliques of ``nodes``
    until the member labels them). Plain data, so the hub can store it in etcd as JSON and
    reload it.
    """

    job_uid: str = Field(min_length=1)
    job: str = ""
    cluster: str = Field(min_length=1)
    nodes: dict[str, dict[str, int]]
    created_at: float
    ttl_s: float = Field(gt=0)
    compute_domain: bool = False

    @property
    def expires_at(self) -> float:
        """``created_at + ttl_s`` (same clock as ``created_at``)."""
        return self.created_at + self.ttl_s

    def totals(self) -> ResourceList:
        """Resource -> amount summed over every node of the entry."""
        out: ResourceList = {}
        for res in self.nodes.values():
            for name, amount in res.items():
                out[name] = out.get(name, 0) + amount
        return out

    @classmethod
    def from_decision(cls, decision: Decision, *, now: float, ttl_s: float) -> Reservation:
        """The entry for a ``Placed`` decision: the one place a reservation is built.

        ``now``: seconds (the entry's ``created_at``); ``ttl_s`` > 0. Raises ``ValueError`` for
        another outcome or a ``ttl_s`` <= 0. The decision came from ``place()``, so its fields
        are valid already and are not validated again (this runs once per placement).
        """
        if decision.outcome != Outcome.PLACED or decision.cluster is None:
            raise ValueError(
                f"decision for {decision.job or decision.uid} is {decision.outcome.value}; "
                "only a Placed decision can be reserved"
            )
        if ttl_s <= 0:
            raise ValueError(f"ttl_s: {ttl_s} must be > 0")
        return cls.model_construct(
            job_uid=decision.uid,
            job=decision.job,
            cluster=decision.cluster,
            nodes=decision.node_requests(),
            created_at=now,
            ttl_s=ttl_s,
            compute_domain=decision.compute_domain,
        )
