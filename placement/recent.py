"""Recently seen nodes: the node shapes each member reported within a window, so a fleet that
lost a node shape for a while does not make "no member could ever hold the job" final.

``place()`` judges "could ever hold" (``Outcome.REJECTED``) on the nodes that exist now. A node
that is deleted and created again, whose GPUs are withdrawn for a while, or that leaves and
comes back with the rest of its member's nodes would make a job of its shape fail for good
while it is away (found by the chaos soak, issue 26: GB200 jobs while both GB200 trays were
deleted, MIG jobs while the MIG node was). :class:`RecentNodes` remembers each node's last
inventory when it leaves a member or changes shape (the fleet snapshot tells it,
:attr:`gpufed.placement.snapshot.FleetSnapshot.recent`), for :data:`RECENT_WINDOW_S`, at most
:data:`MAX_RECENT_NODES` nodes (the oldest go first); :func:`recent_could_hold` says whether the
members' present nodes together with those remembered could hold a job ``place()`` rejected.
A shape no member reported within the window (the demo's ``06-giant-nvlink``) is still
rejected at once.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from gpufed.api.decision import Outcome
from gpufed.api.inventory import (
    ClusterHealth,
    ClusterInventory,
    MemberClusterState,
    NodeInventory,
)
from gpufed.api.request import PlacementRequest
from gpufed.placement.engine import place
from gpufed.placement.filters import is_condition_taint
from gpufed.placement.policy import Policy
from gpufed.placement.snapshot import FleetSnapshot

#: Seconds a node that left (or changed shape) still counts for "could ever hold".
RECENT_WINDOW_S = 3600.0
#: Most nodes remembered over the whole fleet (the oldest are forgotten first).
MAX_RECENT_NODES = 4096
#: Remembered nodes named in a waiting job's message (the rest are counted).
_SHOWN = 4


def _holds_at_least(new: NodeInventory, old: NodeInventory) -> bool:
    """``new`` offers every allocatable amount ``old`` did, on the same GPU product."""
    return new.gpu_product == old.gpu_product and all(
        new.allocatable.get(r, 0) >= a for r, a in old.allocatable.items()
    )


class RecentNodes:
    """Nodes that left their member or shrank within the window (module docstring).

    ``clock``: seconds (the hub's wall clock, so that saved entries mean the same to the next
    leader; only differences are read);
    ``window_s``: how long a node is remembered; ``max_nodes``: the bound. :attr:`version`
    changes whenever the remembered set does (callers cache on it).
    """

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        window_s: float = RECENT_WINDOW_S,
        max_nodes: int = MAX_RECENT_NODES,
    ) -> None:
        if window_s < 0 or max_nodes < 0:
            raise ValueError(
                f"recent nodes: window {window_s} s and bound {max_nodes} must be >= 0"
            )
        self._clock = clock
        self.window_s = window_s
        self.max_nodes = max_nodes
        self._nodes: OrderedDict[tuple[str, str], tuple[NodeInventory, float]] = OrderedDict()
        self.version = 0

    def __len__(self) -> int:
        return len(self._nodes)

    def left(self, cluster: str, inv: NodeInventory) -> None:
        """Node ``inv`` of ``cluster`` left it, or is replaced by another shape: remember the
        last inventory it had, unless a larger shape of it is remembered already (a node that
        shrank and then changed again, say its taints when it turned Ready, keeps the shape it
        had before it shrank and the time that one left; found by the chaos soak, seed 2: a
        GB200 tray whose GPUs were withdrawn while it was unreachable was remembered without
        GPUs once it was Ready again, and the 2-tray gangs failed for good)."""
        key = (cluster, inv.name)
        got = self._nodes.get(key)
        if got is not None and not _holds_at_least(inv, got[0]):
            return
        self._nodes.pop(key, None)
        self._nodes[key] = (inv, self._clock())
        while len(self._nodes) > self.max_nodes:
            self._nodes.popitem(last=False)
        self.version += 1

    def joined(self, cluster: str, inv: NodeInventory) -> None:
        """Node ``inv`` is in ``cluster`` now: forget what was remembered of it when it offers
        at least as much again."""
        key = (cluster, inv.name)
        got = self._nodes.get(key)
        if got is not None and _holds_at_least(inv, got[0]):
            del self._nodes[key]
            self.version += 1

    def entries(self) -> list[tuple[str, NodeInventory, float]]:
        """(cluster, node, clock time it left), oldest first (to save them)."""
        return [(c, inv, at) for (c, _), (inv, at) in self._nodes.items()]

    def restore(self, entries: Iterable[tuple[str, NodeInventory, float]]) -> None:
        """Take saved :meth:`entries` over (a new leader), oldest first; those past the
        window are dropped when next read."""
        for cluster, inv, at in sorted(entries, key=lambda e: e[2]):
            self._nodes.pop((cluster, inv.name), None)
            self._nodes[(cluster, inv.name)] = (inv, at)
        while len(self._nodes) > self.max_nodes:
            self._nodes.popitem(last=False)
        self.version += 1

    def by_cluster(self) -> dict[str, list[tuple[NodeInventory, float]]]:
        """Cluster -> (node, seconds since it left), within the window (older ones are
        forgotten now)."""
        now = self._clock()
        while self._nodes:
            key, (_, at) = next(iter(self._nodes.items()))
            if now - at <= self.window_s:
                break
            del self._nodes[key]
            self.version += 1
        out: dict[str, list[tuple[NodeInventory, float]]] = {}
        for (cluster, _), (inv, at) in self._nodes.items():
            out.setdefault(cluster, []).append((inv, now - at))
        return out


def _idle(inv: NodeInventory) -> NodeInventory:
    """``inv`` as an idle, healthy node (what "could ever hold" judges): no requests, Ready,
    not cordoned, no degraded GPUs, and none of the node-condition taints
    (``node.kubernetes.io/not-ready``, ``unreachable``, ...) that go when the condition clears."""
    return inv.model_copy(
        update={
            "requested": {},
            "job_requests": {},
            "ready": True,
            "unschedulable": False,
            "degraded": None,
            "taints": tuple(t for t in inv.taints if not is_condition_taint(t)),
        }
    )


def recent_could_hold(
    request: PlacementRequest,
    snapshot: FleetSnapshot,
    recent: RecentNodes,
    policy: Policy,
    now: float,
) -> str | None:
    """Why ``request``, which ``place()`` rejected on the present fleet, is not rejected for
    good: a member's present nodes together with the nodes it had within the window could hold
    it (a waiting message naming them); None when they could not either (or nothing is
    remembered). Only members with remembered nodes are judged again (the others rejected the
    job already); their present and remembered nodes count idle and Ready, without
    node-condition taints. O(their nodes)."""
    remembered = recent.by_cluster()
    members = []
    for c in snapshot.clusters():
        gone = remembered.get(c.name)
        if not gone:
            continue
        # present nodes count idle and healthy too: a tray that is NotReady now (a condition
        # taint) and one whose GPUs are away hold the job together once both are back (found
        # by the chaos soak: one GB200 tray unreachable while the other's GPUs were withdrawn)
        nodes = {name: _idle(n.inv) for name, n in c.nodes.items()}
        for inv, _ in gone:
            now_inv = nodes.get(inv.name)
            if now_inv is None or not _holds_at_least(now_inv, inv):
                nodes[inv.name] = _idle(inv)
        members.append(
            MemberClusterState.model_construct(
                name=c.name,
                labels=dict(c.labels),
                taints=c.taints,
                health=ClusterHealth(ready=True),
                inventory=ClusterInventory.model_construct(
                    cluster=c.name,
                    nodes=tuple(nodes.values()),
                    served_kinds=c.served_kinds,
                    agent_version=c.agent_version,
                ),
            )
        )
    if not members:
        return None
    decision = place(request, FleetSnapshot(members), policy, now)
    if decision.outcome == Outcome.REJECTED:
        return None
    judged = {m.name for m in members}
    names = [
        f"{cluster}/{inv.name} ({ago:.0f} s ago)"
        for cluster, gone in sorted(remembered.items())
        if cluster in judged
        for inv, ago in gone
    ]
    shown = ", ".join(names[:_SHOWN]) + (
        f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    )
    minutes = recent.window_s / 60
    return (
        f"waiting: nodes that left or shrank in the last {minutes:.0f} min could hold it "
        f"when they come back: {shown}"
    )
