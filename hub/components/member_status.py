"""The MemberCluster status the hub writes, and the member metrics that come with it.

Pure over one member's state (:class:`gpufed.hub.components.term.MemberState`), its reservations and the
conditions last written; :mod:`gpufed.hub.components.members` calls it whenever the member's health or
inventory changes and every ``status_interval_s``, and hands the result to
:mod:`gpufed.hub.components.mirror`. ``lastHeartbeatTime`` advances in steps of at least
``heartbeat_interval_s`` (10 s minimum): the printer column shows its age, and a write per
message would load the hub API server for nothing.

The GPU summary in the status comes from a :class:`GPUTally` per member, kept up to date by
:mod:`gpufed.hub.components.members` node by node as snapshots and deltas change nodes (not
recomputed over every node at each write); a periodic full recount
(:meth:`GPUTally.drift`) checks it against :func:`gpufed.api.inventory.summarize`.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufed.api.decision import Reservation
from gpufed.api.gpujob import StatusCondition
from gpufed.api.inventory import ClusterHealth, GPUSummary, NodeInventory, summarize
from gpufed.api.labels import GPU_RESOURCE
from gpufed.api.membercluster import READY_CONDITION, MemberClusterStatus
from gpufed.hub.components.config import HubConfig
from gpufed.hub.components.metrics import HubMetrics
from gpufed.hub.components.term import MemberState
from gpufed.hub.rules import status as st


def _counted(node: NodeInventory) -> tuple[str, str, int, int] | None:
    """(product, NVLink domain, allocatable, free whole GPUs) of a node summarize counts, or
    None (the rules of :func:`gpufed.api.inventory.summarize`)."""
    if not node.ready or node.unschedulable or node.degraded is not None:
        return None
    if node.mig_strategy == "single":
        return None
    alloc = node.allocatable.get(GPU_RESOURCE, 0)
    if alloc == 0:
        return None
    free = max(0, alloc - node.requested.get(GPU_RESOURCE, 0))
    return node.gpu_product or "unknown", node.nvlink_domain, alloc, free


class GPUTally:
    """The :class:`~gpufed.api.inventory.GPUSummary` of one member's nodes, kept node by node:
    :meth:`set` and :meth:`remove` cost O(1), :meth:`summary` O(products + NVLink domains) in
    C-level max/sum. Counts what :func:`~gpufed.api.inventory.summarize` counts (whole GPUs on
    Ready, schedulable, undegraded nodes, not under the MIG ``single`` strategy)."""

    def __init__(self, nodes: Iterable[NodeInventory] = ()) -> None:
        #: the counted nodes (frozen: what was added is what is taken away)
        self._of: dict[str, NodeInventory] = {}
        self._total: dict[str, int] = {}
        self._free: dict[str, int] = {}
        self._nodes: dict[str, int] = {}  # product -> counted nodes
        #: product -> domain -> free GPUs, and domain -> free GPUs (all products)
        self._blocks: dict[str, dict[str, int]] = {}
        self._domains: dict[str, int] = {}
        self._domain_nodes: dict[str, int] = {}
        self._block_nodes: dict[tuple[str, str], int] = {}
        for n in nodes:
            self.set(n)

    def __len__(self) -> int:
        return len(self._of)

    def set(self, node: NodeInventory) -> None:
        """Count ``node`` as it is now (replacing what was counted under its name)."""
        self.remove(node.name)
        c = _counted(node)
        if c is not None:
            self._of[node.name] = node
            self._add(*c, 1)

    def remove(self, name: str) -> None:
        """Stop counting node ``name`` (no-op when it is not counted)."""
        node = self._of.pop(name, None)
        if node is not None:
            product, domain, alloc, free = _counted(node)  # type: ignore[misc]
            self._add(product, domain, -alloc, -free, -1)

    def _add(self, product: str, domain: str, alloc: int, free: int, nodes: int) -> None:
        """Add (``nodes`` = 1) or take away (-1) one node's counts; a key whose last node
        leaves is dropped, as summarize never shows it."""
        n = self._nodes.get(product, 0) + nodes
        if n:
            self._nodes[product] = n
            self._total[product] = self._total.get(product, 0) + alloc
            self._free[product] = self._free.get(product, 0) + free
        else:
            del self._nodes[product], self._total[product], self._free[product]
        key = (product, domain)
        blocks = self._blocks.setdefault(product, {})
        b = self._block_nodes.get(key, 0) + nodes
        if b:
            self._block_nodes[key] = b
            blocks[domain] = blocks.get(domain, 0) + free
        else:
            del self._block_nodes[key], blocks[domain]
            if not blocks:
                del self._blocks[product]
        d = self._domain_nodes.get(domain, 0) + nodes
        if d:
            self._domain_nodes[domain] = d
            self._domains[domain] = self._domains.get(domain, 0) + free
        else:
            del self._domain_nodes[domain], self._domains[domain]

    def summary(self) -> GPUSummary:
        """The member's GPU summary now (equal to ``summarize`` over its nodes)."""
        return GPUSummary(
            gpus_total=dict(self._total),
            gpus_free=dict(self._free),
            largest_free_nvlink_block=max(self._domains.values(), default=0),
            largest_free_nvlink_block_by_product={
                p: max(blocks.values()) for p, blocks in self._blocks.items()
            },
        )


def health_of(m: MemberState, config: HubConfig) -> ClusterHealth:
    """The member's health as placement sees it (not ready: a reason and a message).

    A member whose agent is connected but cannot reach its own API server is not ready either
    (reason ``MemberAPIUnreachable``): work sent there would only be retried.
    """
    if m.health == "Ready":
        if m.member_api_error:
            return ClusterHealth(
                ready=False,
                reason="MemberAPIUnreachable",
                message="the agent is connected but cannot reach the member's API server: "
                + m.member_api_error,
            )
        return ClusterHealth(ready=True)
    if m.health == "Lost":
        return ClusterHealth(
            ready=False,
            reason="ClusterLost",
            message=f"no message from the agent for more than {config.member_lost_s:.0f}"
            " s: the member was declared lost and its jobs handled",
        )
    return ClusterHealth(
        ready=False,
        reason="LeaseExpired",
        message=f"no message from the agent for more than {config.member_lease_s:.0f} s",
    )


def reserved_gpus(m: MemberState, reservations: Iterable[Reservation]) -> dict[str, int]:
    """Whole GPUs reserved on the member, per GPU product (``unknown`` for unknown nodes)."""
    reserved: dict[str, int] = {}
    for res in reservations:
        if res.cluster != m.name:
            continue
        for node, amounts in res.nodes.items():
            inv = m.nodes.get(node)
            product = (inv.gpu_product if inv else None) or "unknown"
            gpus = amounts.get(GPU_RESOURCE, 0)
            if gpus:
                reserved[product] = reserved.get(product, 0) + gpus
    return reserved


def member_status(
    m: MemberState,
    config: HubConfig,
    *,
    reservations: Iterable[Reservation],
    previous_conditions: list[StatusCondition] | None,
    metrics: HubMetrics,
    now: str,
    tally: GPUTally | None = None,
) -> MemberClusterStatus:
    """The MemberCluster status the hub would write now; sets ``gpufed_cluster_ready``,
    ``gpufed_cluster_lost``,
    ``gpufed_cluster_gpus``, ``gpufed_cluster_largest_free_nvlink_block`` and
    ``gpufed_reservations`` for the member. ``previous_conditions``: those last written by
    this term (None: none yet, so the conditions read from the MemberCluster apply).
    ``tally``: the member's kept GPU summary (None: summarised over its nodes now)."""
    metrics.cluster_ready.labels(m.name).set(1 if m.health == "Ready" else 0)
    metrics.cluster_lost.labels(m.name).set(1 if m.health == "Lost" else 0)
    step = max(10.0, config.heartbeat_interval_s)
    if m.last_heard_wall is not None and (
        m.heartbeat_shown is None or m.last_heard_wall - m.heartbeat_shown >= step
    ):
        m.heartbeat_shown = m.last_heard_wall
    heartbeat = m.heartbeat_shown
    summary = summarize(m.nodes.values()) if tally is None else tally.summary()
    reservations = list(reservations)
    reserved = reserved_gpus(m, reservations)
    metrics.reservations.labels(m.name).set(len(reservations))
    for product, block in summary.largest_free_nvlink_block_by_product.items():
        metrics.cluster_nvlink_block.labels(m.name, product).set(block)
    health = health_of(m, config)
    if health.ready:
        cond = (
            ("True", "AgentConnected", "")
            if m.session is not None
            else (
                "True",
                "WithinLease",
                "no agent stream since this hub started leading; within the member lease",
            )
        )
    else:
        cond = ("False", health.reason, health.message)
    conditions = st.set_condition(
        previous_conditions if previous_conditions is not None else m.conditions_seen,
        READY_CONDITION,
        cond[0],
        reason=cond[1],
        message=cond[2],
        now=now,
    )
    for product in set(summary.gpus_total) | set(reserved):
        for state, value in (
            ("total", summary.gpus_total.get(product, 0)),
            ("free", summary.gpus_free.get(product, 0)),
            ("reserved", reserved.get(product, 0)),
        ):
            metrics.cluster_gpus.labels(m.name, product, state).set(value)
    gpu_summary = ", ".join(
        f"{p}={summary.gpus_free.get(p, 0)}/{t}" for p, t in sorted(summary.gpus_total.items())
    )
    return MemberClusterStatus(
        conditions=conditions,
        gpus_total=summary.gpus_total,
        gpus_free=summary.gpus_free,
        gpus_reserved=reserved,
        largest_free_nvlink_block=summary.largest_free_nvlink_block,
        largest_free_nvlink_block_by_product=summary.largest_free_nvlink_block_by_product,
        gpu_summary=gpu_summary or "none",
        nodes=len(m.nodes),
        served_kinds=list(m.meta.served_kinds),
        last_heartbeat_time=st.rfc3339(heartbeat) if heartbeat else None,
        agent_version=m.meta.agent_version or None,
        lost_time=st.rfc3339(m.meta.lost_at) if m.meta.lost_at else None,
        cluster_uid=m.meta.cluster_uid or None,
    )


def drift(tally: GPUTally, nodes: Iterable[NodeInventory]) -> bool:
    """Whether ``tally`` differs from a full recount of ``nodes`` (then the caller counts the
    drift and rebuilds the tally)."""
    return tally.summary() != summarize(nodes)
