"""The simulator's ``first-admit`` baseline (``gpufed simulate --policy first-admit``): what
MultiKueue with worker-side topology-aware scheduling does.

Called by :func:`~gpufed.placement.sim.simulate.simulate` only. The rules (docs/placement.md,
"Simulator"):

* one global queue in arrival order (the trace's submit time, then its row order);
* best effort: after every batch of simultaneous events the queue is walked in that order and
  every job that can start now starts; a job that fits nowhere now is skipped and later ones
  may start (no holds, no reservations for big jobs);
* each job goes to the first member, in the fleet file's order, whose own topology-aware
  placement can place it now: gpufed's ``place()`` restricted to that one member
  (:class:`~gpufed.placement.whatif.OnlyMember`), the member's nodes chosen as ``place()``
  chooses them;
* a job no member could ever hold (``place()`` over the whole fleet says ``Rejected``) is never
  started (``unstarted``), as under every policy.

Pure: reads and changes only the simulator's snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from gpufed.api.decision import Outcome
from gpufed.placement.engine import place
from gpufed.placement.policy import Policy
from gpufed.placement.whatif import OnlyMember

if TYPE_CHECKING:
    from gpufed.placement.sim.simstate import _Run as Run
    from gpufed.placement.sim.simstate import _Sim as Sim


def run_first_admit(
    sim: Sim,
    events: Iterable[tuple[float, list[str], list[str], list[tuple[int, str]]]],
    policy: Policy,
    order: Sequence[str],
) -> None:
    """Replay ``events`` (now, finished uids, arrived uids, node events: none without node
    failures, which only the gpufed policy models) under the rules above; ``order``:
    member names in the fleet file's order."""
    snapshot = sim.snapshot
    names = snapshot.cluster_names
    only = [(m, OnlyMember(m, names)) for m in order]
    pending: dict[str, Run] = {}  # arrival order: events arrive in (time, row) order
    for now, finished, arrived, _ in events:
        for uid in finished:
            sim.live.pop(uid, None)
            snapshot.release(uid)
        for uid in arrived:
            pending[uid] = sim.by_uid[uid]
        # a job shape that fitted no member stays unfit for the rest of the pass: starts only
        # take GPUs away
        unfit: set[Any] = set()
        for uid, run in list(pending.items()):
            if run.key in unfit:
                continue
            req = run.request
            # the whole fleet first (memoised, cheap): where it fits nowhere, no member can
            anywhere = place(req, snapshot, policy, now).outcome
            if anywhere == Outcome.REJECTED:
                del pending[uid]  # no member could ever hold it: never started
                continue
            if anywhere != Outcome.PLACED:
                unfit.add(run.key)
                continue
            for member, hold in only:
                d = place(req, snapshot, policy, now, hold=hold)
                if d.outcome == Outcome.PLACED and d.cluster == member:
                    sim.start(run, d, now)
                    del pending[uid]
                    break
            else:
                unfit.add(run.key)
        sim.observe_idle(now, pending.values())
