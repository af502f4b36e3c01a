"""List + watch of one resource with resourceVersion bookkeeping (a minimal informer).

Owns the loop every agent cache is fed by: a paginated list, then a watch from the list's
resourceVersion with bookmarks, continuing from the last seen resourceVersion whenever the
server ends the watch, and a full re-list when the version is too old (410 Gone) or after an
error that leaves the cache in doubt. A re-list is bracketed by ``begin_relist`` /
``end_relist`` so the handler can drop objects that vanished meanwhile.

Used by the inventory (Nodes, Pods), and by the status reporter (labelled workload objects
and their pods). The handler gets raw dicts and keeps only what it needs.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

from gpufed.agent.kube import MemberApi
from gpufed.sync.retry import FORBIDDEN_GRACE_S, Backoff, ForbiddenGrace, Verdict, status_of

log = structlog.get_logger("gpufed.agent.informer")

#: Backoff caps after a failed list or watch: temporary errors, and errors that retrying
#: does not fix (they may heal when someone fixes RBAC or installs a CRD); the shortest wait.
_RETRY_CAP_S = 10.0
_SLOW_CAP_S = 60.0
_MIN_WAIT_S = 0.5


class Handler(Protocol):
    """Receives the objects of one informer (all calls are synchronous, in event order)."""

    def begin_relist(self) -> None: ...

    def upsert(self, obj: dict[str, Any]) -> None: ...

    def delete(self, obj: dict[str, Any]) -> None: ...

    def end_relist(self) -> None: ...


class Informer:
    """Keeps ``handler`` in step with one resource collection of the member.

    ``path``: the collection path (``/api/v1/pods``); selectors as in the Kubernetes API.
    ``synced`` is set once the first full list has been handed over. ``on_event`` is called
    (resource name, event type) for metrics. After a failure the loop waits
    ``sleep(seconds)`` (jittered exponential backoff from 0.5 s, capped at 10 s, or 60 s for
    errors that retrying does not fix, such as a 403 that lasts past
    :data:`~gpufed.sync.retry.FORBIDDEN_GRACE_S` while RBAC is missing; never under 0.5 s);
    ``rng`` is the jitter's source of [0, 1); ``clock``: monotonic seconds (the 403 grace).
    """

    def __init__(
        self,
        api: MemberApi,
        path: str,
        handler: Handler,
        *,
        name: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int = 500,
        watch_timeout_s: tuple[int, int] = (300, 600),
        on_event: Callable[[str, str], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.path = path
        self.handler = handler
        self.name = name
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.page_size = page_size
        self.watch_timeout_s = watch_timeout_s
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0
        self._on_event = on_event
        self._sleep = sleep
        self._backoff = Backoff(base=0.5, cap=_RETRY_CAP_S, jitter=True, rng=rng)
        # a 403 right after the member's API server (re)started is its RBAC authorizer not
        # synced yet: retried at the normal pace for a while, slowly only when it stays
        self._forbidden = ForbiddenGrace(FORBIDDEN_GRACE_S, clock=clock)
        self._failing = ""
        self._failures = 0

    async def relist(self) -> None:
        """One full paginated list handed to the handler; sets :attr:`resource_version`."""
        self.handler.begin_relist()
        rv = ""
        count = 0
        async for items, page_rv in self.api.list_pages(
            self.path,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            limit=self.page_size,
        ):
            for obj in items:
                self.handler.upsert(obj)
            count += len(items)
            rv = page_rv
            await asyncio.sleep(0)  # let the loop breathe between pages of a large list
        self.handler.end_relist()
        self.resource_version = rv
        self.relists += 1
        self.synced.set()
        if self._on_event is not None:
            self._on_event(self.name, "RELIST")
        log.info("informer.listed", resource=self.name, objects=count, resource_version=rv)

    @property
    def failing(self) -> str:
        """Why the member's API server cannot be read now: the last error once two lists or
        watches in a row failed ("" while they work; one failure alone is not reported)."""
        return self._failing if self._failures >= 2 else ""

    async def run(self) -> None:
        """List, then watch forever; cancel to stop."""
        self._backoff.reset()
        need_list = True
        while True:
            try:
                if need_list:
                    await self.relist()
                    need_list = False
                    self._failing, self._failures = "", 0
                    self._forbidden.clear(self.name)
                await self._watch_once()
                self._backoff.reset()
                self._failing, self._failures = "", 0
                self._forbidden.clear(self.name)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                status = status_of(exc)
                if status == 410:
                    log.info(
                        "informer.expired",
                        resource=self.name,
                        resource_version=self.resource_version,
                    )
                    need_list = True
                    continue
                # An error retrying does not fix (a 403 that stays: RBAC missing) heals slowly:
                # wait longer. A 403 for less than FORBIDDEN_GRACE_S is a restarted API
                # server's (issue 26: the member showed NotReady up to a minute longer).
                verdict = self._forbidden.verdict(self.name, exc)
                cap = _RETRY_CAP_S if verdict is Verdict.RETRY else _SLOW_CAP_S
                wait = max(_MIN_WAIT_S, self._backoff.next(cap=cap))
                error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                self._failures += 1
                self._failing = error[:512]
                log.warning(
                    "informer.failed",
                    resource=self.name,
                    error=error,
                    status=status,
                    retry_in_s=round(wait, 2),
                )
                # The cache may have missed events only if the watch broke mid-way; the
                # resourceVersion still tells the server where to resume, so re-list only when
                # there is none (410 above forces one otherwise).
                need_list = need_list or not self.resource_version
                await self._sleep(wait)

    async def _watch_once(self) -> None:
        timeout = random.randint(*self.watch_timeout_s)
        async for event in self.api.watch(
            self.path,
            resource_version=self.resource_version,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            timeout_seconds=timeout,
        ):
            etype = event.get("type")
            obj = event.get("object") or {}
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if etype in ("ADDED", "MODIFIED"):
                self.handler.upsert(obj)
            elif etype == "DELETED":
                self.handler.delete(obj)
            if rv:
                self.resource_version = str(rv)
            if self._on_event is not None and etype is not None:
                self._on_event(self.name, str(etype))
