"""Coalescing writes to the hub API server: the latest desired value per object wins.

The leader (:mod:`gpufed.hub.core`) submits a new desired status whenever something changes;
a few workers write them. Writes for one key are serial and in order; a burst of updates to
one key becomes one write of the latest value; a value equal to the last one written is
skipped. With ``min_interval_s``, a key written less than that long ago waits out the rest
of the interval before its next write, so the steps of one transition that arrive close
together (placed, dispatched, running) become fewer writes, while an update after a quiet
spell (a job finishing) is written at once. Failures are logged and the value is retried after
a short pause (the write function itself retries transient API errors through
:func:`gpufed.sync.retry.kube_retry`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

log = structlog.get_logger("gpufed.hub.writer")

WriteFn = Callable[[str, Any], Awaitable[None]]


class ObjectGoneError(Exception):
    """Raised by a write function when the object no longer exists: drop the key."""


class CoalescingWriter:
    """``submit(key, value)``; ``workers`` tasks call ``write(key, value)``; a key is written
    at most once per ``min_interval_s`` seconds (module docstring)."""

    def __init__(
        self, name: str, write: WriteFn, *, workers: int = 4, min_interval_s: float = 0.0
    ) -> None:
        self.name = name
        self._write = write
        self._workers = workers
        self._min_interval_s = min_interval_s
        self._last_write: dict[str, float] = {}
        self._desired: dict[str, Any] = {}
        self._written: dict[str, Any] = {}
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._queued: set[str] = set()
        self._busy: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._idle = asyncio.Event()
        self._idle.set()

    def start(self) -> None:
        """Start the worker tasks (in the running loop)."""
        self._tasks = [asyncio.create_task(self._work()) for _ in range(self._workers)]

    async def stop(self) -> None:
        """Cancel the workers (pending values are dropped: the next leader rewrites them)."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    def submit(self, key: str, value: Any) -> None:
        """Desire ``value`` for ``key``; written soon unless equal to the last write."""
        self._desired[key] = value
        if self._written.get(key) == value:
            return
        if key not in self._queued and key not in self._busy:
            self._queued.add(key)
            self._idle.clear()
            self._queue.put_nowait(key)

    def forget(self, key: str) -> None:
        """Drop everything about ``key`` (the object is gone)."""
        self._desired.pop(key, None)
        self._written.pop(key, None)
        self._last_write.pop(key, None)

    def last_written(self, key: str) -> Any:
        """The value last written for ``key`` (None before the first write)."""
        return self._written.get(key)

    async def drained(self) -> None:
        """Wait until nothing is queued or being written (tests, shutdown)."""
        await self._idle.wait()

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            if key not in self._desired:
                self._maybe_idle()
                continue
            loop = asyncio.get_running_loop()
            wait = self._last_write.get(key, -1e9) + self._min_interval_s - loop.time()
            if wait > 0:
                # Written moments ago: come back when the interval is over (later submits of
                # this key coalesce meanwhile); the worker moves on to other keys.
                self._queued.add(key)
                loop.call_later(wait, self._queue.put_nowait, key)
                continue
            self._busy.add(key)
            value = self._desired[key]
            try:
                if self._written.get(key) != value:
                    await self._write(key, value)
                    self._written[key] = value
                    self._last_write[key] = loop.time()
            except ObjectGoneError:
                self.forget(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("hub.write.failed", writer=self.name, key=key, error=str(exc))
                await asyncio.sleep(1.0)
                self._written.pop(key, None)
            finally:
                self._busy.discard(key)
            if (
                key in self._desired
                and self._desired[key] != self._written.get(key)
                and key not in self._queued
            ):
                self._queued.add(key)
                self._queue.put_nowait(key)
            self._maybe_idle()

    def _maybe_idle(self) -> None:
        if not self._queued and not self._busy:
            self._idle.set()
