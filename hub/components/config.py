"""Hub configuration: every knob of the hub process in one validated model.

Built by ``gpufed hub`` from its flags (cli/hub.py) and by tests directly. Durations are
seconds; sizes are bytes. Defaults are what a production hub would use; tests shorten the
timers (member lease, member-lost timeout, leader lease) to seconds.
"""

from __future__ import annotations

import socket
import uuid
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufed.api.queue import MAX_PRIORITY
from gpufed.hub.rules.managed import KINDS as MANAGED_KINDS
from gpufed.hub.rules.managed import UNMANAGEABLE
from gpufed.placement.fairshare import DEFAULT_HALF_LIFE_S
from gpufed.placement.preemption import PreemptionRules
from gpufed.placement.queue import (
    DEFAULT_CARRY_HOLDS,
    DEFAULT_HOLDS_PER_SHAPE,
    DEFAULT_SIZE_AGING_S,
    DEFAULT_SPARE_WHOLE_NODES_S,
    BackfillRule,
    QueueOrder,
)
from gpufed.placement.quota import DEFAULT_QUEUE
from gpufed.sync.manifests import DEFAULT_ALLOWED_KINDS
from gpufed.sync.podsecurity import Level

#: ``--unlisted-namespaces``: what a GPUJob of a namespace no GPUQueue lists gets.
UnlistedNamespaces = Literal["default-queue", "reject"]

#: Hub namespaces no GPUJob may use, besides ``token_namespace`` and ``reserved_namespaces``.
SYSTEM_NAMESPACES: frozenset[str] = frozenset(
    {"kube-system", "kube-public", "kube-node-lease", "gpufed-system"}
)


def default_hub_id() -> str:
    """``<hostname>-<8 hex>``: unique per hub process (logs, leader key, Welcome.hub_id)."""
    return f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


class TLSConfig(BaseModel):
    """TLS of the agent gRPC listener (PEM files). ``client_ca_file`` turns on client certs."""

    model_config = ConfigDict(frozen=True)

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None


class HubConfig(BaseModel):
    """Everything the hub process needs to know.

    - ``hub_id``: this replica's id (logs, leader key, ``Welcome.hub_id``).
    - ``origin``: the ``gpufed.io/origin`` label value of every object sent to members; the
      same for every replica of one hub (agents reconcile by it after a failover).
    - ``listen``: gRPC address for agents (``host:port``; port 0 picks a free one);
      ``http_listen``: ``/metrics``, ``/healthz``, ``/readyz``, ``/leaderz``, ``/version``.
    - ``etcd_endpoints``: ``host:port`` of a shared etcd (leader election happens there);
      empty means an embedded private etcd in ``data_dir`` (see :mod:`gpufed.hub.adapters.etcd`).
    - ``etcd_prefix``: every key the hub writes lives under it (docs/hub.md, "etcd layout").
    - ``tls``: server certificate; ``None`` with ``insecure`` true serves plaintext (tests
      and local experiments only).
    - ``token_namespace``: default namespace of the join-token Secrets.
    - ``member_lease_s``: a member whose agent sent nothing for this long turns NotReady;
      ``member_lost_s``: after this long its jobs follow ``spec.placement.reschedule``.
    - ``leader_lease_s``: etcd lease TTL of the leader key (failover takes up to this).
    - ``heartbeat_interval_s``: what Welcome asks agents to send.
    - ``max_unacked_per_cluster``: work items in flight to one member before the hub waits
      for acks; ``resend_after_s``: an unacknowledged item is sent again after this.
    - ``status_writers``: GPUJob status writes in flight to the hub API server at once. The
      writer's throughput is this many divided by one write's latency: it must stay above
      the rate at which jobs change phase (a job ending is one write, and a backlog of them
      delays every job's final status), also while each write takes a loaded API server
      0.3-0.5 s. ``status_hold_s``: a job's status change after a quiet spell is written
      this long after it happened (not a terminal one: that is written at once), so that the
      steps that follow it soon (placed, acknowledged, running) take one write, not three;
      1 s, as Kubernetes' Job controller batches a Job's status syncs (``syncJobBatchPeriod``).
      At 0.25 s the e2e bench's hub API server fell behind (docs/benchmarks.md, stop 41).
    - ``apply_retry_limit``: a job whose Apply the member refuses with a retryable error
      (5xx, 429, a namespace being terminated, …) is sent again with backoff (5 s doubling
      to ``apply_retry_max_s``) this many times, then Failed (reason ``MemberRejected``); its
      status says "retrying in <member> …" meanwhile. Deletes are retried without limit.
    - ``max_message_bytes``: larger agent messages close that stream.
    - ``reservation_ttl_s``: a reservation whose pods never show up expires after this.
    - ``allowed_kinds``: kinds a GPUJob may create in a member (``Kind.group``).
    - ``managed_kinds``: kinds of plain workloads (``Job``, ``JobSet``) the hub federates when
      applied to the hub cluster with ``spec.managedBy: gpufed.io/hub``
      (:mod:`gpufed.hub.components.managed`); empty (the default): none. Off unless asked for:
      whoever may create a Job may then run GPU jobs, whatever RBAC says about ``gpujobs``.
    - ``default_pod_security``: the Pod Security level of a hub namespace without the
      ``pod-security.kubernetes.io/enforce`` label (docs/hub.md, "Admission").
    - ``reserved_namespaces``: hub namespaces whose GPUJobs are refused, besides
      :data:`SYSTEM_NAMESPACES` and ``token_namespace`` (see :attr:`refused_namespaces`).
    - ``allow_exposed_services``: NodePort/LoadBalancer Services and ``externalIPs`` pass.
    - ``allocation``: placement policy, ``binpack`` or ``spread``.
    - ``explain_members``: with at most this many members, a placed job's decision records
      every member's score or rejection (what ``gpufed explain`` shows later); on larger
      fleets only the winner is recorded, since placement stops evaluating members once the
      winner is certain (0 turns full explanations of placed jobs off).
    - ``status_resync_s``: how often the leader compares every GPUJob and MemberCluster
      status the hub API shows with the one it computed and writes the differences again (level-triggered:
      a write that someone else overwrote is corrected within this long).
    - ``default_queue``: the GPUQueue of GPUJobs whose namespace no queue lists. Without a
      GPUQueue of that name it has no limit (every job is admitted, as before queues existed);
      create one to give those jobs a quota (docs/hub.md, "Queues and quotas").
    - ``unlisted_namespaces``: what happens to a never-placed GPUJob whose namespace no
      GPUQueue lists: ``default-queue`` places it in ``default_queue``; ``reject`` keeps it
      Pending (``Placed=False``, reason ``NamespaceNotListed``) until a GPUQueue lists its
      namespace. Jobs placed before (a job record) are never refused: they keep running and,
      when requeued, go back to the default queue.
    - ``default_queue_max_priority``: the ``spec.maxPriority`` of ``default_queue`` when no
      GPUQueue of that name sets one (None: no cap); an int32, like the field.
    - ``pod_name``/``pod_namespace``: this replica's own Pod (downward API ``POD_NAME``,
      ``POD_NAMESPACE``); when set, the replica labels it ``gpufed.io/hub-role`` ``leader`` or
      ``standby`` (:mod:`gpufed.hub.edge.podrole`); empty outside a Pod.
    - ``fair_share_half_life_s``: half-life of the decayed GPU-seconds that order queues in
      fair sharing (:mod:`gpufed.placement.fairshare`).
    - ``queue_order``: within a queue and priority, ``smallest-first`` (jobs with fewer GPUs
      first, except those waiting ``queue_oldest_first_s`` or more, which go first, oldest
      first) or ``fifo`` (earlier first); ``queue_starvation_s``: seconds a job waits without
      fitting before it holds the nodes it needs; ``queue_max_holds``: jobs holding nodes at
      once, not counting jobs past ``queue_oldest_first_s``, which always may, so they wait at
      most that plus one drain within their queue (:class:`gpufed.placement.BackfillRule`;
      docs/placement.md, "Queue and backfill"); ``queue_holds_per_shape``: starving jobs of one
      shape that hold different nodes in one pass (1 to 64; 1: one per shape per pass), within
      ``queue_max_holds``; ``queue_size_aging_s``: with ``smallest-first``, a job's size in the
      order is divided by ``1 + waited / queue_size_aging_s`` (0: sizes do not age);
      ``queue_carry_holds``: the holds of the previous pass whose holders still wait also keep
      the younger jobs walked before their holder off its nodes (``BackfillRule.carry_holds``,
      except jobs whose time limit ends before the holder's expected start);
      ``queue_spare_whole_nodes_s``: a job smaller than a node that has waited less than this
      is first tried only on partly used nodes, and anywhere only after the pass's other jobs
      (``BackfillRule.spare_whole_nodes_s``; 0: off). Their
      defaults are ``BackfillRule``'s, so the hub runs what ``gpufed simulate`` measures.
    - ``preemption``: a job left Unschedulable whose PriorityClass has ``preemptionPolicy:
      PreemptLowerPriority`` preempts lower-priority jobs (and reclaims its queue's nominal
      quota) to free exactly the block it needs (docs/hub.md, "Preemption"); False: never.
      Its guard rails (:class:`gpufed.placement.preemption.PreemptionRules`):
      ``preemption_min_runtime_s`` (a job runs at least this long before it may be
      preempted), ``preemption_max_per_hour`` (a job preempted this many times in the last
      hour is not preempted again), ``preemption_cooldown_s`` (a job preempted less than this
      long ago may not preempt back the job that preempted it);
      ``preemption_max_preemptors``: preemptors planned per scheduling cycle (each plan runs
      what-if placements; the others wait for the next cycle); ``preemption_deadline_s``:
      seconds of planning a cycle starts, counted once the cycle's running jobs are read and
      filed (planning runs in a worker thread, off the event loop; no new plan is started
      past it, and the preemptors left are planned next cycle; the first is always planned).
    - ``suspect_node_cooldown_s``: nodes named by an infrastructure failure are left out of
      placement this long (0: never suspect; :mod:`gpufed.hub.components.reservations`).
    - ``rerun_backoff_base_s`` / ``rerun_backoff_max_s``: the wait before a re-run after an
      infrastructure failure, doubling per re-run from the base up to the max (Kueue's
      ``requeuingStrategy``: 60 s and 3,600 s); 0 base: no wait. A drain or a member-side
      preemption waits not and uses no re-run budget (:mod:`gpufed.hub.rules.lifecycle`).
    - ``degraded_node_conditions``: Node condition types (at most 32) that make a node degraded
      for placement while True (e.g. a GPU health checker's); sent to every agent in
      ``Welcome``, which reports such nodes degraded.
    """

    model_config = ConfigDict(frozen=True)

    hub_id: str = Field(default_factory=default_hub_id, min_length=1)
    origin: str = Field(default="gpufed-hub", min_length=1)
    listen: str = "0.0.0.0:7443"
    http_listen: str = "0.0.0.0:8080"
    kubeconfig: Path | None = None
    context: str | None = None
    etcd_endpoints: tuple[str, ...] = ()
    etcd_prefix: str = "/gpufed/hub/"
    data_dir: Path = Field(default_factory=lambda: Path.home() / ".local" / "share" / "gpufed-hub")
    pod_name: str = ""
    pod_namespace: str = ""
    tls: TLSConfig | None = None
    insecure: bool = False
    token_namespace: str = "gpufed-system"
    member_lease_s: float = Field(default=40.0, gt=0)
    member_lost_s: float = Field(default=600.0, gt=0)
    leader_lease_s: int = Field(default=15, ge=2)
    heartbeat_interval_s: float = Field(default=10.0, gt=0)
    max_unacked_per_cluster: int = Field(default=64, ge=1)
    status_writers: int = Field(default=32, ge=1)
    status_hold_s: float = Field(default=1.0, ge=0)
    resend_after_s: float = Field(default=30.0, gt=0)
    apply_retry_limit: int = Field(default=10, ge=1)
    apply_retry_max_s: float = Field(default=60.0, gt=0)
    max_message_bytes: int = Field(default=16 * 1024 * 1024, ge=64 * 1024)
    reservation_ttl_s: float = Field(default=600.0, gt=0)
    allowed_kinds: frozenset[str] = DEFAULT_ALLOWED_KINDS
    managed_kinds: frozenset[str] = frozenset()
    default_pod_security: Level = "baseline"
    reserved_namespaces: frozenset[str] = frozenset()
    allow_exposed_services: bool = False
    allocation: Literal["binpack", "spread"] = "binpack"
    explain_members: int = Field(default=16, ge=0)
    inventory_flush_s: float = Field(default=2.0, gt=0)
    status_interval_s: float = Field(default=2.0, gt=0)
    status_resync_s: float = Field(default=30.0, gt=0)
    default_queue: str = Field(
        default=DEFAULT_QUEUE,
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
    )
    unlisted_namespaces: UnlistedNamespaces = "default-queue"
    default_queue_max_priority: int | None = Field(
        default=None, ge=-MAX_PRIORITY - 1, le=MAX_PRIORITY
    )
    fair_share_half_life_s: float = Field(default=DEFAULT_HALF_LIFE_S, gt=0, le=10 * 365 * 86400)
    queue_order: QueueOrder = "smallest-first"
    queue_oldest_first_s: float = Field(default=57_600.0, ge=0, le=365 * 86400)
    queue_starvation_s: float = Field(default=1800.0, ge=0, le=365 * 86400)
    queue_max_holds: int = Field(default=4, ge=0, le=1000)
    queue_holds_per_shape: int = Field(default=DEFAULT_HOLDS_PER_SHAPE, ge=1, le=64)
    queue_size_aging_s: float = Field(default=DEFAULT_SIZE_AGING_S, ge=0, le=365 * 86400)
    queue_carry_holds: bool = DEFAULT_CARRY_HOLDS
    queue_spare_whole_nodes_s: float = Field(
        default=DEFAULT_SPARE_WHOLE_NODES_S, ge=0, le=365 * 86400
    )
    preemption: bool = True
    preemption_min_runtime_s: float = Field(default=0.0, ge=0)
    preemption_max_per_hour: int = Field(default=3, ge=1)
    preemption_cooldown_s: float = Field(default=600.0, ge=0)
    preemption_max_preemptors: int = Field(default=8, ge=1, le=1000)
    preemption_deadline_s: float = Field(default=2.0, gt=0, le=600)
    suspect_node_cooldown_s: float = Field(default=3600.0, ge=0, le=30 * 86400)
    rerun_backoff_base_s: float = Field(default=60.0, ge=0, le=86400)
    rerun_backoff_max_s: float = Field(default=3600.0, ge=0, le=7 * 86400)
    degraded_node_conditions: tuple[
        Annotated[
            str, Field(min_length=1, max_length=316, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_./]*$")
        ],
        ...,
    ] = Field(default=(), max_length=32)

    @property
    def backfill_rule(self) -> BackfillRule:
        """The pass order and backfill holds of this configuration (placement's model)."""
        return BackfillRule(
            starvation_s=self.queue_starvation_s,
            max_holds=self.queue_max_holds,
            oldest_first_s=self.queue_oldest_first_s,
            order=self.queue_order,
            holds_per_shape=self.queue_holds_per_shape,
            size_aging_s=self.queue_size_aging_s,
            carry_holds=self.queue_carry_holds,
            spare_whole_nodes_s=self.queue_spare_whole_nodes_s,
        )

    @property
    def preemption_rules(self) -> PreemptionRules:
        """The preemption guard rails of this configuration (placement's model)."""
        return PreemptionRules(
            min_runtime_s=self.preemption_min_runtime_s,
            max_per_hour=self.preemption_max_per_hour,
            cooldown_s=self.preemption_cooldown_s,
        )

    @property
    def refused_namespaces(self) -> frozenset[str]:
        """Every hub namespace whose GPUJobs intake refuses."""
        return SYSTEM_NAMESPACES | self.reserved_namespaces | {self.token_namespace}

    @model_validator(mode="after")
    def _check(self) -> HubConfig:
        if not self.etcd_prefix.startswith("/") or not self.etcd_prefix.endswith("/"):
            raise ValueError(f"etcd_prefix: {self.etcd_prefix!r} must start and end with '/'")
        if self.member_lost_s < self.member_lease_s:
            raise ValueError(
                f"member_lost_s ({self.member_lost_s}) must be at least member_lease_s "
                f"({self.member_lease_s})"
            )
        if self.tls is None and not self.insecure:
            raise ValueError("tls: give a certificate and key, or set insecure for plaintext")
        unknown = sorted(self.managed_kinds - set(MANAGED_KINDS))
        if unknown:
            why = "; ".join(f"{k}: {UNMANAGEABLE[k]}" for k in unknown if k in UNMANAGEABLE)
            raise ValueError(
                f"managed_kinds: {', '.join(unknown)} not among {', '.join(MANAGED_KINDS)}"
                + (f" ({why}); submit those wrapped in a GPUJob (gpufed submit)" if why else "")
            )
        return self
