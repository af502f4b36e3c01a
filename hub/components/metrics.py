"""Prometheus metrics of the hub (served on ``/metrics`` by :mod:`gpufed.hub.edge.http`).

One :class:`HubMetrics` per hub process, on its own registry (tests run several hubs in one
process). Names follow Prometheus conventions with the ``gpufed_`` prefix; docs/hub.md lists
them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpufed.sync.buildinfo import register_build_info

#: Most GPUQueues with per-queue series (bounded label cardinality: queues beyond it, by name,
#: are not exported; their status still shows everything).
MAX_QUEUE_SERIES = 200

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class HubMetrics:
    """Every metric the hub exports.

    Per-member series (``cluster`` label) and per-queue series exist only on the leader: a
    deleted member's are removed (:meth:`forget_member`), and a replica that stops leading
    removes them all (:meth:`leadership_ended`), so a standby never exports stale fleet data.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.build_info = register_build_info(r, "hub")
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
        self.scheduling_cycles = Counter(
            "gpufed_hub_scheduling_cycles_total",
            "Scheduling cycles run (each a pass over every waiting job).",
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
        self.cluster_lost = Gauge(
            "gpufed_cluster_lost",
            "1 while the member cluster is Lost (silent past the member-lost timeout, or "
            "declared lost earlier and not reconnected).",
            ["cluster"],
            registry=r,
        )
        self.cluster_nvlink_block = Gauge(
            "gpufed_cluster_largest_free_nvlink_block",
            "Largest free NVLink block (free whole GPUs of one NVLink domain) per member "
            "cluster and GPU product, as reported (before reservations).",
            ["cluster", "product"],
            registry=r,
        )
        self.reservations = Gauge(
            "gpufed_reservations",
            "Reservations in the ledger per member cluster (placed jobs whose pods the "
            "member does not report yet).",
            ["cluster"],
            registry=r,
        )
        self.reservations_ended = Counter(
            "gpufed_reservations_ended_total",
            "Reservations that left the ledger, by how: settled (the member reported the "
            "pods) or expired (the pods never showed up within the reservation TTL).",
            ["how"],
            registry=r,
        )
        self.tls_cert_expiry = Gauge(
            "gpufed_hub_tls_certificate_expiry_timestamp_seconds",
            "notAfter of the agent listener's TLS certificate, Unix seconds (absent without TLS).",
            registry=r,
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
        self.event_loop_stall = Histogram(
            "gpufed_hub_event_loop_stall_seconds",
            "How much later than asked the hub's event-loop watch woke (delays of 5 ms and "
            "more): how long something held the one event loop at a time.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.event_loop_stall_max = Gauge(
            "gpufed_hub_event_loop_stall_max_seconds",
            "The longest the hub's event loop was held at a time since the process started.",
            registry=r,
        )
        self.event_loop_stall_cpu_max = Gauge(
            "gpufed_hub_event_loop_stall_cpu_max_seconds",
            "The longest stall of the hub's event loop that its own thread spent on the CPU "
            "(a stall bounded by the loop thread's CPU time: not waiting for a CPU).",
            registry=r,
        )
        self.gc_full_seconds = Histogram(
            "gpufed_hub_gc_full_seconds",
            "CPU seconds of each full (generation 2) garbage collection of the hub process "
            "(its survivors are then frozen: gpufed.hub.edge.heap); walk=whole for one that "
            "walked the whole heap, walk=new for one that walked only what was new.",
            ["walk"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.gc_walked_heap_blocks = Gauge(
            "gpufed_hub_gc_walked_heap_blocks",
            "Allocated memory blocks of the hub's heap (sys.getallocatedblocks) when its heap "
            "policy was installed and right after its last whole-heap walk: the base of the "
            "growth rule (gpufed.hub.edge.heap).",
            registry=r,
        )
        self.lease_renewals_missed = Counter(
            "gpufed_hub_lease_renewals_missed_total",
            "Leader lease renewals that failed or came at least one renewal interval (a third "
            "of the lease) late: the event loop or etcd held them up.",
            registry=r,
        )
        self.incremental_drift = Counter(
            "gpufed_hub_incremental_drift_total",
            "Values the hub keeps incrementally that a periodic full recount found different "
            "(then rebuilt), by kind (member_gpus: a MemberCluster's GPU summary; queue_usage: "
            "a job's charge to its queue; queue_jobs: a job the GPUQueue status counts missed; "
            "queue_ledger: an entry of the quota ledgers kept from the changed charges; running: a "
            "running job kept for preemption planning). Stays 0 "
            "unless a change path was missed.",
            ["kind"],
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
        self.preemption_plans_missed = Counter(
            "gpufed_preemption_plans_missed_total",
            "Preemptors whose planning was left to the next cycle, by reason: deadline (the "
            "cycle's planning deadline passed), raced (the fleet changed under the worker), "
            "stale (the plan no longer fits the fleet when committed).",
            ["reason"],
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

    # --- series that belong to the leader ------------------------------------------------------

    _MEMBER_SERIES = (
        "cluster_ready",
        "cluster_lost",
        "cluster_gpus",
        "cluster_nvlink_block",
        "reservations",
    )

    def forget_member(self, cluster: str) -> None:
        """Remove every series of a deleted member cluster."""
        for attr in self._MEMBER_SERIES:
            _remove_matching(getattr(self, attr), cluster=cluster)

    def leadership_ended(self) -> None:
        """This replica stopped leading: drop the fleet and queue series (the next leader
        exports them) and zero the leader gauges."""
        for attr in (*self._MEMBER_SERIES, "queue_gpus", "queue_pending_jobs"):
            getattr(self, attr).clear()
        self.queue_depth.set(0)
        self.is_leader.set(0)


def _remove_matching(gauge: Gauge, **match: str) -> None:
    """Remove the children of ``gauge`` whose labels include ``match`` (public API only: a
    sample's labels come in the gauge's label order, which ``remove`` takes)."""
    seen: set[tuple[str, ...]] = set()
    for family in gauge.collect():
        for sample in family.samples:
            if all(sample.labels.get(k) == v for k, v in match.items()):
                seen.add(tuple(sample.labels.values()))
    for values in seen:
        gauge.remove(*values)
