"""Coalescing writes to the hub API server: the latest desired value per object wins.

The leader's status mirror (:mod:`gpufed.hub.components.mirror`) submits a new desired status whenever something changes;
a few workers write them. Writes for one key are serial and in order; a burst of updates to
one key becomes one write of the latest value; a value equal to the last one written is
skipped. With ``min_interval_s``, a key written less than that long ago waits out the rest
of the interval before its next write, so the steps of one transition that arrive close
together (placed, dispatched, running) become fewer writes, while an update after a quiet
spell (a job finishing) is written at once. With ``hold_s``, a normal update of a key that is
neither queued nor being written waits that long before it is written, so the steps that follow
it within that time (a job placed, its objects acknowledged, its pods running) go in the same
write instead of one write each. This writer is the write path's one retry layer
(the write function makes one attempt): a failure is sorted by
:func:`gpufed.sync.retry.verdict_of` — the object is gone (GONE): its key is dropped; the API
server refuses the value itself (REFUSED: 400, 403, 422): logged and not retried, since writing
the same value again cannot succeed (a new value is written as usual); a conflict (RECONCILE,
409: the write's resourceVersion precondition failed) is written again at once, the write
function re-reading the object first; anything else: logged, and the latest value written
again after a short pause. An ``urgent`` submit (a job reaching a
terminal phase) goes ahead of the queue and is not held back by the interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from gpufed.sync.retry import Verdict, verdict_of

log = structlog.get_logger("gpufed.hub.adapters.writer")

WriteFn = Callable[[str, Any], Awaitable[None]]


class CoalescingWriter:
    """``submit(key, value)``; ``workers`` tasks call ``write(key, value)``; a key is written
    at most once per ``min_interval_s`` seconds unless urgent, and a normal update of an idle
    key ``hold_s`` seconds after it was submitted (module docstring).

    ``clock`` (seconds, monotonic; default the running loop's ``time()``) and ``sleep``
    (default :func:`asyncio.sleep`) are the writer's only sources of time: the interval and
    the pause after a failed write are measured and waited with them (tests pass fake time).
    """

    def __init__(
        self,
        name: str,
        write: WriteFn,
        *,
        workers: int = 4,
        min_interval_s: float = 0.0,
        hold_s: float = 0.0,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.name = name
        self._write = write
        self._workers = workers
        self._min_interval_s = min_interval_s
        self._hold_s = hold_s
        self._clock = clock
        self._sleep = sleep
        self._timers: set[asyncio.Task[None]] = set()  # delayed re-queues (min_interval_s)
        self._last_write: dict[str, float] = {}
        self._desired: dict[str, Any] = {}
        self._written: dict[str, Any] = {}
        # Entries (priority, sequence, key); priority 0 = urgent, 1 = normal. A key has at
        # most one live entry: the one whose priority _queued records (others are skipped).
        self._queue: asyncio.PriorityQueue[tuple[int, int, str]] = asyncio.PriorityQueue()
        self._seq = itertools.count()
        self._queued: dict[str, int] = {}
        self._busy: set[str] = set()
        self._urgent: set[str] = set()  # submitted urgent while being written
        self._tasks: list[asyncio.Task[None]] = []
        self._idle = asyncio.Event()
        self._idle.set()

    def start(self) -> None:
        """Start the worker tasks (in the running loop)."""
        self._tasks = [asyncio.create_task(self._work()) for _ in range(self._workers)]

    async def stop(self) -> None:
        """Cancel the workers (pending values are dropped: the next leader rewrites them)."""
        tasks = [*self._tasks, *self._timers]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        self._timers.clear()

    def submit(self, key: str, value: Any, *, urgent: bool = False, force: bool = False) -> None:
        """Desire ``value`` for ``key``; written soon unless equal to the last write. ``urgent``:
        ahead of every normal key, and not held back by ``min_interval_s``. ``force``: written
        even if equal to the last write (someone else changed the object since)."""
        self._desired[key] = value
        if force:
            self._written.pop(key, None)
        if self._written.get(key) == value:
            return
        if key in self._busy:
            if urgent:
                self._urgent.add(key)  # requeued as urgent once the current write ends
            return
        if urgent:
            self._enqueue(key, 0)
        elif key not in self._queued:
            # The first change after a quiet spell: held, so that what follows it soon
            # coalesces into the same write (an entry already queued keeps its time).
            self._enqueue(key, 1, delay=self._hold_s)

    def _enqueue(self, key: str, priority: int, delay: float = 0.0) -> None:
        current = self._queued.get(key)
        if current is not None and current <= priority:
            return
        self._queued[key] = priority
        self._idle.clear()
        entry = (priority, next(self._seq), key)
        if delay > 0:
            timer = asyncio.create_task(self._put_later(delay, entry))
            self._timers.add(timer)
            timer.add_done_callback(self._timers.discard)
        else:
            self._queue.put_nowait(entry)

    async def _put_later(self, delay: float, entry: tuple[int, int, str]) -> None:
        try:
            await self._sleep(delay)
        finally:
            # Also when stop() cancels the wait: the entry stays queued (as a call_later did),
            # so a writer started again writes the key; its worker re-checks the interval.
            self._queue.put_nowait(entry)

    def forget(self, key: str) -> None:
        """Drop everything about ``key`` (the object is gone)."""
        self._desired.pop(key, None)
        self._written.pop(key, None)
        self._last_write.pop(key, None)
        self._urgent.discard(key)

    def pending(self, key: str) -> bool:
        """True while a value for ``key`` waits to be written or is being written."""
        return (
            key in self._busy
            or key in self._queued
            or (key in self._desired and self._desired[key] != self._written.get(key))
        )

    def last_written(self, key: str) -> Any:
        """The value last written for ``key`` (None before the first write)."""
        return self._written.get(key)

    async def drained(self) -> None:
        """Wait until nothing is queued or being written (tests, shutdown)."""
        await self._idle.wait()

    async def _work(self) -> None:
        now = self._clock or asyncio.get_running_loop().time
        while True:
            priority, _, key = await self._queue.get()
            if self._queued.get(key) != priority:
                continue  # superseded by an entry of higher priority
            del self._queued[key]
            if key not in self._desired:
                self._maybe_idle()
                continue
            wait = self._last_write.get(key, -1e9) + self._min_interval_s - now()
            if wait > 0 and priority > 0:
                # Written moments ago: come back when the interval is over (later submits of
                # this key coalesce meanwhile); the worker moves on to other keys.
                self._enqueue(key, priority, delay=wait)
                continue
            self._busy.add(key)
            value = self._desired[key]
            try:
                if self._written.get(key) != value:
                    await self._write(key, value)
                    self._written[key] = value
                    self._last_write[key] = now()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                verdict = verdict_of(exc)
                if verdict is Verdict.GONE:
                    self.forget(key)
                elif verdict is Verdict.RECONCILE:
                    # 409: the object changed since the write function read it; it reads it
                    # again on the next attempt, which follows at once.
                    log.info("hub.write.conflict", writer=self.name, key=key)
                    self._written.pop(key, None)
                elif verdict is Verdict.REFUSED:
                    error = str(getattr(exc, "body", None) or exc)
                    log.error("hub.write.refused", writer=self.name, key=key, error=error)
                    self._written[key] = value
                else:
                    log.warning("hub.write.failed", writer=self.name, key=key, error=str(exc))
                    await self._sleep(1.0)
                    self._written.pop(key, None)
            finally:
                self._busy.discard(key)
            urgent = key in self._urgent
            self._urgent.discard(key)
            if key in self._desired and self._desired[key] != self._written.get(key):
                self._enqueue(key, 0 if urgent else 1)
            self._maybe_idle()

    def _maybe_idle(self) -> None:
        if not self._queued and not self._busy:
            self._idle.set()
