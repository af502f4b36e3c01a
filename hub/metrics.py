"""Prometheus metrics of the hub (served on ``/metrics`` by :mod:`gpufed.hub.http`).

One :class:`HubMetrics` per hub process, on its own registry (tests run several hubs in one
process). Names follow Prometheus conventions with the ``gpufed_`` prefix; docs/hub.md lists
them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: Most GPUQueues with per-queue series (bounded label cardinality: queues beyond it, by name,
#: are not exported; their status still shows everything).
MAX_QUEUE_SERIES = 200

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class HubMetrics:
    """Every metric the hub exports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.is_leader = Gauge(
            "gpufed_hub_is_leader", "1 while this replica is the leader.", registry=r
        )
        self.queue_depth = Gauge(
            "gpufed_hub_queue_depth",
            "GPUJobs waiting to be placed (valid, not placed, not finished).",
            registry=r,
        )
        self.placement_seconds = Histogram(
            "gpufed_placement_duration_seconds",
            "Time of one place() call (one decision), seconds.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.placement_latency_seconds = Histogram(
            "gpufed_placement_latency_seconds",
            "From the hub seeing a GPUJob to its placement decision, seconds.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.dispatch_seconds = Histogram(
            "gpufed_dispatch_duration_seconds",
            "From a placement decision to the agent acknowledging the objects, seconds.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.decisions = Counter(
            "gpufed_placement_decisions_total",
            "Placement decisions by outcome.",
            ["outcome"],
            registry=r,
        )
        self.cluster_gpus = Gauge(
            "gpufed_cluster_gpus",
            "Whole GPUs per member cluster and GPU product; state is total, free or reserved.",
            ["cluster", "product", "state"],
            registry=r,
        )
        self.cluster_ready = Gauge(
            "gpufed_cluster_ready", "1 while the member cluster is Ready.", ["cluster"], registry=r
        )
        self.agents_connected = Gauge(
            "gpufed_agents_connected", "Agent streams currently open.", registry=r
        )
        self.streams_closed = Counter(
            "gpufed_agent_streams_closed_total",
            "Agent streams the hub closed, by gRPC code.",
            ["code"],
            registry=r,
        )
        self.rebuild_adopted = Counter(
            "gpufed_rebuild_adopted_jobs_total",
            "Placements adopted from what survived a loss of etcd state, by source (status: "
            "the GPUJob status; agent: the agent that holds the job).",
            ["source"],
            registry=r,
        )
        self.rebuild_unclaimed = Counter(
            "gpufed_rebuild_unclaimed_held_jobs_total",
            "Jobs an agent reported holding that have no GPUJob on the hub (left to the "
            "agent's eviction grace period), by member.",
            ["cluster"],
            registry=r,
        )
        self.requeues = Counter(
            "gpufed_requeues_total",
            "Placed jobs whose member copy the hub stopped and that went back to Pending for "
            "a new attempt, by cause (Preempted, InfrastructureFailure).",
            ["cause"],
            registry=r,
        )
        self.preemptions = Counter(
            "gpufed_preemptions_total",
            "Jobs preempted (victims chosen and committed), by member cluster and reason "
            "(priority: lower priority; reclaim: its queue borrowed from the preemptor's).",
            ["cluster", "reason"],
            registry=r,
        )
        self.preemption_gpu_seconds_lost = Counter(
            "gpufed_preemption_gpu_seconds_lost_total",
            "Work lost to preemption: GPUs x seconds since each victim's last checkpoint.",
            registry=r,
        )
        self.preemption_planning_seconds = Histogram(
            "gpufed_preemption_planning_seconds",
            "Time one scheduling cycle spent planning preemptions (all its preemptors), "
            "seconds (the cycle waits for it).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.work_sent = Counter(
            "gpufed_work_items_sent_total", "Work items sent to agents, by op.", ["op"], registry=r
        )
        self.status_writes = Counter(
            "gpufed_status_writes_total",
            "Status writes to the hub API server, by kind and result (ok, error, gone, "
            "conflict: the object changed since read, fenced: not written, not the leader).",
            ["kind", "result"],
            registry=r,
        )
        self.status_corrections = Counter(
            "gpufed_status_corrections_total",
            "Statuses the leader found changed on the hub API server by someone else and "
            "wrote again (the periodic status resync).",
            ["kind"],
            registry=r,
        )
        self.queue_gpus = Gauge(
            "gpufed_queue_gpus",
            "GPUs (MIG keys: slices) per GPUQueue and quota key; state is nominal, used "
            "(reserved and running jobs of the queue and its descendants) or borrowed (used "
            "above nominal). At most MAX_QUEUE_SERIES queues, first by name.",
            ["queue", "gpu_product", "state"],
            registry=r,
        )
        self.queue_pending_jobs = Gauge(
            "gpufed_queue_pending_jobs",
            "GPUJobs of a GPUQueue (its own) waiting to be placed.",
            ["queue"],
            registry=r,
        )
