"""List+watch bookkeeping of the hub's intake: resume from the last resourceVersion, re-list on
410 Gone, and treat objects that vanished while unwatched as deleted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.components.config import HubConfig
from gpufed.hub.components.core import Controller
from gpufed.hub.components.metrics import HubMetrics
from tests.unit.hub.builders import gpujob_obj
from tests.unit.hub.fakes import FakeHubAPI, FakeStore


class GoneStatusError(Exception):
    """What the Kubernetes client raises for a watch whose resourceVersion is too old."""

    status = 410


def job_obj(name: str, uid: str, rv: str) -> dict[str, Any]:
    return gpujob_obj(name, uid, rv=rv)


class ScriptedKube(FakeHubAPI):
    """Lists and watches from a script; records the resourceVersions watches started from."""

    def __init__(self) -> None:
        super().__init__()
        self.lists = [
            ([job_obj("a", "ua", "10"), job_obj("b", "ub", "11")], "11"),
            ([job_obj("b", "ub", "30")], "30"),  # after 410: a vanished while unwatched
        ]
        self.watch_from: list[str] = []
        self.done = asyncio.Event()

    async def list_objects(self, plural: str) -> tuple[list[dict[str, Any]], str]:
        if plural != "gpujobs":
            return [], "1"
        if not self.lists:
            self.done.set()
            await asyncio.Event().wait()
        return self.lists.pop(0)

    async def watch_objects(
        self, plural: str, resource_version: str, *, timeout_s: int = 300
    ) -> AsyncIterator[WatchEvent | str]:
        rv = resource_version
        self.watch_from.append(rv)
        if len(self.watch_from) == 1:
            yield WatchEvent("ADDED", job_obj("c", "uc", "12"))
            yield "20"  # a bookmark
            return  # the server ended the watch: resume from the bookmark
        if len(self.watch_from) == 2:
            raise GoneStatusError("too old resource version: 20 (25)")
        self.done.set()
        await asyncio.Event().wait()
        yield "never"  # pragma: no cover


async def test_watch_resumes_from_bookmarks_and_relists_on_410() -> None:
    kube = ScriptedKube()
    ctrl = Controller(HubConfig(insecure=True), store=FakeStore(), kube=kube, metrics=HubMetrics())
    task = asyncio.create_task(ctrl.intake.list_watch("gpujobs"))
    await asyncio.wait_for(kube.done.wait(), 5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert kube.watch_from == ["11", "20", "30"]
    assert set(ctrl.state.jobs) == {"ub"}, "a and c vanished while unwatched: treated as deleted"
    assert ctrl.state.jobs["ub"].obj.metadata.resource_version == "30"
    assert ctrl.ready is False, "no MemberCluster list in this test"
    assert ctrl.state.jobs_listed.is_set()
