"""A leader term over the typed fakes, with the steps tests take most: a member with nodes, a
job in the queue, an agent stream."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from gpufed.api.inventory import NodeInventory
from gpufed.api.stream import AgentHello, InventoryDelta, InventorySnapshot
from gpufed.api.work import WorkAck
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.adapters.sessions import PROTOCOL_VERSION, AgentSession
from gpufed.hub.components.config import HubConfig
from gpufed.hub.components.core import Controller
from gpufed.hub.components.metrics import HubMetrics
from tests.unit.hub.builders import batch_job, gpujob_obj, hgx_node, membercluster_obj
from tests.unit.hub.fakes import FakeHubAPI, FakeStore, TermClock


async def settle() -> None:
    """Let spawned background steps (reconciles, ack writes) run."""
    for _ in range(5):
        await asyncio.sleep(0)


@dataclass
class Term:
    """One Controller with its fakes; ``config`` overrides apply before it is built."""

    config: HubConfig = field(default_factory=lambda: HubConfig(insecure=True))
    clock: TermClock = field(default_factory=TermClock)
    store: FakeStore = field(default_factory=FakeStore)
    kube: FakeHubAPI = field(default_factory=FakeHubAPI)

    def __post_init__(self) -> None:
        self.ctrl = Controller(
            self.config,
            store=self.store,
            kube=self.kube,
            metrics=HubMetrics(),
            mono=self.clock.mono,
            wall=self.clock.wall,
        )
        # The builders' namespace, as the Namespace watch shows it (no Pod Security label).
        self.ctrl.intake.namespaces.seen("team-a", {})
        # No GPUQueues (the default queue, unlimited) until a test lists some.
        self.ctrl.queues.listed(self.kube.objects["gpuqueues"])
        # No PriorityClasses (every job at priority 0) until a test lists some.
        self.ctrl.state.priorities.listed(self.kube.objects["priorityclasses"])

    def member(self, name: str, *nodes: NodeInventory) -> None:
        """A MemberCluster ``name`` whose agent reported ``nodes``."""
        self.ctrl.members.on_event("ADDED", membercluster_obj(name))
        m = self.ctrl.state.member(name)
        self.ctrl.members.on_snapshot(m, InventorySnapshot(seq=1, nodes=nodes))

    async def submit(
        self,
        name: str,
        uid: str,
        gpus: int = 8,
        *,
        reschedule: str = "",
        placement: dict[str, Any] | None = None,
    ) -> None:
        """A GPUJob of one pod with ``gpus`` GPUs, seen by intake and reconciled
        (``reschedule``: its ``spec.placement.reschedule``, if set; ``placement``: more of
        its ``spec.placement``)."""
        obj = gpujob_obj(name, uid, template=batch_job(gpus))
        if reschedule:
            obj["spec"]["placement"] = {"reschedule": reschedule}
        if placement:
            obj["spec"]["placement"] = {**obj["spec"].get("placement", {}), **placement}
        self.kube.objects["gpujobs"].append(obj)
        self.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
        await settle()

    def connect(self, cluster: str) -> AgentSession:
        """An agent stream from ``cluster`` (Hello accepted, desired set sent)."""
        return self.ctrl.open_session(
            AgentHello(cluster=cluster, protocol_version=PROTOCOL_VERSION, agent_version="t")
        )


def sent(s: AgentSession) -> list[tuple[str, str, int]]:
    """Drain what the hub queued on a stream: (kind, job uid, revision) per work item, and
    ("desired_set", uids joined by ',', part) per desired-set part."""
    out: list[tuple[str, str, int]] = []
    while not s.outbox.empty():
        msg = s.outbox.get_nowait()
        if msg is None:
            break
        kind = msg.WhichOneof("body")
        if kind == "work_item":
            op = "apply" if msg.work_item.op == msg.work_item.APPLY else "delete"
            out.append((op, msg.work_item.job_uid, msg.work_item.revision))
        elif kind == "desired_set":
            uids = ",".join(i.job_uid for i in msg.desired_set.items)
            out.append(("desired_set", uids, msg.desired_set.part))
    return out


async def running(
    placement: dict[str, Any] | None = None,
) -> tuple[Term, AgentSession, int]:
    """Job u1 (8 GPUs) applied in m1 on m1-n0 with its pods bound; m1 also has m1-n1 idle."""
    t = Term()
    t.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
    s = t.connect("m1")
    sent(s)
    await t.submit("j", "u1", gpus=8, placement=placement)
    await t.ctrl.scheduler.cycle()
    [(_, _, rev)] = [x for x in sent(s) if x[0] == "apply"]
    assert t.ctrl.state.jobs["u1"].status.placement.pod_sets[0].nodes == {"m1-n0": 1}  # type: ignore[union-attr]
    await t.ctrl.handle(s, WorkAck(job_uid="u1", revision=rev, result="Applied"))
    t.ctrl.members.on_delta(
        t.ctrl.state.members["m1"],
        InventoryDelta(seq=2, upserts=(hgx_node("m1-n0", requested=8, job_uid="u1"),)),
    )
    await settle()
    return t, s, rev
