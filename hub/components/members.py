"""Members: MemberClusters on the hub, their agents' identity and join tokens, their inventory,
health (lease, lost) and the jobs of a lost member.

- **Registry**: MemberCluster watch events set labels and taints in the fleet snapshot and
  tell :mod:`gpufed.hub.components.tokens` which join-token Secret each member uses; a deleted
  MemberCluster closes its stream and leaves placement. The member's Kubernetes identity
  (kube-system Namespace UID) binds at its first join, and a stream from an agent that talks
  to another cluster is refused.
- **Inventory**: a complete snapshot replaces the member's nodes, a delta patches them; the
  fleet snapshot follows at once (a snapshot in steps, the event loop free between two), etcd
  at the next flush (or before a settled reservation is
  dropped, see :mod:`gpufed.hub.components.reservations`).
- **Health** from the hub's own receive times (pure rules in :mod:`gpufed.hub.rules.health`):
  NotReady members are left out of placement; after the member-lost timeout their jobs become
  Lost or, with ``reschedule: OnClusterLoss``, are placed again while the old copy is fenced
  (docs/design.md §7 item 5).

The MemberCluster status the hub writes is computed in :mod:`gpufed.hub.components.member_status`.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import structlog
from pydantic import ValidationError

from gpufed.api.inventory import (
    ClusterHealth,
    ClusterInventory,
    MemberClusterState,
    NodeInventory,
    Taint,
)
from gpufed.api.membercluster import MemberCluster, SuspectNode
from gpufed.api.stream import AgentHello, Heartbeat, InventoryDelta, InventorySnapshot
from gpufed.hub.adapters.sessions import StreamClosedError
from gpufed.hub.components.dispatch import Dispatch
from gpufed.hub.components.lifecycle import Lifecycle
from gpufed.hub.components.member_status import GPUTally, drift, health_of, member_status
from gpufed.hub.components.mirror import Mirror
from gpufed.hub.components.reservations import Reservations
from gpufed.hub.components.term import MemberState, Term
from gpufed.hub.components.tokens import JoinTokens
from gpufed.hub.rules import status as st
from gpufed.hub.rules.health import MemberHealth, health_at, silence
from gpufed.hub.rules.records import MemberMeta
from gpufed.placement import FleetSnapshot

log = structlog.get_logger("gpufed.hub.components.members")

#: Nodes of a snapshot diffed or applied to the fleet snapshot between two turns of the event
#: loop (under 1 ms on a quiet machine: the whole apply costs about 9 µs a new node,
#: scripts/bench_hub.py --apply).
SNAPSHOT_STEP_NODES = 64
#: How often the kept GPU summaries are checked against a full recount (seconds).
RECOUNT_INTERVAL_S = 60.0
#: Nodes one tick's share of the recount reads at most (whole members; at least one member):
#: the recount of 100 members x 5,000 nodes in one turn held the event loop ~0.4 s (0.85 µs a
#: node), now ~17 ms a tick, the round done in ~13 s of 0.5 s ticks.
RECOUNT_NODES_PER_TICK = 20_000

_T = TypeVar("_T")


def _chunks(items: Sequence[_T]) -> Iterator[Sequence[_T]]:
    for i in range(0, len(items), SNAPSHOT_STEP_NODES):
        yield items[i : i + SNAPSHOT_STEP_NODES]


class Members:
    """Member registry, inventory and health of one leader term (module docstring)."""

    def __init__(
        self,
        term: Term,
        snapshot: FleetSnapshot,
        reservations: Reservations,
        dispatch: Dispatch,
        lifecycle: Lifecycle,
        mirror: Mirror,
        tokens: JoinTokens,
    ) -> None:
        self._lifecycle = lifecycle
        self._suspects = lifecycle.suspects
        #: each member's GPU summary, kept node by node (member_status.GPUTally)
        self._tallies: dict[str, GPUTally] = {}
        self._recounted = term.mono()
        #: the members the recount round in progress has still to check, in order
        self._recount_left: list[str] = []
        term.metrics.incremental_drift.labels("member_gpus")  # exported from 0
        #: one member's snapshot applied at a time, first come first served (take_snapshot)
        self._ingest = asyncio.Lock()
        self._term = term
        self._tokens = tokens
        self._snapshot = snapshot
        self._reservations = reservations
        self._dispatch = dispatch
        self._mirror = mirror

    def restore(self, meta: dict[str, MemberMeta], nodes: dict[str, dict[str, Any]]) -> None:
        """Load the previous leader's member facts and inventories."""
        for name in set(meta) | set(nodes):
            m = self._term.state.member(name)
            m.meta = meta.get(name, MemberMeta())
            m.nodes = dict(nodes.get(name, {}))
            self._tallies[name] = GPUTally(m.nodes.values())
            if m.lost:
                m.health = "Lost"

    # --- MemberClusters ----------------------------------------------------------------------------

    def on_event(self, type_: str, obj: dict[str, Any]) -> None:
        """A MemberCluster watch event (ADDED, MODIFIED, DELETED). Only a change of what the hub
        reads (spec: labels, taints, joinTokenRef; metadata.uid; a member new to placement)
        marks its status due and asks for a scheduling cycle; an event that moved only the
        status (the echo of the hub's own status write) does neither."""
        name = str(obj.get("metadata", {}).get("name", ""))
        if type_ == "DELETED":
            self.gone(name)
            return
        try:
            mc = MemberCluster.model_validate(obj)
        except ValidationError as exc:
            log.warning("hub.member.invalid", cluster=name, error=str(exc.errors()[0]))
            return
        m = self._term.state.member(name)
        seen = (m.spec, m.uid)
        m.spec = mc.spec
        m.uid = mc.metadata.uid or ""
        self._tokens.member_changed(m)
        if mc.status is not None:
            m.conditions_seen = list(mc.status.conditions)
        self._mirror.member_seen(name, mc.status)
        labels = dict(mc.spec.labels)
        taints = tuple(Taint(key=t.key, value=t.value, effect=t.effect) for t in mc.spec.taints)
        if name not in self._snapshot.cluster_names:
            self._snapshot.set_member(self._member_state(m))
        elif seen == (mc.spec, m.uid):
            # Only the status moved: the echo of our own status write (every member, every
            # status interval), or someone else's, which the status resync corrects
            # (Mirror.resync_members). Nothing placement or the status reads changed.
            return
        else:
            self._snapshot.set_metadata(name, labels=labels, taints=taints)
        self._term.state.kick()

    def listed(self, names: set[str]) -> None:
        """After a (re)list: members we knew that are gone were deleted while unwatched (also
        those known only from etcd, whose MemberCluster was deleted while no hub ran)."""
        for m in list(self._term.state.members.values()):
            if m.name not in names and (m.spec is not None or self._has_work(m.name)):
                self.gone(m.name)

    def gone(self, name: str) -> None:
        """The MemberCluster was deleted: close its stream, leave placement."""
        m = self._term.state.members.get(name)
        if m is None:
            return
        m.spec = None
        if m.meta.cluster_uid:
            # A re-joined member may live in another (rebuilt) Kubernetes cluster.
            m.meta = m.meta.model_copy(update={"cluster_uid": ""})
            m.meta_dirty = True
        if m.session is not None:
            m.session.close("PERMISSION_DENIED", f"MemberCluster {name} was deleted on the hub")
        self._tokens.member_gone(name)
        if name in self._snapshot.cluster_names:
            self._snapshot.remove_member(name)
        self._mirror.forget_member(name)
        self._term.metrics.forget_member(name)
        log.info("hub.member.removed", cluster=name)
        if not m.lost and self._has_work(name):
            # Its jobs follow the member-lost policy now, and deleting them completes (the
            # finalizer of a job on a lost member is dropped without waiting for an ack).
            self._set_health(m, "Lost")
            self._term.spawn(self._declare_lost(m))

    def _has_work(self, cluster: str) -> bool:
        return any(c == cluster for c, _ in self._term.state.work)

    def _member_state(
        self, m: MemberState, *, nodes: tuple[NodeInventory, ...] | None = None
    ) -> MemberClusterState:
        """The member as placement sees it; ``nodes``: instead of its inventory."""
        spec = m.spec
        return MemberClusterState(
            name=m.name,
            labels=dict(spec.labels) if spec else {},
            taints=tuple(Taint(key=t.key, value=t.value, effect=t.effect) for t in spec.taints)
            if spec
            else (),
            health=self._health(m),
            inventory=ClusterInventory(
                cluster=m.name,
                nodes=tuple(m.nodes[n] for n in sorted(m.nodes)) if nodes is None else nodes,
                served_kinds=frozenset(m.meta.served_kinds),
                agent_version=m.meta.agent_version,
            ),
        )

    def _health(self, m: MemberState) -> ClusterHealth:
        return health_of(m, self._term.config)

    # --- agents ----------------------------------------------------------------------------------

    def admit(self, hello: AgentHello) -> MemberState:
        """Check a new stream's Kubernetes identity against the member's and close the stream
        it replaces. Raises :class:`StreamClosedError` (PERMISSION_DENIED) for an agent that
        talks to another Kubernetes cluster than the one the member joined from."""
        cluster = hello.cluster
        m = self._term.state.member(cluster)
        uid = hello.cluster_uid
        if uid and m.meta.cluster_uid and uid != m.meta.cluster_uid:
            # A valid token in an agent pointed at the wrong cluster (kubeconfig, context):
            # it would report that cluster's nodes as this member's, find this member's jobs
            # missing and delete the other cluster's gpufed objects as orphans.
            log.warning(
                "agent.refused",
                cluster=cluster,
                reason="another Kubernetes cluster",
                joined_uid=m.meta.cluster_uid,
                agent_uid=uid,
            )
            raise StreamClosedError(
                "PERMISSION_DENIED",
                f"member {cluster} joined from the Kubernetes cluster whose kube-system "
                f"Namespace UID is {m.meta.cluster_uid}; this agent talks to {uid}: check its "
                "--kubeconfig/--context (to move the member to a rebuilt cluster, delete and "
                "re-join its MemberCluster)",
            )
        if uid and not m.meta.cluster_uid:
            m.meta = m.meta.model_copy(update={"cluster_uid": uid})
            self._term.spawn(
                self._term.persist_meta(m)
            )  # the identity binds from now on, crash or not
        if m.session is not None:
            m.session.close("ABORTED", "replaced by a newer stream from the same member")
        m.held = {h.job_uid: h for h in hello.held_jobs}
        return m

    def note_agent_version(self, m: MemberState, version: str) -> None:
        """Record the connected agent's version (written at the next flush)."""
        if m.meta.agent_version != version:
            m.meta = m.meta.model_copy(update={"agent_version": version})
            m.meta_dirty = True

    def heard(self, m: MemberState) -> None:
        """The member's agent sent a message now: it is Ready (and no longer lost)."""
        m.last_heard = self._term.mono()
        m.last_heard_wall = self._term.wall()
        if m.lost:  # before the health change, whose status write must not show lostTime
            m.meta = m.meta.model_copy(update={"lost_at": None})
            # Written through, not left to the next flush: a hub that crashed within that
            # flush would start again believing the member lost.
            self._term.spawn(self._term.persist_meta(m))
            log.info("member.returned", cluster=m.name)
        if m.health != "Ready":
            self._set_health(m, "Ready")

    def on_heartbeat(self, m: MemberState, hb: Heartbeat) -> None:
        """A heartbeat: the member turns NotReady while its agent reports that it cannot reach
        the member's API server, and Ready again when it can."""
        if hb.member_api_error == m.member_api_error:
            return
        was, m.member_api_error = m.member_api_error, hb.member_api_error
        if m.name in self._snapshot.cluster_names:
            self._snapshot.set_health(m.name, self._health(m))
        self.write_status(m)
        if m.member_api_error:
            log.warning("member.api_unreachable", cluster=m.name, error=m.member_api_error)
            self._mirror.member_event(m, "Warning", "NotReady", m.member_api_error)
        else:
            log.info("member.api_reachable", cluster=m.name, was=was)
            self._mirror.member_event(m, "Normal", "Ready", "its agent reaches its API server")
            self._term.state.kick()
            self._dispatch.pump(m.name)

    # --- inventory -------------------------------------------------------------------------------

    async def take_snapshot(self, m: MemberState, snap: InventorySnapshot) -> None:
        """A complete inventory snapshot replaces the member's nodes, applied in steps of
        :data:`SNAPSHOT_STEP_NODES` nodes with the event loop free between two steps (a
        15,000-node member would otherwise hold it for about a second). Snapshots of one member
        are applied one at a time, in order (a newer stream's waits for the older's), and the
        fleet's snapshots one member at a time, in the order they arrived (a FIFO lock): when
        many members join at once, each is placeable after its own apply instead of all of
        them after every one's, interleaved."""
        async with m.snapshot_lock, self._ingest:
            for _ in self._snapshot_steps(m, snap):
                await asyncio.sleep(0)

    def on_snapshot(self, m: MemberState, snap: InventorySnapshot) -> None:
        """:meth:`take_snapshot` in one go (no loop: restores and tests)."""
        for _ in self._snapshot_steps(m, snap):
            pass

    def _snapshot_steps(self, m: MemberState, snap: InventorySnapshot) -> Iterator[None]:
        """Apply ``snap`` to ``m``, yielding after every :data:`SNAPSHOT_STEP_NODES` nodes.

        While it runs, the fleet snapshot shows the member part-way (new nodes missing, old
        ones removed first): placement then sees less than there is, never more."""
        # 1. Diff against the last good inventory (nothing changes yet).
        nodes = list(snap.nodes)
        new = {n.name: n for n in nodes}
        changed: list[NodeInventory] = []
        for chunk in _chunks(nodes):
            changed += [n for n in chunk if m.nodes.get(n.name) != n]
            yield
        # 2. Memory follows, at once (etcd at the next flush).
        removed = set(m.nodes) - set(new)
        tally = self.tally(m)  # built from the old nodes the first time, then patched
        m.nodes = new
        for name in removed:
            tally.remove(name)
        for n in changed:
            tally.set(n)
        m.dirty_nodes |= {n.name for n in changed}
        m.dirty_nodes -= removed
        m.removed_nodes |= removed
        served = tuple(sorted(set(snap.served_kinds))) or m.meta.served_kinds
        if served != m.meta.served_kinds:
            m.meta = m.meta.model_copy(update={"served_kinds": served})
            m.meta_dirty = True
        log.info("agent.inventory.snapshot", cluster=m.name, seq=snap.seq, nodes=len(nodes))
        if m.spec is None:
            return
        # 3. The fleet snapshot, step by step; a member that left placement meanwhile (lost,
        # deleted) is not brought back.
        if m.name not in self._snapshot.cluster_names:
            self._snapshot.set_member(self._member_state(m, nodes=()))
            changed = nodes
        else:
            self._snapshot.set_metadata(m.name, served_kinds=frozenset(served))
        for names in _chunks(sorted(removed)):
            if m.name not in self._snapshot.cluster_names:
                return
            for name in names:
                self._snapshot.remove_node(m.name, name)
            yield
        for chunk in _chunks(changed):
            if m.name not in self._snapshot.cluster_names:
                return
            self._snapshot.upsert_nodes(m.name, chunk)
            yield
        self._inventory_changed(m)
        # The MemberCluster shows the nodes at once, not at the next periodic status write
        # (up to ``status_interval_s`` later): a joining member is Ready with its nodes within
        # its own ingest time (issue 25's registration p99).
        self.write_status(m)

    def on_delta(self, m: MemberState, delta: InventoryDelta) -> None:
        """An inventory delta patches the member's nodes."""
        tally = self.tally(m)
        for n in delta.upserts:
            tally.set(n)
            m.nodes[n.name] = n
            m.dirty_nodes.add(n.name)
            m.removed_nodes.discard(n.name)
        for name in delta.removed:
            tally.remove(name)
            if m.nodes.pop(name, None) is not None:
                m.removed_nodes.add(name)
                m.dirty_nodes.discard(name)
        self._term.state.nodes_changed(
            m.name, itertools.chain((n.name for n in delta.upserts), delta.removed)
        )
        if m.spec is None or m.name not in self._snapshot.cluster_names:
            return
        for name in delta.removed:
            self._snapshot.remove_node(m.name, name)
        for n in delta.upserts:
            self._snapshot.upsert_node(m.name, n)
        self._inventory_changed(m)

    def _inventory_changed(self, m: MemberState) -> None:
        self._reservations.settle(self.flush_nodes)
        if self._lifecycle.awaiting_pods_gone(m.name):
            self._term.spawn(self._lifecycle.inventory_changed(m.name))
        self._term.state.kick()

    async def flush_nodes(self, name: str) -> None:
        """Write the member's changed nodes to etcd (waits for a write already in flight)."""
        m = self._term.state.members.get(name)
        if m is None:
            return
        async with m.nodes_lock:
            if m.dirty_nodes or m.removed_nodes:
                changed = m.dirty_nodes | m.removed_nodes
                m.dirty_nodes, m.removed_nodes = set(), set()
                await self._term.store.write_nodes(m.name, m.nodes, changed)

    # --- timers ----------------------------------------------------------------------------------

    def tally(self, m: MemberState) -> GPUTally:
        """The member's kept GPU summary (built from its nodes the first time)."""
        t = self._tallies.get(m.name)
        if t is None:
            t = self._tallies[m.name] = GPUTally(m.nodes.values())
        return t

    def recount(self, max_nodes: int | None = None) -> int:
        """Check kept GPU summaries against a full recount of their members' nodes; each one
        that differs is counted in ``gpufed_hub_incremental_drift_total{kind="member_gpus"}``,
        logged and rebuilt. Returns how many differed (0 unless a change path was missed).

        ``max_nodes`` None: every member now. Else one share of a round: the members the round
        has left, in order, until ``max_nodes`` nodes were read (at least one member); a call
        with no round in progress starts one over every member (:meth:`check_health`)."""
        members = self._term.state.members
        if max_nodes is None:
            todo = list(members.values())
        else:
            if not self._recount_left:
                self._recount_left = list(members)
                self._recount_left.reverse()  # popped from the end: in order
            todo, read = [], 0
            while self._recount_left and (not todo or read < max_nodes):
                m = members.get(self._recount_left.pop())
                if m is not None:  # gone meanwhile: nothing to check
                    todo.append(m)
                    read += len(m.nodes)
        drifted = 0
        for m in todo:
            t = self._tallies.get(m.name)
            if t is not None and drift(t, m.nodes.values()):
                drifted += 1
                self._term.metrics.incremental_drift.labels("member_gpus").inc()
                log.warning("hub.incremental.drift", kind="member_gpus", cluster=m.name)
                self._tallies[m.name] = GPUTally(m.nodes.values())
        return drifted

    async def check_health(self) -> None:
        """Re-classify every member's health now (the term's tick); every
        :data:`RECOUNT_INTERVAL_S` start a :meth:`recount` round, checked
        :data:`RECOUNT_NODES_PER_TICK` nodes a tick (the event loop is never held for the whole
        fleet's nodes at once)."""
        now = self._term.mono()
        if self._recount_left:
            self.recount(RECOUNT_NODES_PER_TICK)
        elif now - self._recounted >= RECOUNT_INTERVAL_S:
            self._recounted = now
            self.recount(RECOUNT_NODES_PER_TICK)
        for m in list(self._term.state.members.values()):
            if m.spec is None:
                continue
            h = health_at(
                now=now,
                last_heard=m.last_heard,
                hub_start=self._term.started,
                lease_s=self._term.config.member_lease_s,
                lost_s=self._term.config.member_lost_s,
                marked_lost=m.lost,
            )
            if h != m.health:
                self._set_health(m, h)
                if h == "Lost" and not m.lost:
                    await self._declare_lost(m)

    def _set_health(self, m: MemberState, health: MemberHealth) -> None:
        was, m.health = m.health, health
        if m.name in self._snapshot.cluster_names:
            self._snapshot.set_health(m.name, self._health(m))
        self.write_status(m)
        quiet = silence(
            now=self._term.mono(), last_heard=m.last_heard, hub_start=self._term.started
        )
        silent = f"no message from its agent for {quiet:.0f} s"
        if health == "Ready":
            log.info("member.ready", cluster=m.name, was=was)
            self._mirror.member_event(m, "Normal", "Ready", f"its agent is heard again ({was})")
            self._term.state.kick()
            self._dispatch.pump(m.name)
        elif health == "NotReady":
            log.warning("member.not_ready", cluster=m.name, silent_s=round(quiet, 1))
            self._mirror.member_event(m, "Warning", "NotReady", f"{silent}: left out of placement")
        else:
            log.warning("member.lost", cluster=m.name, silent_s=round(quiet, 1))
            why = silent if m.spec is not None else "the MemberCluster was deleted"
            self._mirror.member_event(m, "Warning", "Lost", f"{why}: its jobs are lost or moved")

    async def _declare_lost(self, m: MemberState) -> None:
        """The member-lost timeout passed (or its MemberCluster was deleted): recorded, then
        its jobs become Lost or are placed again (:mod:`gpufed.hub.components.lifecycle`)."""
        m.meta = m.meta.model_copy(update={"lost_at": self._term.wall()})
        await self._term.store.put_member_meta(m.name, m.meta)
        await self._lifecycle.member_lost(m.name)
        self._term.state.kick()

    async def flush(self) -> None:
        """Persist changed inventories and member facts (the term's flush loop). A member's
        inventory is written after the snapshots already waiting to be applied (one member's
        at a time, in arrival order: :meth:`take_snapshot`): when many members join at once,
        persisting yields the event loop to their applies, and each member is placeable and
        Ready sooner (issue 25's registration p99); its nodes reach etcd a little later."""
        for m in list(self._term.state.members.values()):
            if m.dirty_nodes or m.removed_nodes:
                async with self._ingest:  # no wait when no apply is running or queued
                    pass
            await self.flush_nodes(m.name)
            if m.meta_dirty:
                await self._term.persist_meta(m)

    # --- status ----------------------------------------------------------------------------------

    def write_status(self, m: MemberState) -> None:
        """Write the member's MemberCluster status soon (no-op once it is gone)."""
        if m.spec is None:
            return
        status = member_status(
            m,
            self._term.config,
            reservations=self._reservations.of_cluster(m.name),
            previous_conditions=self._mirror.last_member_conditions(m.name),
            metrics=self._term.metrics,
            now=self._mirror.now(),
            tally=self.tally(m),
        )
        status = status.model_copy(
            update={
                "suspect_nodes": [
                    SuspectNode(node=x.node, reason=x.reason, until=st.rfc3339(x.until_wall))
                    for x in self._suspects.of_member(m.name, self._term.mono())
                ]
            }
        )
        self._mirror.member_status(m.name, status)

    def write_all_statuses(self) -> None:
        """Refresh every registered member's status (and the metrics that come with it)."""
        for m in self._term.state.registered_members():
            self.write_status(m)
