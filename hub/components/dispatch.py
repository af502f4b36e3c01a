"""Dispatch: the per-member work outbox, sending with an in-flight cap, resends, and the desired
set after every (re)connect.

A work item (:class:`gpufed.hub.rules.records.WorkRecord` in etcd, its revision the key's etcd
revision) says what the hub wants in one member for one job: Apply (the job's manifests) or
Delete. The scheduling commit writes Applies; :meth:`Dispatch.ensure_delete` turns an item into
a Delete. :class:`Dispatch` sends them over the member's stream (:mod:`gpufed.hub.adapters.sessions`),
at most ``max_unacked_per_cluster`` unacknowledged at a time, and sends again what was not
acknowledged within ``resend_after_s`` (or whose retryable failure is due). After every
(re)connect the agent first gets the full desired set, in which fenced and deleted jobs are
absent so that the agent deletes their copies before it gets anything else
(docs/design.md §7 item 5), then the pending deletes, then new work.

Acks and workload reports come back through :mod:`gpufed.hub.components.reports`.
"""

from __future__ import annotations

import structlog

from gpufed.hub.adapters.sessions import AgentSession
from gpufed.hub.components.term import MemberState, Term

log = structlog.get_logger("gpufed.hub.components.dispatch")


class Dispatch:
    """The work outbox of every member (see the module docstring); ``mono``: monotonic clock."""

    def __init__(
        self,
        term: Term,
    ) -> None:
        self._term = term

    # --- the stream opens --------------------------------------------------------------------------

    def attach(self, m: MemberState, s: AgentSession) -> None:
        """``s`` is now the member's stream; nothing is sent until :meth:`send_desired_set`."""
        m.outbox.clear()
        m.queued.clear()
        m.session = s
        s.syncing = True

    def send_desired_set(self, s: AgentSession) -> int:
        """Send the member's full desired set (Applies, oldest first), then queue its pending
        Deletes; returns how many items the set holds. Call once after :meth:`attach`."""
        now = self._term.mono()
        mine = self._term.state.work_of(s.cluster)
        items = []
        for ws in mine:
            if ws.record.op == "Apply":
                items.append(ws.item())
                if not ws.settled:
                    ws.sent_at = now
        s.send_desired_set(items)
        for ws in mine:
            if ws.record.op == "Delete" and not ws.settled:
                self.enqueue(s.cluster, ws.record.job_uid, send=False)
        return len(items)

    def resend_desired_set(self, s: AgentSession) -> None:
        """The agent asked for the desired set again (a ResyncRequest)."""
        s.send_desired_set(
            [ws.item() for ws in self._term.state.work_of(s.cluster) if ws.record.op == "Apply"]
        )

    # --- the outbox ----------------------------------------------------------------------------------

    def enqueue(self, cluster: str, uid: str, *, send: bool = True) -> None:
        """Queue job ``uid``'s work item for ``cluster`` (once); with ``send``, pump now. The
        job is marked touched (:meth:`~gpufed.hub.components.term.HubState.touch`)."""
        self._term.state.touch(uid)
        m = self._term.state.members.get(cluster)
        if m is None:
            return
        if uid not in m.queued:
            m.queued.add(uid)
            m.outbox.append(uid)
        if send:
            self.pump(cluster)

    def pump(self, cluster: str) -> None:
        """Send queued work to the member while fewer than the cap are unacknowledged."""
        m = self._term.state.members.get(cluster)
        if m is None or m.session is None or m.health == "Lost" or m.session.syncing:
            return
        s = m.session
        cap = self._term.config.max_unacked_per_cluster
        while m.outbox and len(s.unacked) < cap:
            uid = m.outbox.popleft()
            m.queued.discard(uid)
            ws = self._term.state.work.get((cluster, uid))
            if ws is None or ws.settled:
                continue
            s.send_work(ws.item())
            s.unacked[uid] = ws.revision
            ws.sent_at = self._term.mono()
            ws.retry_at = None
            self._term.metrics.work_sent.labels(ws.record.op).inc()
            log.debug(
                "dispatch.sent",
                job=ws.record.job,
                cluster=cluster,
                op=ws.record.op,
                revision=ws.revision,
            )

    def processed(self, s: AgentSession, uid: str) -> None:
        """The agent processed the job's current revision without an ack that settles it:
        stop re-sending it."""
        ws = self._term.state.work.get((s.cluster, uid))
        if ws is not None:
            ws.sent_at = None
            ws.retry_at = None
        s.unacked.pop(uid, None)
        self.pump(s.cluster)

    def resend_due(self, now: float) -> None:
        """Queue again every unsettled item whose ack is overdue or whose retry is due
        (``now``: monotonic seconds; called by the term's tick)."""
        for ws in self._term.state.work.values():
            if ws.settled:
                continue
            due = (ws.retry_at is not None and now >= ws.retry_at) or (
                ws.sent_at is not None and now - ws.sent_at > self._term.config.resend_after_s
            )
            if due:
                owner = self._term.state.members.get(ws.cluster)
                if owner is not None and owner.session is not None:
                    owner.session.unacked.pop(ws.record.job_uid, None)
                    ws.sent_at = None
                    ws.retry_at = None
                    self.enqueue(ws.cluster, ws.record.job_uid)

    async def ensure_delete(self, cluster: str, uid: str, *, fenced: bool = False) -> None:
        """Turn the job's work item in ``cluster`` into a Delete (new revision) and send it.

        ``fenced``: the job was placed elsewhere after its member was lost; the Delete is left
        out of that member's desired set too. Call under the job's lock.
        """
        ws = self._term.state.work.get((cluster, uid))
        if ws is None or (ws.record.op == "Delete" and ws.record.fenced == fenced):
            if ws is not None:
                self.enqueue(cluster, uid)
            return
        record = ws.record.model_copy(update={"op": "Delete", "manifests": (), "fenced": fenced})
        ws.revision = await self._term.store.put_work(cluster, record)
        ws.record = record
        ws.sent_at = None
        ws.retry_at = None
        ws.failures = 0
        log.info("hub.work.delete", job=record.job, cluster=cluster, revision=ws.revision)
        self.enqueue(cluster, uid)
