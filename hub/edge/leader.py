"""Leader election through etcd: one hub replica leads, the others stand by.

Called by the hub process (:mod:`gpufed.hub.edge.app`). The leader writes its id into the
``leader`` key under the hub's prefix, attached to an etcd lease of ``ttl_s`` seconds, with a
transaction that succeeds only when the key does not exist; it keeps the lease alive every
``ttl_s / 3``. A standby polls the key and takes over once the leader's lease has expired (the
key vanishes with it) or the leader resigned.

Safety does not rest on timing: every etcd write of the leader is guarded by the value of the
leader key (:mod:`gpufed.hub.adapters.store`), so a paused or cut-off ex-leader cannot write after a
standby took over. For liveness the leader also steps down by itself when it could not renew
the lease for ``ttl_s`` (it cannot know whether the lease still exists).

Which etcd errors are an outage is the retry classifier's call
(:func:`gpufed.sync.retry.is_retryable`: connection failures, timeouts and
:class:`~gpufed.hub.adapters.store.StoreUnavailableError`): a standby polls again and a leader keeps
renewing until ``ttl_s`` passed. Any other etcd error (etcd refused the request, or gRPC
said INTERNAL / UNKNOWN) ends the hold at once; the campaign logs it as an error and keeps
polling (a hub must come back by itself once etcd does: the etcd restart drill,
``tests/integration/hub/test_etcd_restart.py``, met INTERNAL / UNKNOWN there). Anything
else is a bug and is raised.

Writes to the hub API server cannot carry an etcd guard; they are fenced by
:meth:`LeaderElector.holds`, the lease's **known-held deadline**: the time just before the
grant or keep-alive that etcd last answered was sent, plus the TTL it answered. etcd expires a
lease no earlier than TTL after it received that request, so while ``holds()`` is True no
standby can have taken over; a replica that was paused or cut off finds it False as soon as it
runs again, before :meth:`hold` notices anything (docs/design.md §10, "Fenced status
writes").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import aetcd
import structlog

from gpufed.hub.adapters.store import Store, StoreError
from gpufed.sync.retry import is_retryable

log = structlog.get_logger("gpufed.hub.edge.leader")


class LeaderElector:
    """Campaign for and hold the leader key (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        *,
        ttl_s: int,
        clock: Callable[[], float] = time.monotonic,
        on_missed: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self._clock = clock
        #: called for each renewal that failed or came an interval late (the hub's metric)
        self.on_missed = on_missed
        self._lease: aetcd.Lease | None = None
        self.is_leader = False
        self._held_until = float("-inf")
        #: the last campaign poll reached etcd (a standby's ``/readyz``)
        self.reachable = False

    async def acquire(self) -> None:
        """Return once this replica is the leader (polls every ``min(1, ttl/3)`` seconds)."""
        poll = min(1.0, self.ttl_s / 3)
        announced = False
        while True:
            try:
                sent = self._clock()
                left = await self.store.refresh(self._lease) if self._lease is not None else 0
                if left <= 0:
                    sent = self._clock()
                    self._lease = await self.store.grant_lease(self.ttl_s)
                    left = self.ttl_s
                acquired = await self.store.try_acquire(self._lease)
                self.reachable = True
                if acquired:
                    self._held_until = sent + left
                    self.is_leader = True
                    log.info("hub.leader.elected", hub=self.store.hub_id, ttl_s=self.ttl_s)
                    return
                if await self.store.drop_stale_self():
                    log.info("hub.leader.stale_key_dropped", hub=self.store.hub_id)
                    continue
                if not announced:
                    leader = await self.store.leader()
                    log.info("hub.leader.standby", hub=self.store.hub_id, leader=leader)
                    announced = True
            except Exception as exc:
                if is_retryable(exc):
                    log.warning("hub.leader.etcd_unavailable", error=str(exc))
                elif isinstance(exc, (aetcd.ClientError, StoreError)):
                    # etcd answered but refused (or gRPC said INTERNAL / UNKNOWN, as it may
                    # while etcd restarts): a standby keeps campaigning, loudly, so that the hub
                    # recovers once etcd (or its credentials) is fixed without a restart
                    log.error(
                        "hub.leader.etcd_refused",
                        error=str(exc),
                        fix="check the hub's --etcd endpoints and credentials; it keeps trying",
                    )
                else:
                    raise
                self._lease = None
                self.reachable = False
            await asyncio.sleep(poll)

    async def hold(self) -> str:
        """Keep the lease alive; return (with the reason) once leadership is lost."""
        assert self._lease is not None
        interval = self.ttl_s / 3
        last_ok = self._clock()
        while True:
            await asyncio.sleep(interval)
            sent = self._clock()
            if sent - last_ok >= 2 * interval:  # a renewal's turn came and went
                self.on_missed()
            try:
                ttl = await self.store.refresh(self._lease)
            except Exception as exc:
                self.on_missed()
                if not is_retryable(exc):
                    # Not an outage (etcd refused the request): the lease cannot be known held.
                    return self._lost(f"could not renew the lease: {exc}")
                if self._clock() - last_ok >= self.ttl_s:
                    return self._lost(f"could not renew the lease for {self.ttl_s} s: {exc}")
                log.warning("hub.leader.renew_failed", error=str(exc))
                continue
            if ttl <= 0:
                return self._lost("the leader lease expired")
            last_ok = self._clock()
            self._held_until = sent + ttl

    def holds(self) -> bool:
        """True while this replica leads and its lease is known to be held now (the deadline of
        the module docstring); no request. The fence of every hub API write."""
        return self.is_leader and self._clock() < self._held_until

    def _lost(self, reason: str) -> str:
        self.is_leader = False
        self._held_until = float("-inf")
        self._lease = None
        log.warning("hub.leader.lost", hub=self.store.hub_id, reason=reason)
        return reason

    async def resign(self) -> None:
        """Give up leadership now (revoke the lease) so a standby takes over at once."""
        lease, self._lease = self._lease, None
        was_leader, self.is_leader = self.is_leader, False
        self._held_until = float("-inf")
        if lease is None:
            return
        with contextlib.suppress(aetcd.ClientError, OSError, StoreError):
            await self.store.resign(lease)
        if was_leader:
            log.info("hub.leader.resigned", hub=self.store.hub_id)
