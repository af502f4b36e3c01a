"""Fake time for unit tests of code that waits: a clock that moves only when the test says.

Code under test takes ``clock`` (``FakeClock.time``) and ``sleep`` (``FakeClock.sleep``) in
place of the loop's time and :func:`asyncio.sleep`; the test calls :meth:`FakeClock.advance`
and awaits :meth:`FakeClock.until_sleeping` instead of sleeping for real.
"""

from __future__ import annotations

import asyncio


class FakeClock:
    """Seconds that pass only through :meth:`advance`; :meth:`sleep` waits for them."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self.requested: list[float] = []  # every sleep asked for, in order
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self._changed = asyncio.Event()

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.requested.append(seconds)
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        wake = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.now + seconds, wake))
        self._changed.set()
        try:
            await wake
        finally:
            self._sleepers = [(t, f) for t, f in self._sleepers if f is not wake]

    @property
    def sleeping(self) -> int:
        """How many sleeps are waiting for the clock now."""
        return sum(1 for _, f in self._sleepers if not f.done())

    async def until_sleeping(self, count: int = 1) -> None:
        """Return once ``count`` sleeps are waiting (wrap in a timeout: it never gives up)."""
        while self.sleeping < count:
            self._changed.clear()
            await self._changed.wait()

    def advance(self, seconds: float) -> None:
        """Move the clock; sleeps due by then wake (they run once the test awaits)."""
        self.now += seconds
        for due, wake in self._sleepers:
            if due <= self.now and not wake.done():
                wake.set_result(None)
