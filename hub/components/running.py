"""The running jobs preemption may choose from, and their index by block, kept across cycles.

Owned by :class:`gpufed.hub.components.preemption.Preemption`, read by its planning worker
(docs/hub.md "Preemption"). A job is running, as a possible victim, while its record places it
in a member, it is not being stopped, not finished, not being deleted and not claimed; it is
filed with the GPUs it holds per node (the member's ``job_requests``, else its reservation),
its start (the first Applied ack, else the placement), its checkpoint, past preemptions and
submit time (:meth:`RunningJobs.build`).

Incremental: each :meth:`RunningJobs.update` reads again only the jobs that may have changed
since the last one: those marked touched (``HubState.follow``: every job entering or leaving
the term's jobs and every change of its record, status, request, GPUJob or claim; the dispatch
and an ack marks the job of a work item), those whose GPUs per node in the members'
inventories changed (:class:`HeldGPUs`: only the nodes an inventory delta marked, and the
nodes of a member whose node dict was replaced whole, are read), and those filed from a
reservation (it may expire without a touch); the index
(:class:`~gpufed.placement.runindex.RunningIndex`) is changed by the same jobs, and a member
whose snapshot state was replaced or any of whose nodes was added, removed or re-filed (a new
node object: its shape, labels or pool changed; ``ClusterState.filings`` counts them) is filed
again. Every :data:`~gpufed.hub.components.usage.RECOUNT_S` (and at the first update) the
status loop reads every job and node and builds the index from scratch (never a planning
worker: no decision waits for it); each job whose kept entry differed is counted in
``gpufed_hub_incremental_drift_total{kind="running"}`` and logged
(``hub.preemption.running_drift``): 0 unless a change path was missed. A job that
changed while the worker read (touched again, or its GPUs per node moved between the two reads
of the inventories) is not counted: the kept entry is as of the incremental step, the full one
later, and the loop runs on meanwhile (``gpufed bench scale`` at 100 x 5,000 counted 12 such).

Threads: :meth:`RunningJobs.update` runs in the planning worker while the event loop may
change the jobs; the loop only adds to the touched set. A worker that meets a changing dict
raises (the caller counts the cycle as raced); the kept state is then dropped and built from
scratch at the next update.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import fields
from typing import Final

import structlog

from gpufed.api.inventory import NodeInventory
from gpufed.api.labels import GPU_RESOURCE
from gpufed.hub.components.term import MemberState, Term
from gpufed.hub.components.usage import RECOUNT_S
from gpufed.hub.rules import status as st
from gpufed.hub.rules.records import JobRecord
from gpufed.placement import FleetSnapshot
from gpufed.placement.preemption import PreemptionEvent, Running
from gpufed.placement.runindex import RunningIndex

log = structlog.get_logger("gpufed.hub.components.running")

#: (member, job UID) -> node -> whole GPUs the job holds there, from the members' inventories
Held = dict[tuple[str, str], dict[str, int]]

#: The fields of :class:`~gpufed.placement.preemption.Running` (compared by value: it is not)
_FIELDS: Final = tuple(f.name for f in fields(Running))


def events(record: JobRecord | None) -> tuple[PreemptionEvent, ...]:
    """The job's past preemptions, for the hourly cap and the no-cycle rule."""
    if record is None:
        return ()
    return tuple(PreemptionEvent(c.at, c.by_uid) for c in record.requeues if c.kind == "Preempted")


def same(a: Running | None, b: Running | None) -> bool:
    """Whether two entries say the same (field by field)."""
    if a is None or b is None:
        return a is b
    return all(getattr(a, f) == getattr(b, f) for f in _FIELDS)


class HeldGPUs:
    """(member, job UID) -> node -> whole GPUs the job holds there (:attr:`map`), from the
    members' inventories, kept by the nodes that changed. A member's ``nodes`` dict is either
    changed in place by an inventory delta, which marks the nodes it sets or removes
    (``HubState.nodes_changed``, followed as ``marks``), or replaced whole (a snapshot, a
    restore): :meth:`update` reads a member whose dict is the one it read last time by its
    marked nodes only, and a member with a new dict node by node (a node's inventory is an
    immutable object replaced on every change, so a node whose object is not the one read last
    time changed). Without ``marks`` every member is read node by node. Cost: O(members +
    marked nodes + the nodes of members with a new dict), plus O(changed nodes' jobs)."""

    def __init__(self, marks: set[tuple[str, str]] | None = None) -> None:
        self.map: Held = {}
        #: member -> node name -> the inventory object read last time
        self._seen: dict[str, dict[str, NodeInventory]] = {}
        #: member -> its ``nodes`` dict object read last time (only its marks are read next)
        self._dicts: dict[str, dict[str, NodeInventory]] = {}
        self._marks = marks

    def update(self, members: Mapping[str, MemberState]) -> set[str]:
        """Follow the members' inventories as they are now; the UIDs of the jobs whose GPUs
        per node changed."""
        moved: set[str] = set()
        live: set[str] = set()
        by_member: dict[str, list[str]] = {}
        if self._marks is not None:
            read = set(self._marks)  # one C call: the loop may add meanwhile
            self._marks.difference_update(read)  # what it adds after stays for the next one
            for member, name in read:
                by_member.setdefault(member, []).append(name)
        for m in list(members.values()):  # one C call: the loop may change the dicts
            live.add(m.name)
            current = m.nodes
            seen = self._seen.get(m.name)
            if self._marks is not None and seen is not None and self._dicts.get(m.name) is current:
                for name in by_member.get(m.name, ()):
                    old = seen.get(name)
                    inv = current.get(name)
                    if old is inv:
                        continue
                    if old is not None:
                        self._take(m.name, name, old, moved)
                        del seen[name]
                    if inv is not None:
                        self._put(m.name, name, inv, moved)
                        seen[name] = inv
                continue
            nodes = dict(current)
            seen = seen or {}
            for name, inv in nodes.items():
                old = seen.get(name)
                if old is not inv:
                    if old is not None:
                        self._take(m.name, name, old, moved)
                    self._put(m.name, name, inv, moved)
            for name in seen.keys() - nodes.keys():
                self._take(m.name, name, seen[name], moved)
            self._seen[m.name] = nodes
            self._dicts[m.name] = current
        for name in self._seen.keys() - live:
            self._dicts.pop(name, None)
            for node, inv in self._seen.pop(name).items():
                self._take(name, node, inv, moved)
        return moved

    def _put(self, member: str, node: str, inv: NodeInventory, moved: set[str]) -> None:
        for uid, reqs in inv.job_requests.items():
            count = reqs.get(GPU_RESOURCE, 0)
            if count > 0:
                self.map.setdefault((member, uid), {})[node] = count
                moved.add(uid)

    def _take(self, member: str, node: str, inv: NodeInventory, moved: set[str]) -> None:
        for uid, reqs in inv.job_requests.items():
            if reqs.get(GPU_RESOURCE, 0) > 0:
                gpus = self.map.get((member, uid))
                if gpus is not None:
                    gpus.pop(node, None)
                    if not gpus:
                        del self.map[(member, uid)]
                moved.add(uid)


class RunningJobs:
    """Job UID -> :class:`~gpufed.placement.preemption.Running` and the index over them, kept
    incrementally (module docstring)."""

    def __init__(self, term: Term, snapshot: FleetSnapshot) -> None:
        self._term = term
        self._snapshot = snapshot
        #: jobs that may have changed since the last update (HubState.touch adds to it)
        self._touched = term.state.follow()
        #: the kept entries and index (None: built from scratch at the next update)
        self._runs: dict[str, Running] | None = None
        self.index: RunningIndex | None = None
        #: nodes set or removed in place since the last update (HubState.nodes_changed)
        self._node_marks = term.state.follow_nodes()
        #: the GPUs each job holds per node, kept by the nodes that changed
        self._held = HeldGPUs(self._node_marks)
        #: jobs filed from their reservation (read at every update: it may expire)
        self._reserved: set[str] = set()
        #: member -> its filing fingerprint when last filed (:meth:`_members_now`)
        self._filed: dict[str, tuple[int, int, int]] = {}
        self._recounted = 0.0
        #: True when the last update built everything from scratch
        self.recounted = False
        term.metrics.incremental_drift.labels("running")  # exported from 0

    def drop(self) -> None:
        """Forget everything kept and the marks gathered (preemption is off: nothing reads
        them; the next update builds from scratch)."""
        self._touched.clear()
        self._node_marks.clear()
        self._runs, self.index = None, None
        self._held, self._reserved, self._filed = HeldGPUs(self._node_marks), set(), {}

    # --- one update ---------------------------------------------------------------------------

    def update(self, *, recount: bool = True) -> RunningIndex:
        """The running jobs now, indexed (the kept index, changed in place). Incremental,
        except the first time and, with ``recount``, every :data:`RECOUNT_S` (monotonic):
        every job read, the index built from scratch, the kept entries compared (drift
        counted). The planning worker passes ``recount=False`` (a decision never waits for the
        rebuild); the status loop's :meth:`Preemption.refresh
        <gpufed.hub.components.preemption.Preemption.refresh>` recounts. Raises what a dict
        changing under the worker raises (RuntimeError, KeyError); the kept state is then
        dropped. One caller at a time (the caller serialises)."""
        try:
            return self._update(recount)
        except BaseException:
            self.drop()
            raise

    def _update(self, recount: bool) -> RunningIndex:
        now = self._term.mono()
        members = self._term.state.members
        due = recount and now - self._recounted >= RECOUNT_S
        if self._runs is None or self.index is None or due:
            if self._runs is not None and self.index is not None:
                self._apply(self._held.update(members))
                kept = self._runs
                reread = set(self._reserved)  # read again at every update: never drift
            else:
                kept = None
                self._touched.clear()
            self._node_marks.clear()  # the fresh read below reads every node
            fresh = HeldGPUs(self._node_marks)
            fresh.update(members)
            held = fresh.map
            full = self.build(held)
            if kept is not None:
                # The event loop runs on while this worker reads: a job touched again since
                # the apply, or whose GPUs per node differ between the two reads of the
                # inventories, changed in between (its kept entry is as of the apply, the full
                # one later): not drift. What a missed change path left wrong is not touched.
                racing = reread | set(self._touched)
                old = self._held.map
                racing.update(k[1] for k in old.keys() | held.keys() if old.get(k) != held.get(k))
                self._check_drift(kept, full, racing)
            self._runs, self._held, self._recounted = full, fresh, now
            self._reserved = {u for u, r in full.items() if (r.cluster, u) not in held}
            self.index = RunningIndex(self._snapshot, full.values())
            if recount:
                # the status loop's rebuild files every level now: planning never pays for it
                self.index.file_levels()
            self._filed = self._members_now()
            self.recounted = True
            return self.index
        self._apply(self._held.update(members))
        self.recounted = False
        return self.index

    def _apply(self, moved: set[str]) -> None:
        """Read again the jobs that may have changed (``moved``: those whose GPUs per node
        changed); change the entries and the index."""
        runs, index = self._runs, self.index
        assert runs is not None
        assert index is not None
        held = self._held.map
        touched = self._touched
        read = set(touched)  # one C call: the loop may add meanwhile
        touched.difference_update(read)  # what it adds after stays for the next update
        read |= moved
        read |= self._reserved
        # members re-filed from the snapshot as it is now (a node's pool or groups may differ)
        filed = self._members_now()
        for name in index.members:
            if self._filed.get(name) != filed.get(name):
                index.reindex(name)
        self._filed = filed
        for uid in sorted(read):
            run = self._running(uid, held)
            prev = runs.get(uid)
            if same(prev, run):
                continue
            if prev is not None:
                index.remove(uid, prev.cluster)
                del runs[uid]
            if run is not None:
                runs[uid] = run
                index.add(run)
            if run is not None and (run.cluster, uid) not in held:
                self._reserved.add(uid)
            else:
                self._reserved.discard(uid)

    def _members_now(self) -> dict[str, tuple[int, int, int]]:
        """Each member's filing fingerprint: its snapshot state and how many node objects it
        filed and took out (``ClusterState.filings``: a node whose shape, labels or pool
        changed is a new object; one updated in place, its GPUs in use, is not). O(members)."""
        return {c.name: (id(c), len(c.nodes), c.filings) for c in self._snapshot.clusters()}

    # --- from scratch -------------------------------------------------------------------------

    def held(self) -> Held:
        """The whole GPUs each job holds per node, from the members' inventories (O(nodes))."""
        held: Held = {}
        # list(...) copies each dict in one C call: the worker thread never iterates a dict the
        # loop changes meanwhile
        for m in list(self._term.state.members.values()):
            for n in list(m.nodes.values()):
                for uid, reqs in n.job_requests.items():
                    count = reqs.get(GPU_RESOURCE, 0)
                    if count > 0:
                        held.setdefault((m.name, uid), {})[n.name] = count
        return held

    def build(self, held: Held) -> dict[str, Running]:
        """Every running job from scratch (by UID, sorted): the full count."""
        out: dict[str, Running] = {}
        for uid in sorted(list(self._term.state.jobs)):
            run = self._running(uid, held)
            if run is not None:
                out[uid] = run
        return out

    def _running(self, uid: str, held: Held) -> Running | None:
        """Job ``uid`` as a possible victim now (None: not running, or holds no whole GPU)."""
        job = self._term.state.jobs.get(uid)
        if job is None:
            return None
        rec = job.record
        if (
            rec is None
            or rec.cluster is None
            or rec.stopping is not None
            or job.terminal
            or job.deleting
            or job.claim is not None
        ):
            return None
        gpus = held.get((rec.cluster, uid))
        if gpus:
            gpus = dict(gpus)  # the held map changes in place
        else:
            res = self._snapshot.reservation(uid)
            gpus = (
                {n: a.get(GPU_RESOURCE, 0) for n, a in res.nodes.items() if a.get(GPU_RESOURCE)}
                if res is not None
                else {}
            )
        if not gpus:
            return None  # holds no whole GPU: freeing it frees nothing a GPU job needs
        ws = self._term.state.work.get((rec.cluster, uid))
        started = rec.placed_at
        if ws is not None and ws.ack is not None and ws.ack.applied_at is not None:
            started = ws.ack.applied_at
        checkpoint = None
        if job.status.last_checkpoint_time:
            with contextlib.suppress(ValueError):
                checkpoint = st.parse_rfc3339(job.status.last_checkpoint_time)
        request = job.request
        priority = rec.priority
        if priority is None:
            priority = request.priority if request is not None else 0
        return Running(
            uid=uid,
            job=job.key,
            cluster=rec.cluster,
            priority=priority,
            gpus=gpus,
            started_at=started,
            queue=rec.queue,
            last_checkpoint=checkpoint,
            checkpoint_interval_s=request.checkpoint_interval_s if request else None,
            preempted=events(rec),
            submitted_at=request.submitted_at if request is not None else None,
        )

    def _check_drift(
        self, kept: dict[str, Running], full: dict[str, Running], racing: set[str]
    ) -> None:
        """Count (and log) the jobs whose kept entry differs from the full count, except
        ``racing``: those that changed while the full count read."""
        differ = sorted(
            u
            for u in kept.keys() | full.keys()
            if u not in racing and not same(kept.get(u), full.get(u))
        )
        if differ:
            self._term.metrics.incremental_drift.labels("running").inc(len(differ))
            log.warning("hub.preemption.running_drift", jobs=len(differ), first=differ[:5])
