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

from gpufed.api.gpujob import CRDModel, DateTime, ObjectMeta, StatusCondition
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
    value: str = Field(default="", max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class SecretKeyRef(CRDModel):
    """Where the member's join token lives on the hub: Secret ``namespace/name``, data ``key``.

    ``namespace`` defaults to the hub's own namespace (flag ``--token-namespace``).
    """

    name: str = Field(min_length=1, max_length=253)
    namespace: str | None = Field(default=None, max_length=63)
    key: str = Field(default=DEFAULT_TOKEN_KEY, min_length=1, max_length=253)


class MemberClusterSpec(CRDModel):
    """``MemberCluster.spec``.

    ``labels``: matched by ``GPUJob.spec.placement.clusterSelector``. ``taints``: every job
    sent here must tolerate them (pod set tolerations). ``joinTokenRef``: the Secret holding
    the bootstrap token the agent presents (``authorization: Bearer <token>``).
    """

    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[ClusterTaint] = Field(default_factory=list, max_length=32)
    join_token_ref: SecretKeyRef


class SuspectNode(CRDModel):
    """A node the hub leaves out of placement after an infrastructure failure on it, until
    ``until`` (its cool-down, hub ``--suspect-node-cooldown``); ``reason``: the failure."""

    node: str
    reason: str = ""
    until: DateTime | None = None


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
    gpus_total: dict[str, int] = Field(default_factory=dict)
    gpus_free: dict[str, int] = Field(default_factory=dict)
    gpus_reserved: dict[str, int] = Field(default_factory=dict)
    largest_free_nvlink_block: int | None = Field(default=None, alias="largestFreeNVLinkBlock")
    largest_free_nvlink_block_by_product: dict[str, int] = Field(
        default_factory=dict, alias="largestFreeNVLinkBlockByProduct"
    )
    gpu_summary: str | None = None
    nodes: int | None = None
    served_kinds: list[str] = Field(default_factory=list)
    last_heartbeat_time: DateTime | None = None
    agent_version: str | None = None
    lost_time: DateTime | None = None
    cluster_uid: str | None = Field(default=None, alias="clusterUID")
    suspect_nodes: list[SuspectNode] = Field(default_factory=list, max_length=256)

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
