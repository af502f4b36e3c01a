"""How a job's path crosses the hub (issue 22's measures), printed as one JSON line.

Walks GPUJobs through a real leader term over the unit tests' typed fakes
(``tests/unit/hub/term.py``) under ``sys.setprofile`` and counts the gpufed files each path
enters: ``plain`` (GPUJob event -> placed -> acked -> Running -> Succeeded; also per step,
one event the hub handles and what it sets off, with the hub files entered more than once),
``infrastructure_rerun`` (a NodeLost report -> the copy deleted -> Pending) and
``delete_running`` (the GPUJob deleted while it runs -> the finalizer dropped); the term's
background loops (the join-token watch) start before a walk begins. Also counts each
hub component's constructor peers and the callbacks ``core.py`` passes.

Run from the repository root: ``.venv/bin/python scripts/hub_walk.py``.
"""

from __future__ import annotations

import ast
import asyncio
import collections
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path.cwd()))

from gpufed.api.stream import InventoryDelta
from gpufed.api.work import FailureCause, WorkAck, WorkloadStatus
from gpufed.hub.adapters.ports import WatchEvent
from tests.unit.hub.builders import hgx_node
from tests.unit.hub.term import Term, sent, settle

NODE_LOST = FailureCause(kind="Infrastructure", reason="NodeLost", message="gone", nodes=("m1-n0",))
SHARED = {"Term", "FleetSnapshot", "HubConfig", "HubMetrics", "HubState"}


def _rel(filename: str) -> str | None:
    i = filename.find("/gpufed/")
    return filename[i + len("/gpufed/") :] if i >= 0 else None


class Tracer:
    """Files entered (calls) and entries from another file, while ``on``; the entries also per
    ``step`` (one event the hub handles and what it sets off: one decision)."""

    def __init__(self) -> None:
        self.files: collections.Counter[str] = collections.Counter()
        self.entries: collections.Counter[str] = collections.Counter()
        self.by_step: dict[str, collections.Counter[str]] = {}
        self.step = ""
        self.on = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event != "call":
            return
        here = _rel(frame.f_code.co_filename)
        if here is None:
            return
        self.files[here] += 1
        back = frame.f_back
        while back is not None and _rel(back.f_code.co_filename) is None:
            back = back.f_back
        if back is None or _rel(back.f_code.co_filename) != here:
            self.entries[here] += 1
            self.by_step.setdefault(self.step, collections.Counter())[here] += 1


async def _settle(times: int = 5) -> None:
    for _ in range(times):
        await settle()


async def _running(t: Term, uid: str, tr: Tracer | None = None) -> tuple[Any, int]:
    def step(name: str) -> None:
        if tr is not None:
            tr.step = name

    s = t.ctrl.state.members["m1"].session
    step("1 intake")
    await t.submit("j" + uid, uid, gpus=8)
    step("2 cycle")
    await t.ctrl.scheduler.cycle()
    [(_, _, rev)] = [x for x in sent(s) if x[0] == "apply" and x[1] == uid]  # type: ignore[arg-type]
    step("3 ack")
    await t.ctrl.handle(s, WorkAck(job_uid=uid, revision=rev, result="Applied"))  # type: ignore[arg-type]
    await settle()
    step("4 inventory")
    busy = hgx_node("m1-n0", requested=8, job_uid=uid)
    t.ctrl.members.on_delta(t.ctrl.state.members["m1"], InventoryDelta(seq=2, upserts=(busy,)))
    await settle()
    step("5 running")
    running = WorkloadStatus(job_uid=uid, revision=rev, phase="Running")
    await t.ctrl.handle(s, running)  # type: ignore[arg-type]
    await settle()
    return s, rev


def _fresh() -> Term:
    t = Term()
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
    sent(t.connect("m1"))
    return t


async def plain(tr: Tracer) -> None:
    t = _fresh()
    await settle()  # the term's background loops (the join-token watch) start off the path
    tr.on = True
    s, rev = await _running(t, "u1", tr)
    tr.step = "6 succeeded"
    await t.ctrl.handle(s, WorkloadStatus(job_uid="u1", revision=rev, phase="Succeeded"))
    await settle()
    tr.on = False


async def infrastructure_rerun(tr: Tracer) -> None:
    t = _fresh()
    s, rev = await _running(t, "u1")
    tr.on = True
    failed = WorkloadStatus(job_uid="u1", revision=rev, phase="Failed", failure=NODE_LOST)
    await t.ctrl.handle(s, failed)
    await _settle()
    [(_, _, del_rev)] = [x for x in sent(s) if x[0] == "delete"]
    await t.ctrl.handle(s, WorkAck(job_uid="u1", revision=del_rev, result="Deleted"))
    idle = hgx_node("m1-n0")
    t.ctrl.members.on_delta(t.ctrl.state.members["m1"], InventoryDelta(seq=3, upserts=(idle,)))
    await _settle()
    tr.on = False


async def delete_running(tr: Tracer) -> None:
    t = _fresh()
    s, _ = await _running(t, "u1")
    raw = t.ctrl.state.jobs["u1"].obj.model_dump(by_alias=True, exclude_none=True)
    raw["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    raw["metadata"]["finalizers"] = ["gpufed.io/member-cleanup"]
    tr.on = True
    t.ctrl.intake.on_job_event(WatchEvent("MODIFIED", raw))
    await _settle()
    [(_, _, del_rev)] = [x for x in sent(s) if x[0] == "delete"]
    await t.ctrl.handle(s, WorkAck(job_uid="u1", revision=del_rev, result="Deleted"))
    await _settle()
    tr.on = False


def peers(root: Path) -> dict[str, dict[str, Any]]:
    """Per hub component class: its constructor's peers (component-typed parameters besides
    what every term shares) and callback parameters."""
    out: dict[str, dict[str, Any]] = {}
    trees = [ast.parse(f.read_text()) for f in sorted((root / "hub" / "components").glob("*.py"))]
    classes = {n.name for t in trees for n in t.body if isinstance(n, ast.ClassDef)}
    for tree in trees:
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    args = [*item.args.args[1:], *item.args.kwonlyargs]
                    typed = [(a.arg, ast.unparse(a.annotation)) for a in args if a.annotation]
                    comps = [a for a, t in typed if t in classes and t not in SHARED]
                    calls = [a for a, t in typed if "Callable" in t]
                    if comps or calls:
                        out[node.name] = {"peers": comps, "callbacks": calls}
    return out


async def main() -> None:
    paths: list[tuple[str, Callable[[Tracer], Awaitable[None]]]] = [
        ("plain", plain),
        ("infrastructure_rerun", infrastructure_rerun),
        ("delete_running", delete_running),
    ]
    result: dict[str, Any] = {}
    for name, walk in paths:
        tr = Tracer()
        sys.setprofile(tr)
        try:
            await walk(tr)
        finally:
            sys.setprofile(None)
        hub = sorted(f for f in tr.files if f.startswith("hub/"))
        result[name] = {
            "hub_files": len(hub),
            "gpufed_files": len(tr.files),
            "hub": hub,
            "entries": {f: n for f, n in tr.entries.most_common() if f.startswith("hub/")},
        }
        if len(tr.by_step) > 1:
            # per decision: the hub files it enters, and those it enters more than once
            result[name]["steps"] = {
                step: {
                    "hub_files": sum(1 for f in c if f.startswith("hub/")),
                    "twice": {f: n for f, n in c.most_common() if f.startswith("hub/") and n > 1},
                }
                for step, c in sorted(tr.by_step.items())
            }
    result["peers"] = peers(Path.cwd())
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
