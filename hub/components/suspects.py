"""Suspect nodes: member nodes an infrastructure failure happened on, kept out of placement
for a cool-down.

The one owner of the hub's suspect marks. :mod:`gpufed.hub.components.lifecycle` marks the nodes a failure
cause names when Kubernetes observed them (:meth:`SuspectNodes.mark_failure`) and the not Ready
nodes a re-run's old pods were left on (:meth:`SuspectNodes.mark_unconfirmed`); the scheduler keeps them off every placement while the
mark lasts (:meth:`SuspectNodes.holds`, merged into placement's ``hold`` argument, the same
mechanism the backfill uses, so ``gpufed explain`` names them); the member status writer shows
them (:meth:`SuspectNodes.of_member`, ``MemberCluster.status.suspectNodes``, ``gpufed get
clusters``). A mark lasts ``cooldown_s`` (hub ``--suspect-node-cooldown``, default 3,600 s) on
the hub's monotonic clock; a node marked again starts a new cool-down. The marks of a member are
also kept in its etcd meta record (:meth:`SuspectNodes.records_of`, written by the lifecycle that
marks them; :meth:`SuspectNodes.restore` at a new term), so a hub restart or a leader change
keeps them until their wall-clock expiry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpufed.api.work import FailureCause
from gpufed.hub.components.term import MemberState
from gpufed.hub.rules.records import SuspectRecord
from gpufed.placement.queue import Hold
from gpufed.sync.failure import NODE_EVIDENCE

#: Default cool-down of a suspect node, seconds.
DEFAULT_SUSPECT_COOLDOWN_S = 3600.0
#: Most suspect nodes kept per member (the oldest marks go first beyond it).
MAX_SUSPECTS_PER_MEMBER = 256


@dataclass(frozen=True, slots=True)
class Suspect:
    """One suspect node: ``node`` of ``cluster``, why (``reason``, one line), and until when
    (``until_mono``, hub monotonic seconds; ``until_wall``, wall seconds, for display)."""

    cluster: str
    node: str
    reason: str
    until_mono: float
    until_wall: float


class SuspectNodes:
    """The suspect marks of one leader term (module docstring)."""

    def __init__(self, cooldown_s: float = DEFAULT_SUSPECT_COOLDOWN_S) -> None:
        if not cooldown_s >= 0:
            raise ValueError(f"--suspect-node-cooldown: {cooldown_s} is not >= 0 seconds")
        self.cooldown_s = cooldown_s
        self._marks: dict[tuple[str, str], Suspect] = {}

    def mark(
        self, cluster: str, nodes: Iterable[str], reason: str, *, mono: float, wall: float
    ) -> list[str]:
        """Mark ``nodes`` of ``cluster`` suspect for the cool-down from now; returns them."""
        out: list[str] = []
        if self.cooldown_s <= 0:
            return out
        for node in nodes:
            self._marks[(cluster, node)] = Suspect(
                cluster, node, reason, mono + self.cooldown_s, wall + self.cooldown_s
            )
            out.append(node)
        mine = sorted(
            (s for s in self._marks.values() if s.cluster == cluster), key=lambda s: s.until_mono
        )
        for s in mine[: max(0, len(mine) - MAX_SUSPECTS_PER_MEMBER)]:
            del self._marks[(s.cluster, s.node)]
        return out

    def mark_failure(
        self, m: MemberState, cause: FailureCause, job: str, *, mono: float, wall: float
    ) -> list[str]:
        """An infrastructure failure of ``job``'s copy in member ``m``: mark the nodes
        ``cause`` names, when it is what Kubernetes observed of them
        (:data:`gpufed.sync.failure.NODE_EVIDENCE`); returns the nodes marked."""
        # Never what the tenant can cause itself (its own exit codes, a pressure eviction it
        # provoked, a drain or a member-side preemption): else one tenant could walk the fleet
        # marking nodes and keep every other tenant off them for the cool-down.
        if cause.reason not in NODE_EVIDENCE:
            return []
        return self._mark_in(m, cause.nodes, f"{cause.reason} under {job}", mono, wall)

    def mark_unconfirmed(
        self, m: MemberState, uid: str, job: str, *, mono: float, wall: float
    ) -> tuple[list[str], list[str]]:
        """A re-run of job ``uid`` (``job``: its key) starts while pods of its old copy are
        left on nodes of ``m`` that are not Ready (unreachable: never confirmed gone): those
        nodes become suspect (Kubernetes observed them not Ready). Returns (those nodes, the
        ones marked)."""
        nodes = sorted(n.name for n in m.nodes.values() if uid in n.job_requests and not n.ready)
        if not nodes:
            return [], []
        reason = f"pods of {job} not confirmed gone (node not Ready)"
        return nodes, self._mark_in(m, nodes, reason, mono, wall)

    def _mark_in(
        self, m: MemberState, nodes: Iterable[str], reason: str, mono: float, wall: float
    ) -> list[str]:
        """Mark ``nodes`` of ``m`` and keep the member's marks in its meta record (written
        before a re-run decision is stored, else at the next flush)."""
        marked = self.mark(m.name, nodes, reason, mono=mono, wall=wall)
        if marked:
            m.meta = m.meta.model_copy(update={"suspects": self.records_of(m.name, mono)})
            m.meta_dirty = True
        return marked

    def records_of(self, cluster: str, mono: float) -> dict[str, SuspectRecord]:
        """The member's marks still on at ``mono``, as its etcd meta record keeps them."""
        return {
            s.node: SuspectRecord(reason=s.reason, until=s.until_wall)
            for s in self.of_member(cluster, mono)
        }

    def restore(
        self, cluster: str, records: dict[str, SuspectRecord], *, mono: float, wall: float
    ) -> None:
        """A new term: take the member's marks from etcd; each ends at its wall-clock expiry
        (marks already over are dropped)."""
        for node, rec in records.items():
            left = min(rec.until - wall, self.cooldown_s)
            if left > 0:
                self._marks[(cluster, node)] = Suspect(
                    cluster, node, rec.reason, mono + left, wall + left
                )

    def expire(self, mono: float) -> bool:
        """Drop the marks whose cool-down ended; True when any did (the fleet changed)."""
        gone = [k for k, s in self._marks.items() if s.until_mono <= mono]
        for k in gone:
            del self._marks[k]
        return bool(gone)

    def holds(self, mono: float) -> dict[str, Hold]:
        """Per member, a placement hold over its suspect nodes (none when there are none)."""
        self.expire(mono)
        nodes: dict[str, set[str]] = {}
        for (cluster, node), _ in sorted(self._marks.items()):
            nodes.setdefault(cluster, set()).add(node)
        return {
            c: Hold(
                c,
                frozenset(ns),
                f"suspect nodes after an infrastructure failure: {', '.join(sorted(ns))}",
            )
            for c, ns in nodes.items()
        }

    def of_member(self, cluster: str, mono: float) -> list[Suspect]:
        """The member's suspect nodes now, by node name."""
        return sorted(
            (s for s in self._marks.values() if s.cluster == cluster and s.until_mono > mono),
            key=lambda s: s.node,
        )

    def next_expiry(self) -> float | None:
        """Monotonic seconds of the next cool-down end, None without marks."""
        return min((s.until_mono for s in self._marks.values()), default=None)


def with_suspects(hold: dict[str, Hold] | None, suspects: dict[str, Hold]) -> dict[str, Hold]:
    """Placement's holds with the suspect holds merged in (nodes unioned per member)."""
    out = dict(hold or {})
    for cluster, h in suspects.items():
        out[cluster] = out[cluster].merged(h) if cluster in out else h
    return out
