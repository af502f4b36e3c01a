"""The MemberCluster status the hub writes, and the member metrics that come with it.

Pure over one member's state (:class:`gpufed.hub.components.state.MemberState`), its reservations and the
conditions last written; :mod:`gpufed.hub.components.members` calls it whenever the member's health or
inventory changes and every ``status_interval_s``, and hands the result to
:mod:`gpufed.hub.components.mirror`. ``lastHeartbeatTime`` advances in steps of at least
``heartbeat_interval_s`` (10 s minimum): the printer column shows its age, and a write per
message would load the hub API server for nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufed.api.decision import Reservation
from gpufed.api.gpujob import StatusCondition
from gpufed.api.inventory import ClusterHealth, summarize
from gpufed.api.labels import GPU_RESOURCE
from gpufed.api.membercluster import READY_CONDITION, MemberClusterStatus
from gpufed.hub.components.config import HubConfig
from gpufed.hub.components.metrics import HubMetrics
from gpufed.hub.components.state import MemberState
from gpufed.hub.rules import status as st


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
) -> MemberClusterStatus:
    """The MemberCluster status the hub would write now; sets ``gpufed_cluster_ready``,
    ``gpufed_cluster_lost``,
    ``gpufed_cluster_gpus``, ``gpufed_cluster_largest_free_nvlink_block`` and
    ``gpufed_reservations`` for the member. ``previous_conditions``: those last written by
    this term (None: none yet, so the conditions read from the MemberCluster apply)."""
    metrics.cluster_ready.labels(m.name).set(1 if m.health == "Ready" else 0)
    metrics.cluster_lost.labels(m.name).set(1 if m.health == "Lost" else 0)
    step = max(10.0, config.heartbeat_interval_s)
    if m.last_heard_wall is not None and (
        m.heartbeat_shown is None or m.last_heard_wall - m.heartbeat_shown >= step
    ):
        m.heartbeat_shown = m.last_heard_wall
    heartbeat = m.heartbeat_shown
    summary = summarize(m.nodes.values())
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
