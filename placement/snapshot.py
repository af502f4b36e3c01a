"""The fleet as placement sees it: one long-lived, incrementally updated, indexed snapshot.

The hub keeps one :class:`FleetSnapshot`, feeds it every member's inventory (whole states with
:meth:`FleetSnapshot.set_member`, deltas with :meth:`~FleetSnapshot.upsert_node` /
:meth:`~FleetSnapshot.remove_node`, health with :meth:`~FleetSnapshot.set_health`) and the
reservation ledger (:meth:`~FleetSnapshot.reserve`, :meth:`~FleetSnapshot.release`,
:meth:`~FleetSnapshot.expire_reservations`), and hands it to ``place()``, which reads it and
writes only to the separate memo it carries (:attr:`FleetSnapshot.memo`, :mod:`.memo`; the
indexes built on first demand, see :mod:`.index`, are the one exception). The simulator and the
benchmark drive it the same way.

Free capacity seen by placement is ``max(0, allocatable - requested) - reserved`` per node and
resource, clamped at 0, where ``reserved`` is the part of the ledger's entries for that node
that the member has not yet reported as requested by the job's bound pods
(``NodeInventory.job_requests[job_uid]``): a job's GPUs are never deducted twice, and never
seen free twice.

The parts, one module each:

* :mod:`.member`: one member (:class:`~gpufed.placement.member.ClusterState`): metadata,
  health, nodes, and the filing of each node into its pool and groups;
* :mod:`.index`: the per-pool indexes (nodes and groups by free GPUs, the NVLink slot index);
* :mod:`.ledger`: the reservation ledger (what was placed but not yet reported bound);
* :mod:`.memo`: what ``place()`` remembers between decisions (not snapshot state).

This module ties them together: every change goes through a verb here, which updates the
ledger, then the member's indexes, and bumps :attr:`FleetSnapshot.generation` on structural
changes (a member, its health or metadata, a pool appearing or going), which invalidates the
memo's fleet-level results.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from sortedcontainers import SortedDict

from gpufed.api.decision import Decision, Reservation
from gpufed.api.inventory import (
    ClusterHealth,
    ClusterInventory,
    GPUSummary,
    MemberClusterState,
    NodeInventory,
    Taint,
)
from gpufed.api.labels import GPU_RESOURCE
from gpufed.api.resources import ResourceList
from gpufed.placement.index import NodeState
from gpufed.placement.ledger import Ledger
from gpufed.placement.member import ClusterState
from gpufed.placement.memo import PlacementMemo

if TYPE_CHECKING:
    from gpufed.placement.recent import RecentNodes


class FleetSnapshot:
    """The indexed fleet state that ``place()`` reads (see the module docstring).

    Not thread-safe: the hub's scheduling loop owns it. ``place()`` reads it and writes only
    to :attr:`memo`, a separate object whose contents change no answer.
    """

    def __init__(
        self,
        members: Iterable[MemberClusterState] = (),
        *,
        reservations: Iterable[Reservation] = (),
    ) -> None:
        self._clusters: SortedDict[str, ClusterState] = SortedDict()
        #: bumped on every change that can alter cluster-level filter results
        self.generation = 0
        #: what place() remembers about this snapshot; not snapshot state (see :mod:`.memo`)
        self.memo = PlacementMemo()
        #: told of every node that leaves a member or changes shape, and of every node that
        #: joins (:mod:`.recent`: "could ever hold" judged on recent shapes too); None: off
        self.recent: RecentNodes | None = None
        self._ledger = Ledger()
        for res in reservations:
            self.add_reservation(res)
        for state in members:
            self.set_member(state)

    # --- reading ----------------------------------------------------------------------------
    @property
    def cluster_names(self) -> list[str]:
        """Member names, sorted."""
        return list(self._clusters.keys())

    def clusters(self) -> list[ClusterState]:
        """Members in name order (placement's internal view)."""
        return list(self._clusters.values())

    def cluster(self, name: str) -> ClusterState:
        """One member's internal view; ``KeyError`` naming the member when unknown."""
        try:
            return self._clusters[name]
        except KeyError:
            raise KeyError(f"member cluster {name!r} is not in the snapshot") from None

    def node(self, cluster: str, name: str) -> NodeInventory:
        """The last inventory of one node."""
        return self.cluster(cluster).nodes[name].inv

    def free(self, cluster: str, node: str, resource: str = GPU_RESOURCE) -> int:
        """Free amount of ``resource`` on one node as placement sees it (after reservations)."""
        return self.cluster(cluster).nodes[node].free(resource)

    def member(self, name: str) -> MemberClusterState:
        """Rebuild the :class:`MemberClusterState` of one member from what the snapshot holds."""
        c = self.cluster(name)
        return MemberClusterState(
            name=c.name,
            labels=dict(c.labels),
            taints=c.taints,
            health=c.health,
            inventory=ClusterInventory(
                cluster=c.name,
                nodes=tuple(c.nodes[n].inv for n in c.names),
                served_kinds=c.served_kinds,
                agent_version=c.agent_version,
            ),
        )

    def summary(self, cluster: str) -> GPUSummary:
        """Whole-GPU summary of one member as placement sees it (free after reservations).

        Same rules as :func:`gpufed.api.inventory.summarize` (Ready, schedulable nodes, taints
        ignored, MIG slices excluded), read from the indexes.
        """
        c = self.cluster(cluster)
        total: dict[str, int] = {}
        free: dict[str, int] = {}
        blocks: dict[str, int] = {}
        product_blocks: dict[tuple[str, str], int] = {}
        by_product: dict[str, int] = {}
        best = 0
        for pool in c.pools.values():
            if pool.slices:
                continue
            product = pool.product
            total[product] = total.get(product, 0) + pool.cap
            free[product] = free.get(product, 0) + pool.free
            best = max(best, pool.max_free)
            by_product[product] = max(by_product.get(product, 0), pool.max_free)
            for key, g in pool.groups["nvlink"].items():
                blocks[key] = blocks.get(key, 0) + g.free
                product_blocks[key, product] = product_blocks.get((key, product), 0) + g.free
        best = max(best, max(blocks.values(), default=0))
        for (_, product), n in product_blocks.items():
            by_product[product] = max(by_product[product], n)
        return GPUSummary(
            gpus_total=total,
            gpus_free=free,
            largest_free_nvlink_block=best,
            largest_free_nvlink_block_by_product=by_product,
        )

    # --- members ----------------------------------------------------------------------------
    def set_member(self, state: MemberClusterState) -> None:
        """Add or replace one member's whole state (metadata, health, inventory).

        Raises ``ValueError`` (and keeps the member's previous state) when the inventory names
        another cluster or lists a node twice.
        """
        if state.inventory.cluster != state.name:
            raise ValueError(
                f"inventory.cluster {state.inventory.cluster!r} does not match member name "
                f"{state.name!r}"
            )
        seen: set[str] = set()
        for inv in state.inventory.nodes:
            if inv.name in seen:
                raise ValueError(f"member {state.name!r}: node {inv.name!r} appears twice")
            seen.add(inv.name)
        old = self._clusters.get(state.name)
        if old is not None:
            self._drop_cluster(old)
        c = ClusterState(state.name)
        c.labels = dict(state.labels)
        c.taints = state.taints
        c.health = state.health
        c.served_kinds = state.inventory.served_kinds
        c.agent_version = state.inventory.agent_version
        self._clusters[state.name] = c
        self._bulk_add(c, state.inventory.nodes)
        self.generation += 1

    def remove_member(self, name: str) -> None:
        """Forget a member (its reservations stay in the ledger until released or expired)."""
        c = self._clusters.pop(name, None)
        if c is not None:
            self._drop_cluster(c)
            self.generation += 1

    def set_health(self, cluster: str, health: ClusterHealth) -> None:
        """Change a member's health (a NotReady member is filtered out by ``Health``)."""
        c = self.cluster(cluster)
        if c.health != health:
            c.health = health
            self.generation += 1

    def set_metadata(
        self,
        cluster: str,
        *,
        labels: dict[str, str] | None = None,
        taints: tuple[Taint, ...] | None = None,
        served_kinds: frozenset[str] | None = None,
    ) -> None:
        """Change a member's labels, member-level taints or served workload kinds. The fleet
        generation (and with it every fleet-level memo entry) moves only when one of them
        changed: the hub calls this on every MemberCluster watch event (its own status writes
        included) and every full inventory snapshot."""
        c = self.cluster(cluster)
        changed = False
        if labels is not None and labels != c.labels:
            c.labels = dict(labels)
            changed = True
        if taints is not None and taints != c.taints:
            c.taints = taints
            changed = True
        if served_kinds is not None and served_kinds != c.served_kinds:
            c.served_kinds = served_kinds
            changed = True
        if changed:
            self.generation += 1

    # --- nodes ------------------------------------------------------------------------------
    def upsert_node(self, cluster: str, node: NodeInventory) -> None:
        """Add or replace one node of a member (an inventory delta)."""
        c = self.cluster(cluster)
        old = c.nodes.get(node.name)
        if old is not None and old.same_shape(node):
            self._update_in_place(c, old, node)
            return
        if old is not None:
            self._remove_node(c, old)
        self._add_node(c, node)

    def upsert_nodes(self, cluster: str, nodes: Iterable[NodeInventory]) -> None:
        """:meth:`upsert_node` for each of ``nodes``, in order, in the same resulting state;
        runs of nodes new to the member are filed together (a member's first inventory costs
        less per node). Raises ``KeyError`` naming an unknown member."""
        c = self.cluster(cluster)
        batch = list(nodes)
        names = {inv.name for inv in batch}
        if len(names) == len(batch) and c.nodes.keys().isdisjoint(names):
            self._add_nodes(c, batch)  # all new: a member's first inventory
            return
        fresh: list[NodeInventory] = []
        names = set()
        for inv in batch:
            if inv.name in c.nodes or inv.name in names:
                self._add_nodes(c, fresh)
                fresh, names = [], set()
                self.upsert_node(cluster, inv)
            else:
                fresh.append(inv)
                names.add(inv.name)
        self._add_nodes(c, fresh)

    def remove_node(self, cluster: str, name: str) -> None:
        """Remove one node of a member (no error when it is not there)."""
        c = self.cluster(cluster)
        old = c.nodes.get(name)
        if old is not None:
            self._remove_node(c, old)

    # --- reservation ledger -------------------------------------------------------------------
    def reserve(self, decision: Decision, now: float, ttl_s: float = 600.0) -> Reservation:
        """Record a ``Placed`` decision: its resources are deducted at once.

        Returns the ledger entry (persist it; reload with :meth:`add_reservation`). Raises
        ``ValueError`` for a decision that is not ``Placed``. Reserving a job again replaces
        its previous entry.
        """
        res = Reservation.from_decision(decision, now=now, ttl_s=ttl_s)
        self.add_reservation(res)
        return res

    def add_reservation(self, res: Reservation) -> None:
        """Load one ledger entry (after a hub restart, or from :meth:`reserve`)."""
        if res.job_uid in self._ledger:
            self.release(res.job_uid)
        self._ledger.add(res)
        self._refresh_nodes(res.cluster, res.nodes)

    def release(self, job_uid: str) -> Reservation | None:
        """Drop a job's entry (pods bound and reported, job deleted, or entry expired)."""
        res = self._ledger.pop(job_uid)
        if res is None:
            return None
        self._refresh_nodes(res.cluster, res.nodes)
        return res

    def expire_reservations(self, now: float) -> list[Reservation]:
        """Drop and return every entry whose ``created_at + ttl_s <= now``."""
        due = self._ledger.due(now)
        for res in due:
            self.release(res.job_uid)
        return due

    def settled_reservations(self) -> list[Reservation]:
        """Entries whose pods the member already reports in full (safe to release)."""
        return self._ledger.settled()

    def reservation(self, job_uid: str) -> Reservation | None:
        """One job's ledger entry, or None (O(1))."""
        return self._ledger.get(job_uid)

    def reservations(self) -> list[Reservation]:
        """Every ledger entry, by job UID."""
        return self._ledger.all()

    def outstanding(self, cluster: str, node: str) -> ResourceList:
        """What the ledger still deducts on one node (reserved and not yet reported bound)."""
        n = self.cluster(cluster).nodes.get(node)
        return dict(n.reserved) if n is not None and n.reserved else {}

    def verify_indexes(self) -> list[str]:
        """Recompute every index from the nodes and list where they disagree (empty = sound).

        O(nodes); for tests and debugging, never on the hot path.
        """
        problems: list[str] = []
        for c in self._clusters.values():
            problems += c.problems(self._ledger)
        return problems

    # --- internals ------------------------------------------------------------------------------
    def _refresh_nodes(self, cluster: str, names: Iterable[str]) -> None:
        c = self._clusters.get(cluster)
        if c is None:
            return
        for name in names:
            n = c.nodes.get(name)
            if n is not None:
                c.set_reserved(n, self._ledger.outstanding(cluster, n.inv))

    def _resettle(self, cluster: str, uids: Iterable[str]) -> None:
        for res in self._ledger.resettle(cluster, uids):
            self._refresh_nodes(cluster, res.nodes)

    def _update_in_place(self, c: ClusterState, node: NodeState, inv: NodeInventory) -> None:
        """Only requested/job_requests changed: move the node's free GPUs (hot path)."""
        changed = self._ledger.seen_add(c.name, node.inv, -1)
        node.inv = inv
        changed |= self._ledger.seen_add(c.name, inv, +1)
        if changed:
            self._resettle(c.name, changed)
        c.set_reserved(node, self._ledger.outstanding(c.name, inv))

    def _add_node(self, c: ClusterState, inv: NodeInventory) -> None:
        if not c.nodes:
            self.generation += 1
        changed = self._ledger.seen_add(c.name, inv, +1)
        if changed:
            self._resettle(c.name, changed)
        if c.add_node(inv, self._ledger):
            self.generation += 1
        if self.recent is not None and len(self.recent):
            self.recent.joined(c.name, inv)

    def _add_nodes(self, c: ClusterState, invs: list[NodeInventory]) -> None:
        """:meth:`_add_node` for nodes new to ``c``, none listed twice."""
        if not invs:
            return
        if not c.nodes:
            self.generation += 1
        changed: set[str] = set()
        for inv in invs:
            changed |= self._ledger.seen_add(c.name, inv, +1)
        if changed:
            self._resettle(c.name, changed)
        if c.add_nodes(invs, self._ledger):
            self.generation += 1
        if self.recent is not None and len(self.recent):
            for inv in invs:
                self.recent.joined(c.name, inv)

    def _remove_node(self, c: ClusterState, n: NodeState) -> None:
        if self.recent is not None:
            self.recent.left(c.name, n.inv)
        changed = self._ledger.seen_add(c.name, n.inv, -1)
        dropped = c.remove_node(n)
        if dropped is not None:
            self.memo.forget(dropped)
            self.generation += 1
        if not c.nodes:
            self.generation += 1
        if changed:
            self._resettle(c.name, changed)

    def _bulk_add(self, c: ClusterState, nodes: Iterable[NodeInventory]) -> None:
        nodes = tuple(nodes)
        changed: set[str] = set()
        for inv in nodes:
            changed |= self._ledger.seen_add(c.name, inv, +1)
        c.bulk_add(nodes, self._ledger)
        if self.recent is not None and len(self.recent):
            for inv in nodes:
                self.recent.joined(c.name, inv)
        if changed:
            self._resettle(c.name, changed)

    def _drop_cluster(self, c: ClusterState) -> None:
        self._ledger.forget_cluster(c.name, (n.inv for n in c.nodes.values()))
        for pool in c.pools.values():
            self.memo.forget(pool)
