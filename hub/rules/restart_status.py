"""The restart fields of ``GPUJob.status``: ``restarts`` and ``restartHistory``.

Pure rules, called by :func:`gpufed.hub.rules.status.requeued` when a job goes back to Pending after
an infrastructure failure (:mod:`gpufed.hub.rules.lifecycle` decided it, rule 5). Kept
apart from :mod:`gpufed.hub.rules.status` so that module stays about phases and conditions.
"""

from __future__ import annotations

from gpufed.api.gpujob import MAX_RESTART_HISTORY, GPUJobStatus, RestartRecord
from gpufed.hub.rules.records import MAX_CAUSE_NODES, RequeueCause


def restart_update(
    status: GPUJobStatus, cause: RequeueCause, *, count: int, now: str
) -> dict[str, object]:
    """The status fields for one more re-run after ``cause``: ``restarts`` = ``count`` (the
    job's infrastructure requeues so far) and ``restartHistory`` with this one appended (the
    attempt that failed is ``status.attempt``; at most :data:`MAX_RESTART_HISTORY`, newest
    last)."""
    entry = RestartRecord(
        attempt=status.attempt or 1,
        cluster=cause.cluster,
        nodes=list(cause.nodes)[:MAX_CAUSE_NODES],
        reason=cause.reason,
        message=cause.message,
        time=now or None,
    )
    history = [*status.restart_history, entry][-MAX_RESTART_HISTORY:]
    return {"restarts": count, "restart_history": history}
