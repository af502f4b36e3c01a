"""List + watch bookkeeping (gpufed.agent.informer): resourceVersion continuation, bookmarks,
re-list on 410 Gone, pagination, and recovery from broken watches."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

from gpufed.agent.informer import Informer

from .fakes import FakeApiError


def obj(name: str, rv: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(rv)}}


class ScriptedApi:
    """list_pages/watch as MemberApi offers them, driven by a script of lists and watches."""

    def __init__(self, lists: list[list[list[dict[str, Any]]]], watches: list[Any]) -> None:
        self.lists = lists  # each list: its pages
        self.watches = watches  # each: list of events, or an exception to raise
        self.watch_versions: list[str] = []
        self.list_calls = 0
        self.done = asyncio.Event()

    async def list_pages(
        self, path: str, **_: Any
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        pages = self.lists[self.list_calls]
        self.list_calls += 1
        for i, page in enumerate(pages):
            yield page, str(100 * self.list_calls + i)

    async def watch(
        self, path: str, *, resource_version: str, **_: Any
    ) -> AsyncIterator[dict[str, Any]]:
        self.watch_versions.append(resource_version)
        if not self.watches:
            self.done.set()
            await asyncio.Event().wait()  # block until cancelled
        script = self.watches.pop(0)
        if isinstance(script, Exception):
            raise script
        for event in script:
            yield event


class Recorder:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.relists = 0
        self._seen: set[str] | None = None

    def begin_relist(self) -> None:
        self.relists += 1
        self._seen = set()

    def upsert(self, o: dict[str, Any]) -> None:
        name = o["metadata"]["name"]
        if self._seen is not None:
            self._seen.add(name)
        self.objects[name] = o

    def delete(self, o: dict[str, Any]) -> None:
        self.objects.pop(o["metadata"]["name"], None)

    def end_relist(self) -> None:
        seen, self._seen = self._seen or set(), None
        for name in [n for n in self.objects if n not in seen]:
            del self.objects[name]


class FakeSleep:
    """Stands in for asyncio.sleep: records each wait and returns at once; :meth:`clock` is
    the time the waits add up to."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)

    def clock(self) -> float:
        return sum(self.waits)


async def run_until_done(
    api: ScriptedApi, rec: Recorder, sleep: FakeSleep | None = None, *, jitter: bool = True
) -> Informer:
    sleep = sleep or FakeSleep()
    informer = Informer(
        api,  # type: ignore[arg-type]
        "/api/v1/nodes",
        rec,
        name="nodes",
        sleep=sleep,
        rng=random.random if jitter else lambda: 1.0,
        clock=sleep.clock,
    )
    task = asyncio.create_task(informer.run())
    await asyncio.wait_for(api.done.wait(), 10)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return informer


async def test_watch_continues_from_the_last_seen_version_and_bookmarks() -> None:
    api = ScriptedApi(
        lists=[[[obj("a", 1)], [obj("b", 2)]]],  # two pages; the last page's version counts
        watches=[
            [
                {"type": "ADDED", "object": obj("c", 150)},
                {"type": "MODIFIED", "object": obj("a", 151)},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "160"}}},
            ],
            [{"type": "DELETED", "object": obj("b", 170)}],
        ],
    )
    rec = Recorder()
    informer = await run_until_done(api, rec)
    assert api.watch_versions == ["101", "160", "170"]
    assert sorted(rec.objects) == ["a", "c"]
    assert rec.objects["a"]["metadata"]["resourceVersion"] == "151"
    assert informer.synced.is_set()
    assert informer.relists == 1


async def test_410_gone_relists_and_drops_what_vanished() -> None:
    api = ScriptedApi(
        lists=[[[obj("a", 1), obj("b", 2)]], [[obj("b", 300)]]],
        watches=[[{"type": "ADDED", "object": obj("c", 110)}], FakeApiError(410, "too old")],
    )
    rec = Recorder()
    informer = await run_until_done(api, rec)
    assert api.list_calls == 2
    assert sorted(rec.objects) == ["b"]
    assert rec.relists == 2
    assert api.watch_versions == ["100", "110", "200"]
    assert informer.resource_version == "200"


async def test_broken_watch_resumes_from_its_version_without_relisting() -> None:
    api = ScriptedApi(
        lists=[[[obj("a", 1)]]],
        watches=[ConnectionResetError("peer reset"), [{"type": "ADDED", "object": obj("b", 120)}]],
    )
    rec = Recorder()
    sleep = FakeSleep()
    await run_until_done(api, rec, sleep)
    assert api.list_calls == 1
    assert api.watch_versions == ["100", "100", "120"]
    assert sorted(rec.objects) == ["a", "b"]
    assert sleep.waits == [0.5]  # the shortest wait; the first backoff step is at most that


async def test_failures_in_a_row_back_off_and_a_good_watch_starts_again_at_the_start() -> None:
    reset = ConnectionResetError("peer reset")
    api = ScriptedApi(
        lists=[[[obj("a", 1)]]],
        watches=[reset, reset, reset, reset, [], reset],
    )
    sleep = FakeSleep()
    await run_until_done(api, Recorder(), sleep, jitter=False)
    assert sleep.waits == [0.5, 1.0, 2.0, 4.0, 0.5]


async def test_an_error_retrying_does_not_fix_backs_off_up_to_a_minute() -> None:
    # a 403 is retried at the normal pace for a minute from the first (a restarted API
    # server's RBAC authorizer not synced yet, issue 26), then up to a minute apart
    forbidden = FakeApiError(403, "nodes is forbidden")
    api = ScriptedApi(lists=[[[obj("a", 1)]]], watches=[forbidden] * 12)
    sleep = FakeSleep()
    await run_until_done(api, Recorder(), sleep, jitter=False)
    assert sleep.waits == [0.5, 1.0, 2.0, 4.0, 8.0] + [10.0] * 5 + [60.0] * 2


async def test_a_forbidden_after_an_outage_is_retried_within_seconds() -> None:
    # issue 26: a member whose API server was stopped showed Ready on the hub up to two
    # minutes after it came back: its informers got a 403 from the restarted server and
    # waited up to 60 s.
    outage = [ConnectionResetError("refused")] * 20
    forbidden = [FakeApiError(403, "nodes is forbidden")] * 2
    api = ScriptedApi(lists=[[[obj("a", 1)]]], watches=[*outage, *forbidden])
    sleep = FakeSleep()
    await run_until_done(api, Recorder(), sleep, jitter=False)
    assert sleep.waits[-2:] == [10.0, 10.0]


async def test_temporary_errors_back_off_up_to_ten_seconds() -> None:
    api = ScriptedApi(lists=[[[obj("a", 1)]]], watches=[FakeApiError(503, "busy")] * 7)
    sleep = FakeSleep()
    await run_until_done(api, Recorder(), sleep, jitter=False)
    assert sleep.waits == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


async def test_jittered_waits_stay_between_the_shortest_wait_and_each_step() -> None:
    reset = ConnectionResetError("peer reset")
    api = ScriptedApi(lists=[[[obj("a", 1)]]], watches=[reset] * 6)
    sleep = FakeSleep()
    await run_until_done(api, Recorder(), sleep)
    ceilings = [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
    assert all(0.5 <= w <= c for w, c in zip(sleep.waits, ceilings, strict=True))


class FailingSeen(FakeSleep):
    """Records, at each wait, what the informer says about reaching the API server."""

    def __init__(self) -> None:
        super().__init__()
        self.informer: Informer | None = None
        self.failing: list[str] = []

    async def __call__(self, seconds: float) -> None:
        await super().__call__(seconds)
        assert self.informer is not None
        self.failing.append(self.informer.failing)


async def test_the_member_api_counts_as_unreachable_after_two_failures_in_a_row_until_a_success() -> (
    None
):
    reset = ConnectionResetError("peer reset")
    api = ScriptedApi(lists=[[[obj("a", 1)]]], watches=[reset, reset, reset, [], reset])
    sleep = FailingSeen()
    informer = Informer(
        api,  # type: ignore[arg-type]
        "/api/v1/nodes",
        Recorder(),
        name="nodes",
        sleep=sleep,
        rng=lambda: 1.0,
    )
    sleep.informer = informer
    task = asyncio.create_task(informer.run())
    await asyncio.wait_for(api.done.wait(), 10)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    # one failure is not reported; two and three are; a good watch clears it; one again is not
    assert sleep.failing == ["", "peer reset", "peer reset", ""]
