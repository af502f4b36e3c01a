"""The cluster-scoped ``MemberCluster`` custom resource (``gpufed.io/v1alpha1``): docs/design.md §4.

An administrator creates one per member cluster: its labels and taints (what placement's
cluster selector and tolerations see) and a reference to the Secret on the hub that holds its
bootstrap (join) token. The hub writes ``status`` from its own receive times and the agent's
inventory: the Ready condition, GPU totals and free GPUs per product, the largest free NVLink
block, the last heartbeat and the agent version.

Who uses it: the hub (membership, health, placement input), ``gpufed get clusters``, and the
CRD generator (:mod:`gpufed.api.crdgen`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gpufed.api.crdbase import CRDModel, DateTime, ObjectMeta, StatusCondition
from gpufed.api.labels import API_VERSION

KIND = "MemberCluster"
PLURAL = "memberclusters"
#: The condition type that carries member health.
READY_CONDITION = "Ready"
#: Default key of the join token inside its Secret.
DEFAULT_TOKEN_KEY = "token"


class ClusterTaint(CRDModel):
    """A taint on the whole member (Kubernetes ``Taint`` semantics): jobs must tolerate it."""

    key: str = Field(min_length=1, max_length=317)
    """The taint key."""
    value: str = Field(default="", max_length=63)
    """The taint value (may be empty)."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
    """`NoSchedule`, `PreferNoSchedule` or `NoExecute`, as for a node taint."""


class SecretKeyRef(CRDModel):
    """Where the member's join token lives on the hub: Secret ``namespace/name``, data ``key``.

    ``namespace`` defaults to the hub's own namespace (flag ``--token-namespace``).
    """

    name: str = Field(min_length=1, max_length=253)
    """The Secret's name."""
    namespace: str | None = Field(default=None, max_length=63)
    """The Secret's namespace; absent: the hub's `--token-namespace` (default `gpufed-system`)."""
    key: str = Field(default=DEFAULT_TOKEN_KEY, min_length=1, max_length=253)
    """The key in the Secret's data that holds the token (default `token`)."""


class MemberClusterSpec(CRDModel):
    """``MemberCluster.spec``.

    ``labels``: matched by ``GPUJob.spec.placement.clusterSelector``. ``taints``: every job
    sent here must tolerate them (pod set tolerations). ``joinTokenRef``: the Secret holding
    the bootstrap token the agent presents (``authorization: Bearer <token>``).
    """

    labels: dict[str, str] = Field(default_factory=dict)
    """Labels of the member, matched by `GPUJob.spec.placement.clusterSelector` (e.g. `region:
    us-east`)."""
    taints: list[ClusterTaint] = Field(default_factory=list, max_length=32)
    """Taints on the whole member: every job sent here must tolerate them (at most 32)."""
    join_token_ref: SecretKeyRef


class SuspectNode(CRDModel):
    """A node the hub leaves out of placement after an infrastructure failure on it, until
    ``until`` (its cool-down, hub ``--suspect-node-cooldown``); ``reason``: the failure."""

    node: str
    """The member's node name."""
    reason: str = ""
    """The failure that made it suspect (`NodeLost`, `NodeNotReady`, `GPUUnavailable`, a
    `DisruptionTarget` reason, `InfrastructureExitCode`)."""
    until: DateTime | None = None
    """When its cool-down ends and placement may use it again (RFC 3339)."""


class MemberClusterStatus(CRDModel):
    """``MemberCluster.status``, written only by the hub.

    ``conditions``: ``Ready`` from the hub's own receive times (``False`` with reason
    ``LeaseExpired`` after the lease, ``ClusterLost`` after the member-lost timeout).
    ``gpusTotal`` / ``gpusFree`` / ``gpusReserved``: GPU product -> whole GPUs on Ready,
    schedulable nodes, taints ignored (docs/design.md §3); reserved = promised to dispatched jobs
    whose pods are not bound yet. ``largestFreeNVLinkBlock``: the most free whole GPUs inside
    one NVLink domain; ``largestFreeNVLinkBlockByProduct``: the same per GPU product (what
    ``gpufed get gpus`` shows). ``gpuSummary``: ``product=free/total`` pairs for the printer column.
    ``clusterUID``: the UID of the member's ``kube-system`` Namespace, recorded from the first
    agent that joined; an agent talking to another Kubernetes cluster is refused (delete and
    re-join the MemberCluster to move the member to a rebuilt cluster).
    ``suspectNodes``: nodes left out of placement for a cool-down after an infrastructure
    failure on them (at most 256; ``gpufed get clusters`` shows them).
    """

    conditions: list[StatusCondition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """KEP-1623 conditions: `Ready` from the hub's own receive times (`False` with reason
    `LeaseExpired` after the member lease, `ClusterLost` after the member-lost timeout)."""
    gpus_total: dict[str, int] = Field(default_factory=dict)
    """GPU product -> whole GPUs on Ready, schedulable nodes (taints ignored)."""
    gpus_free: dict[str, int] = Field(default_factory=dict)
    """GPU product -> whole GPUs not requested by any pod, on Ready, schedulable nodes."""
    gpus_reserved: dict[str, int] = Field(default_factory=dict)
    """GPU product -> whole GPUs promised to dispatched jobs whose pods are not bound yet."""
    largest_free_nvlink_block: int | None = Field(default=None, alias="largestFreeNVLinkBlock")
    """The most free whole GPUs inside one NVLink domain of the member (8 for an idle HGX node, 72
    for an idle NVL72 clique)."""
    largest_free_nvlink_block_by_product: dict[str, int] = Field(
        default_factory=dict, alias="largestFreeNVLinkBlockByProduct"
    )
    """The same per GPU product."""
    gpu_summary: str | None = None
    """`product=free/total` pairs, for the printer column."""
    nodes: int | None = None
    """Nodes the member reports."""
    served_kinds: list[str] = Field(default_factory=list)
    """Workload kinds the member serves (`Job.batch`, `JobSet.jobset.x-k8s.io`, …), from the agent's
    hello."""
    last_heartbeat_time: DateTime | None = None
    """When the hub last heard from the member's agent (RFC 3339, updated at most every 10 s)."""
    agent_version: str | None = None
    """The version of the member's agent."""
    lost_time: DateTime | None = None
    """When the hub declared the member lost (RFC 3339); absent while it is not."""
    cluster_uid: str | None = Field(default=None, alias="clusterUID")
    """The UID of the member's `kube-system` Namespace, recorded from the first agent that joined;
    an agent of another Kubernetes cluster is refused."""
    suspect_nodes: list[SuspectNode] = Field(default_factory=list, max_length=256)
    """Nodes left out of placement after an infrastructure failure, until their cool-down ends."""

    def ready(self) -> bool | None:
        """The Ready condition as a bool (None when the hub has not judged yet)."""
        for cond in self.conditions:
            if cond.type == READY_CONDITION:
                return cond.status == "True"
        return None


class MemberCluster(CRDModel):
    """A member cluster known to the hub (cluster-scoped)."""

    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: MemberClusterSpec
    status: MemberClusterStatus | None = None


#: Printer columns of ``kubectl get memberclusters``.
PRINTER_COLUMNS: list[dict[str, Any]] = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {"name": "GPUs (free/total)", "type": "string", "jsonPath": ".status.gpuSummary"},
    {"name": "Largest-Block", "type": "integer", "jsonPath": ".status.largestFreeNVLinkBlock"},
    {"name": "Heartbeat", "type": "date", "jsonPath": ".status.lastHeartbeatTime"},
    {"name": "Agent", "type": "string", "jsonPath": ".status.agentVersion", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
