"""Where the idle GPU time goes: ``gpufed simulate --per-class``'s idle GPU-hours by reason.

Utilisation (:class:`~.simstate.SimResult` ``gpu_utilization``) says how much of the fleet ran
jobs between the first and the last arrival; this says why the rest stood idle. After every
batch of simultaneous events, once the policy has started what it starts, each free GPU of the
fleet gets one reason, and keeps it until the next batch:

* ``no-job-waiting``: no job waits (nothing could have used it);
* ``held``: its node is held for a starving job this pass (policy ``gpufed``; a hold of a whole
  member holds every node of it);
* ``fragment``: jobs wait, but every waiting job's pods need more GPUs than its node has free
  (idle by fragmentation: the job mix did not fit what is left);
* ``kept-off``: a waiting job has pods no bigger than the node's free GPUs, yet did not start
  there: its GPU product, its topology (a gang that needs several nodes or one NVLink domain),
  its quota, or the policy's order kept it off;
* ``down``: its node offers nothing (failed, with ``--node-failure-interval-s``): all its GPUs.

Each reason's GPU-hours are also split by pool (``member/GPU product``). The shares add up to
``1 - gpu_utilization`` up to float rounding, an identity the tests check against the records.

Called by the policy loops (:mod:`.simulate`, :mod:`.simfirstadmit`, :mod:`.simbaselines`) through
:meth:`~.simstate._Sim.observe_idle`; pure, reads the snapshot only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from gpufed.placement.queue import Hold
    from gpufed.placement.sim.simstate import _Run
    from gpufed.placement.snapshot import FleetSnapshot

#: the reasons, in report order
IDLE_REASONS: Final = ("no-job-waiting", "held", "fragment", "kept-off", "down")


class IdleMeter:
    """Idle GPU-seconds by reason and pool over ``[t0, t1]`` (simulated seconds: the first
    and the last arrival)."""

    def __init__(self, t0: float, t1: float | None) -> None:
        self.t0 = t0
        #: None: the window's end is known only at the end (all jobs arrive at once: the
        #: utilisation's window then runs to the last job's end); :meth:`report` sets it
        self.t1 = t1
        #: (reason, pool) -> idle GPU-seconds inside the window
        self.seconds: dict[tuple[str, str], float] = {}
        self._since = t0
        self._now: dict[tuple[str, str], int] = {}  # (reason, pool) -> free GPUs since _since

    def observe(
        self,
        now: float,
        snapshot: FleetSnapshot,
        waiting: Iterable[_Run],
        holds: Mapping[str, Hold] | None = None,
    ) -> None:
        """The fleet after the batch at ``now``: ``waiting``, the jobs still waiting; ``holds``,
        member -> the nodes held for starving jobs (empty ``nodes``: the whole member)."""
        self._close(now)
        smallest = min((r.job.gpus_per_pod for r in waiting), default=None)
        free: dict[tuple[str, str], int] = {}
        for c in snapshot.clusters():
            hold = holds.get(c.name) if holds else None
            for pool in c.pools.values():
                if pool.slices:
                    continue
                where = f"{c.name}/{pool.product}"
                for node in pool.nodes.values():
                    f = node.gpu_free if node.offers else node.gpu_alloc
                    if f <= 0:
                        continue
                    if not node.offers:
                        why = "down"
                    elif smallest is None:
                        why = "no-job-waiting"
                    elif hold is not None and (not hold.nodes or node.name in hold.nodes):
                        why = "held"
                    elif f < smallest:
                        why = "fragment"
                    else:
                        why = "kept-off"
                    free[(why, where)] = free.get((why, where), 0) + f
        self._now = free
        self._since = now

    def _close(self, now: float) -> None:
        lo, hi = max(self._since, self.t0), now if self.t1 is None else min(now, self.t1)
        if hi > lo:
            for key, gpus in self._now.items():
                self.seconds[key] = self.seconds.get(key, 0.0) + gpus * (hi - lo)

    def report(self, fleet_gpus: int, end: float) -> dict[str, Any]:
        """The JSON object: reason -> ``{share, gpu_hours, pools: {pool: gpu_hours}}``, every
        reason present (share: of the fleet's GPU-hours in the window; ``fleet_gpus``: whole
        GPUs of the fleet; ``end``: the utilisation window's end, used when ``t1`` is None).
        Closes the last interval."""
        if self.t1 is None:
            self.t1 = end
        self._close(self.t1)
        self._since = max(self._since, self.t1)
        window = fleet_gpus * max(self.t1 - self.t0, 1e-9)
        out: dict[str, Any] = {}
        for why in IDLE_REASONS:
            pools = {p: s for (w, p), s in sorted(self.seconds.items()) if w == why}
            total = sum(pools.values())
            out[why] = {
                "share": round(total / window, 4) if fleet_gpus else 0.0,
                "gpu_hours": round(total / 3600.0, 1),
                "pools": {p: round(s / 3600.0, 1) for p, s in pools.items()},
            }
        return out
