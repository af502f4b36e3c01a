"""The list+watch loop (an informer without a cache): list, then watch from the list's
resourceVersion, forever.

Used by :mod:`gpufed.hub.components.intake` (GPUJobs, MemberClusters) and :mod:`gpufed.hub.components.tokens`
(join-token Secrets). Bookmarks move the resourceVersion on; a watch the server ends resumes
from the last resourceVersion seen; a 410 (:attr:`~gpufed.sync.retry.Verdict.GONE`) lists
again, and the caller's ``on_listed`` learns which objects are gone. Errors whose verdict is
in ``tolerate`` (default: RETRY only) back off (:class:`gpufed.sync.retry.Backoff`, 0.2 s
doubling to 10 s); any other error is raised, and in a leader term's task ends the term.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import structlog

from gpufed.hub.adapters.ports import WatchEvent
from gpufed.sync.retry import Backoff, Verdict, verdict_of

log = structlog.get_logger("gpufed.hub.adapters.listwatch")

ListFn = Callable[[], Awaitable[tuple[list[dict[str, Any]], str]]]
WatchFn = Callable[[str], AsyncIterator[WatchEvent | str]]


async def list_watch(
    resource: str,
    list_fn: ListFn,
    watch_fn: WatchFn,
    *,
    on_listed: Callable[[list[dict[str, Any]]], None],
    on_event: Callable[[WatchEvent], None],
    tolerate: frozenset[Verdict] = frozenset({Verdict.RETRY}),
    on_error: Callable[[Exception], None] | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """List with ``list_fn`` (objects, resourceVersion), hand the objects to ``on_listed``, then
    feed every event of ``watch_fn(resource_version)`` to ``on_event``; never returns.

    ``resource`` names the loop in logs. ``on_error`` sees each tolerated error (after it is
    logged) before the loop backs off; ``sleep`` waits out the backoff (tests pass fake time).
    """
    backoff = Backoff(base=0.2, cap=10.0)

    def tolerated(exc: Exception, event: str) -> bool:
        if verdict_of(exc) not in tolerate:
            return False
        log.warning(event, resource=resource, error=str(exc))
        if on_error is not None:
            on_error(exc)
        return True

    while True:
        try:
            items, rv = await list_fn()
        except Exception as exc:
            if not tolerated(exc, "hub.list_failed"):
                raise
            await sleep(backoff.next())
            continue
        on_listed(items)
        log.info("hub.listed", resource=resource, objects=len(items), rv=rv)
        backoff.reset()
        while True:
            try:
                async for ev in watch_fn(rv):
                    if isinstance(ev, str):
                        rv = ev
                        continue
                    rv = str(ev.obj.get("metadata", {}).get("resourceVersion", rv))
                    on_event(ev)
                backoff.reset()
            except Exception as exc:
                if verdict_of(exc) is Verdict.GONE:
                    log.info("hub.relist", resource=resource, reason="410 Gone")
                    break
                if type(exc).__name__ == "LineTooLong":
                    # One event bigger than the client reads (aiohttp: 4 MiB a line): watching
                    # again from the same resourceVersion would meet it again, forever. The
                    # list (one body, no line limit) gets past it.
                    log.warning("hub.relist", resource=resource, reason="watch event too large")
                    await sleep(backoff.next())
                    break
                if not tolerated(exc, "hub.watch_failed"):
                    raise
                await sleep(backoff.next())
