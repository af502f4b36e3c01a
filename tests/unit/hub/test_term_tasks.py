"""The term's background tasks (``TermTasks``): what ends the term, and a task cancelled before
it ran leaves no never-awaited coroutine behind (the unit suite's one RuntimeWarning)."""

from __future__ import annotations

import asyncio
import inspect

from gpufed.hub.components.term import TermTasks


def test_a_task_cancelled_before_it_ran_closes_its_coroutine() -> None:
    async def body() -> None:
        await asyncio.sleep(0)

    async def main() -> object:
        tasks = TermTasks(lambda reason: None)
        coro = body()
        tasks.spawn(coro)
        tasks.cancel_all()  # the term ends before the task's first step
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return coro

    coro = asyncio.run(main())
    assert inspect.iscoroutine(coro)
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED


def test_a_crash_ends_the_term_and_a_finished_task_is_untouched() -> None:
    stopped: list[str] = []

    async def crash() -> None:
        raise ValueError("boom")

    async def fine() -> int:
        return 1

    async def main() -> object:
        tasks = TermTasks(stopped.append)
        ok = fine()
        tasks.spawn(crash())
        tasks.spawn(ok)
        for _ in range(3):
            await asyncio.sleep(0)
        return ok

    ok = asyncio.run(main())
    assert stopped == ["internal error: boom"]
    assert inspect.getcoroutinestate(ok) == inspect.CORO_CLOSED  # it ran to its end
