"""The simulator's node failures (``gpufed simulate --node-failure-interval-s S``): which node
fails when, what its jobs lose, and whether they run again.

Called by :mod:`.simulate` at each failure and repair event. Failures arrive fleet-wide as a
Poisson process (exponential gaps of mean ``interval_s``, seeded, so a run is reproducible):
each takes one GPU node, chosen uniformly among the nodes up, out of service (NotReady, as the
agent would report it: placement offers nothing there) for ``repair_s`` seconds. Every job with
a pod on it is an **infrastructure failure** (:mod:`gpufed.sync.failure`): it loses the work since
its last checkpoint (its trace ``checkpoint_s``: checkpoints every that many seconds of its
current run; none: everything that run did). With ``retry`` on and retries left
(``max_retries``, the GPUJob's ``spec.placement.retry.onInfrastructureFailure``, default
:data:`~gpufed.api.gpujob.DEFAULT_INFRASTRUCTURE_RETRIES`) it returns to the queue (the hub's
``Restarting``) and resumes from that checkpoint wherever placement puts it next (never on the
failed node while it is down); otherwise it ends failed (``failed_infra``).

Metrics: ``goodput`` = GPU-seconds of work that counted toward a completion (``gpus x
duration_s`` of each job that finished) / GPU-seconds jobs held (every run, lost work included);
``restarts``; ``failed_infra``; ``node_failures``; ``gpu_hours_lost``. Pure: the random stream is
seeded; the snapshot is changed only as the hub would see it (a node NotReady, then Ready).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpufed.api.gpujob import DEFAULT_INFRASTRUCTURE_RETRIES
from gpufed.api.inventory import NodeInventory
from gpufed.api.labels import GPU_RESOURCE
from gpufed.placement.sim.simquota import QueueSim

if TYPE_CHECKING:
    from gpufed.placement.sim.simstate import _Run as Run
    from gpufed.placement.sim.simstate import _Sim as Sim

#: Event kinds in the simulator's heap (after 0 = finish, 1 = arrival).
FAILURE_EVENT = 2
REPAIR_EVENT = 3


def work_kept_s(run_s: float, checkpoint_s: float | None) -> float:
    """Seconds of a run of ``run_s`` seconds that a failure keeps: up to its last checkpoint
    (every ``checkpoint_s`` seconds of the run), nothing without checkpoints."""
    if checkpoint_s is None or checkpoint_s <= 0 or run_s <= 0:
        return 0.0
    return math.floor(run_s / checkpoint_s) * checkpoint_s


@dataclass
class SimFailures:
    """``--node-failure-interval-s``, ``--repair-s``, ``--retry`` of one run, and what it counted.

    Raises ``ValueError`` for an interval or repair time that is not positive and finite, or
    negative retries (naming the flag).
    """

    interval_s: float
    repair_s: float = 3600.0
    retry: bool = True
    max_retries: int = DEFAULT_INFRASTRUCTURE_RETRIES
    seed: int = 0
    node_failures: int = 0
    restarts: int = 0
    failed_infra: int = 0
    gpu_s_lost: float = 0.0
    _rng: random.Random = field(init=False, repr=False)
    _down: dict[str, NodeInventory] = field(init=False, default_factory=dict, repr=False)
    _retries: dict[str, int] = field(init=False, default_factory=dict, repr=False)
    _failed: set[str] = field(init=False, default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if not (0 < self.interval_s < math.inf):
            raise ValueError(f"--node-failure-interval-s: {self.interval_s} is not > 0 and finite")
        if not (0 < self.repair_s < math.inf):
            raise ValueError(f"--repair-s: {self.repair_s} is not > 0 and finite")
        if self.max_retries < 0:
            raise ValueError(f"retries: {self.max_retries} is negative")
        self._rng = random.Random(self.seed)

    def first(self, sim: Sim, t0: float) -> None:
        """Schedule the first failure after ``t0`` (the first arrival)."""
        sim._push(t0 + self._rng.expovariate(1.0 / self.interval_s), FAILURE_EVENT, "")

    def handle(
        self,
        sim: Sim,
        kind: int,
        uid: str,
        now: float,
        pending: dict[str, Run],
        qs: QueueSim | None,
    ) -> None:
        """One failure (``uid`` "") or repair (``uid`` ``cluster/node``) event at ``now``."""
        if kind == REPAIR_EVENT:
            cluster, name = uid.split("/", 1)
            sim.snapshot.upsert_node(cluster, self._down.pop(uid))
            return
        if any(r.end == math.inf or r.end > now for r in sim.runs):  # jobs left: keep failing
            sim._push(now + self._rng.expovariate(1.0 / self.interval_s), FAILURE_EVENT, "")
        up = [
            (c.name, n)
            for c in sim.snapshot.clusters()
            for n in sorted(c.nodes)
            if f"{c.name}/{n}" not in self._down
            and sim.snapshot.node(c.name, n).allocatable.get(GPU_RESOURCE, 0) > 0
        ]
        if not up:
            return
        cluster, name = up[self._rng.randrange(len(up))]
        self.node_failures += 1
        node = sim.snapshot.node(cluster, name)
        self._down[f"{cluster}/{name}"] = node
        sim.snapshot.upsert_node(cluster, node.model_copy(update={"ready": False}))
        sim._push(now + self.repair_s, REPAIR_EVENT, f"{cluster}/{name}")
        for run_uid in sorted(sim.live):
            res = sim.snapshot.reservation(run_uid)
            if res is not None and res.cluster == cluster and name in res.nodes:
                self._kill(sim, sim.live[run_uid], now, pending, qs)

    def _kill(
        self, sim: Sim, run: Run, now: float, pending: dict[str, Run], qs: QueueSim | None
    ) -> None:
        uid = run.request.uid
        sim.live.pop(uid)
        sim.snapshot.release(uid)
        if qs is not None:
            qs.finish(run.request)
        ran = now - run.seg_start
        kept = min(work_kept_s(ran, run.job.checkpoint_s), run.remaining)
        self.gpu_s_lost += (ran - kept) * run.job.gpus
        run.stop(now, "node-failure")
        run.remaining = max(0.0, run.remaining - kept)
        used = self._retries.get(uid, 0)
        if self.retry and used < self.max_retries:
            self._retries[uid] = used + 1
            self.restarts += 1
            run.seg_start = run.end = math.inf
            pending[uid] = run
            if qs is not None:
                qs.arrive(run.request)
            return
        self.failed_infra += 1
        self._failed.add(uid)
        run.seg_start = run.end = now  # ended: failed, final

    def metrics(self, sim: Sim, horizon: float) -> dict[str, object]:
        """The JSON keys this adds."""
        held = sum(r.job.gpus * r.ran(horizon) for r in sim.runs if r.start < math.inf)
        done = sum(
            r.job.gpus * r.job.duration_s
            for r in sim.runs
            if r.request.uid not in self._failed and r.start < math.inf and r.end <= horizon
        )
        return {
            "node_failures": self.node_failures,
            "retry": "on" if self.retry else "off",
            "goodput": round(done / held, 4) if held else 1.0,
            "restarts": self.restarts,
            "failed_infra": self.failed_infra,
            "gpu_hours_lost_failures": round(self.gpu_s_lost / 3600.0, 2),
        }
