"""What every component of one leader term shares — configuration, the two ports, the state,
metrics, clocks — and the term's background tasks, with the one rule for what ends the term.

:class:`Term` is built once by :class:`gpufed.hub.components.core.Controller` and handed to each
component's constructor together with the peers that component calls (the arrows of
docs/design.md §9). Every component of a :class:`gpufed.hub.components.core.Controller` starts its loops and its off-path
work (an ack to persist, an Event to emit) through :meth:`TermTasks.spawn`; a task that fails
ends the term, never silently: another leader in etcd (:class:`NotLeaderError`), etcd gone
past the store's retry budget (:class:`StoreUnavailableError`) or a bug of ours stop the
controller with the reason, and :mod:`gpufed.hub.edge.app` campaigns again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from gpufed.hub.adapters.ports import HubAPI, StateStore
from gpufed.hub.adapters.store import NotLeaderError, StoreUnavailableError
from gpufed.hub.components.config import HubConfig
from gpufed.hub.components.metrics import HubMetrics
from gpufed.hub.components.state import HubState, MemberState

log = structlog.get_logger("gpufed.hub.components.core")


class TermTasks:
    """Spawns tasks whose failure calls ``stop(reason)``; :meth:`cancel_all` at term end."""

    def __init__(self, stop: Callable[[str], None]) -> None:
        self._stop = stop
        self._bg: set[asyncio.Task[Any]] = set()

    async def supervise(self, coro: Awaitable[Any]) -> None:
        """Await ``coro``; translate what ends the term into ``stop(reason)``."""
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except NotLeaderError as exc:
            self._stop(str(exc))
        except StoreUnavailableError as exc:
            log.warning("hub.etcd.unavailable", error=str(exc))
            self._stop(f"etcd unavailable: {exc}")
        except Exception as exc:
            log.exception("hub.controller.crashed", error=str(exc))
            self._stop(f"internal error: {exc}")

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run ``coro`` in the background under :meth:`supervise`."""
        task = asyncio.ensure_future(self.supervise(coro))
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def cancel_all(self) -> None:
        """Cancel every background task still running (the term ended)."""
        for t in list(self._bg):
            t.cancel()


def always_leading() -> bool:
    """The lease of a hub that runs without an election (tests, a single replica)."""
    return True


@dataclass(frozen=True)
class Term:
    """The shared context of one leader term.

    ``store``/``kube``: the two ports (:mod:`gpufed.hub.adapters.ports`); ``mono``/``wall``: the
    monotonic and wall clocks (seconds) every timer and status time reads; ``started``:
    ``mono()`` when the term began (member timers count from it); ``tasks``: where background
    work runs (:meth:`spawn`); ``lease``: True while the leader lease is known to be held;
    ``stopped``: set once the term ends (together: :meth:`leading`).
    """

    config: HubConfig
    store: StateStore
    kube: HubAPI
    metrics: HubMetrics
    state: HubState
    tasks: TermTasks
    mono: Callable[[], float]
    wall: Callable[[], float]
    started: float
    lease: Callable[[], bool]
    stopped: asyncio.Event

    def leading(self) -> bool:
        """True while this term may write to the hub API: not stopped, and the leader lease
        known to be held (:meth:`gpufed.hub.edge.leader.LeaderElector.holds`). Cheap."""
        return not self.stopped.is_set() and self.lease()

    def check_fence(self) -> None:
        """Right before a write to the hub API: raise :class:`NotLeaderError` unless this term
        still leads (the controller runs and the leader lease is known to be held: see
        :meth:`gpufed.hub.edge.leader.LeaderElector.holds`). Cheap: no request."""
        if not self.leading():
            raise NotLeaderError("not the leader any more: hub API writes are fenced")

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run ``coro`` in the background; its failure ends the term."""
        self.tasks.spawn(coro)

    async def persist_meta(self, m: MemberState) -> None:
        """Write member ``m``'s latest meta record to etcd now (clearing ``meta_dirty``; set
        again when the write fails, so the flush loop tries again)."""
        m.meta_dirty = False
        try:
            await self.store.put_member_meta(m.name, m.meta)  # the latest meta, not a copy
        except BaseException:
            m.meta_dirty = True
            raise
