"""Label, annotation, resource, finalizer and API-group names used across gpufed.

One place for every key so that the hub, the agent, the sandbox and the docs agree. Keys owned
by gpufed live under ``gpufed.io``; NVIDIA keys are those that GPU Feature Discovery (GFD) and
the NVIDIA device plugin publish on nodes (NVIDIA/k8s-device-plugin,
docs/gpu-feature-discovery/README.md).
"""

from __future__ import annotations

from typing import Final

# --- gpufed API group (hub cluster custom resources) -------------------------------------------
GROUP: Final = "gpufed.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

# --- gpufed labels and annotations --------------------------------------------------------------
#: On every object gpufed applies to a member (and on its pod templates): which hub owns it.
ORIGIN_LABEL: Final = "gpufed.io/origin"
#: The origin of a hub (``gpufed hub --origin``) and of an agent (``gpufed agent --origin``)
#: started without the flag; an agent acts only on objects of the origin it was given.
DEFAULT_ORIGIN: Final = "gpufed-hub"
#: On every object gpufed applies to a member (and on its pod templates): the GPUJob's UID.
JOB_UID_LABEL: Final = "gpufed.io/job-uid"
#: Full ``namespace/name`` of the hub GPUJob (annotation: may exceed 63 characters).
JOB_ANNOTATION: Final = "gpufed.io/job"
#: Pod template annotation: the placement attempt the pods belong to (1, 2 after a re-run).
ATTEMPT_ANNOTATION: Final = "gpufed.io/attempt"
#: Annotation on every prepared object of a job whose ``spec.placement.retry.nodeNotReadySeconds``
#: is not the default (300): how long the agent waits out a not-Ready node or a GPU drop under
#: it before reporting an infrastructure failure (absent: 300).
NODE_NOT_READY_ANNOTATION: Final = "gpufed.io/node-not-ready-seconds"
#: Environment variable every container of a job gets: the placement attempt (resume from
#: the checkpoint when above 1).
ATTEMPT_ENV: Final = "GPUFED_ATTEMPT"
#: On every object the agent applies to a member: the hub state epoch it was applied under
#: (the hub's Welcome ``hub_epoch``). The agent's garbage collection deletes an object the hub
#: no longer wants at once only when it carries the current epoch; objects of another (or no)
#: epoch wait the eviction grace period (docs/design.md §7 item 7).
HUB_EPOCH_ANNOTATION: Final = "gpufed.io/hub-epoch"
#: Namespaces that gpufed created in a member carry this label (value "true").
MANAGED_NAMESPACE_LABEL: Final = "gpufed.io/managed"
#: Join-token Secrets on the hub carry this label (value "true"; `gpufed hub join` sets it): the
#: hub list+watches only labelled Secrets of the token namespaces.
JOIN_TOKEN_LABEL: Final = "gpufed.io/join-token"
#: On a hub replica's own Pod: ``leader`` or ``standby`` (the hub Service selects ``leader``,
#: so agents reach the leader whichever replica is Ready; gpufed.hub.edge.podrole).
HUB_ROLE_LABEL: Final = "gpufed.io/hub-role"
#: Pod Security Admission's level label on a Namespace (``privileged``, ``baseline``,
#: ``restricted``): read on the hub's namespaces, set on the member namespaces the agent creates.
POD_SECURITY_ENFORCE_LABEL: Final = "pod-security.kubernetes.io/enforce"
#: Finalizer on hub GPUJobs: removed once the member copy is gone or the member is lost.
FINALIZER: Final = "gpufed.io/member-cleanup"

#: Sandbox pod lifecycle (kwok stages): run for this Go duration ("30s", "2m"), then finish.
SIM_DURATION_ANNOTATION: Final = "gpufed.io/sim-duration"
#: Sandbox pod lifecycle: with a duration, fail with this exit code (> 0) instead of succeeding.
SIM_EXIT_CODE_ANNOTATION: Final = "gpufed.io/sim-exit-code"

#: Placement fields on a plain Job/JobSet/PyTorchJob that `gpufed submit` wraps (docs/design.md §4).
GPU_PRODUCTS_ANNOTATION: Final = "gpufed.io/gpu-products"  # comma-separated GFD products
NVLINK_ANNOTATION: Final = "gpufed.io/nvlink"  # Required | Preferred | None
PRIORITY_ANNOTATION: Final = "gpufed.io/priority"  # integer
#: Label on a plain workload (wrapped by `gpufed submit`, or applied to the hub with
#: ``managedBy: gpufed.io/hub``): the GPUQueue it is charged to (``spec.placement.queue``).
QUEUE_LABEL: Final = "gpufed.io/queue"
#: The ``managedBy`` value (Job ``spec.managedBy``, JobSet ``spec.managedBy``) that hands a plain
#: workload applied to the hub cluster to gpufed (docs/hub.md, "Plain workloads on the hub").
MANAGED_BY: Final = "gpufed.io/hub"
#: On a GPUJob the hub made for a plain workload: the workload's kind (``Job``, ``JobSet``).
MANAGED_KIND_LABEL: Final = "gpufed.io/managed-kind"
#: On a member Job or its pods, set by the running job: when it last saved a checkpoint
#: (RFC 3339). The agent forwards it in WorkloadStatus; the hub shows it as
#: ``GPUJob.status.lastCheckpointTime`` (preemption's cost of lost work).
LAST_CHECKPOINT_ANNOTATION: Final = "gpufed.io/last-checkpoint"
#: Demo examples: the phase each example is expected to end in (Succeeded, Failed, Pending …).
EXPECT_ANNOTATION: Final = "gpufed.io/expect"
#: Node label naming the fleet node pool a simulated node belongs to (gpufed-owned; the sandbox
#: and the simulator set it from the fleet spec, docs/design.md §5).
NODE_POOL_LABEL: Final = "gpufed.io/node-pool"

# --- NVIDIA device plugin resources and GFD labels ---------------------------------------------
GPU_RESOURCE: Final = "nvidia.com/gpu"
#: Prefix of MIG profile resources under the "mixed" strategy, e.g. ``nvidia.com/mig-1g.10gb``.
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
GPU_COUNT_LABEL: Final = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL: Final = "nvidia.com/gpu.memory"  # MiB
GPU_FAMILY_LABEL: Final = "nvidia.com/gpu.family"
#: Multi-node NVLink domain (GB200 NVL72): ``<fabric ClusterUUID>.<CliqueID>``.
GPU_CLIQUE_LABEL: Final = "nvidia.com/gpu.clique"
MIG_STRATEGY_LABEL: Final = "nvidia.com/mig.strategy"  # none | single | mixed

# --- NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu) --------------------------------
#: Driver (and DeviceClass) of whole GPUs and MIG devices in ResourceSlices.
DRA_GPU_DRIVER: Final = "gpu.nvidia.com"
#: DeviceClass of MIG devices published through DRA.
DRA_MIG_CLASS: Final = "mig.nvidia.com"
#: NVIDIA's ComputeDomain (multi-node NVLink through IMEX): its API version, ``Kind.group``, the
#: driver and DeviceClass of its channels, and the node label its controller sets on the nodes
#: where a domain's channel claim is prepared (value: the domain's UID).
COMPUTE_DOMAIN_API_VERSION: Final = "resource.nvidia.com/v1beta1"
COMPUTE_DOMAIN_KIND: Final = "ComputeDomain.resource.nvidia.com"
DRA_COMPUTE_DOMAIN_DRIVER: Final = "compute-domain.nvidia.com"
DRA_CHANNEL_CLASS: Final = "compute-domain-default-channel.nvidia.com"
COMPUTE_DOMAIN_NODE_LABEL: Final = "resource.nvidia.com/computeDomain"

# --- Kubernetes well-known keys ------------------------------------------------------------------
HOSTNAME_LABEL: Final = "kubernetes.io/hostname"

#: Default node labels for the network levels above the NVLink domain (configurable; the
#: same keys as the Kueue topology-aware scheduling examples).
DEFAULT_RACK_LABEL: Final = "cloud.provider.com/topology-rack"
DEFAULT_BLOCK_LABEL: Final = "cloud.provider.com/topology-block"


def is_mig_resource(resource: str) -> bool:
    """True for a MIG profile resource such as ``nvidia.com/mig-1g.10gb`` (never a whole GPU)."""
    return resource.startswith(MIG_RESOURCE_PREFIX)
