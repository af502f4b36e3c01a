"""The background tasks of one leader term, and the one rule for what ends the term.

Every component of a :class:`gpufed.hub.core.Controller` starts its loops and its off-path
work (an ack to persist, an Event to emit) through :meth:`TermTasks.spawn`; a task that fails
ends the term, never silently: another leader in etcd (:class:`NotLeaderError`), etcd gone
past the store's retry budget (:class:`StoreUnavailableError`) or a bug of ours stop the
controller with the reason, and :mod:`gpufed.hub.app` campaigns again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from gpufed.hub.store import NotLeaderError, StoreUnavailableError

log = structlog.get_logger("gpufed.hub.core")


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
