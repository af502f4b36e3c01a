"""The leader survives what one job or one stream can throw at it (found by the system review).

- A GPUJob whose validation fails in an unexpected way is marked invalid; it does not stop
  the controller (a List with two Jobs of one name used to crash-loop the hub, disconnecting
  every agent each time).
- A stream whose handshake straddles the end of a controller's term is refused: it used to be
  bound to the dead controller, whose heartbeats the new leader never saw, so the whole fleet
  was declared lost while every agent ran.

Every test drives a real Controller over the typed fakes of tests/unit/hub/fakes.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from gpufed.api.protocol import agent_pb2 as pb
from gpufed.api.stream import AgentHello
from gpufed.api.work import WorkloadStatus
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.adapters.sessions import PROTOCOL_VERSION, StreamClosedError
from gpufed.hub.components import intake
from gpufed.hub.components.config import HubConfig
from gpufed.hub.components.core import Controller
from gpufed.hub.components.metrics import HubMetrics
from gpufed.hub.edge.service import AgentService
from gpufed.hub.rules.records import JobRecord, Loaded, MemberMeta, WorkRecord
from tests.unit.hub.builders import gpujob_obj, membercluster_obj
from tests.unit.hub.fakes import FakeHubAPI, FakeStore, TermClock, token_secret


def controller(store: FakeStore | None = None, kube: FakeHubAPI | None = None) -> Controller:
    clock = TermClock()
    ctrl = Controller(
        HubConfig(insecure=True),
        store=store or FakeStore(),
        kube=kube or FakeHubAPI(),
        metrics=HubMetrics(),
        mono=clock.mono,
        wall=clock.wall,
    )
    ctrl.intake.namespaces.seen("team-a", {})  # the builders' namespace, unlabelled
    return ctrl


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def listed(ctrl: Controller, plural: str) -> asyncio.Task[None]:
    """Run the controller's list+watch of ``plural`` (and of the token Secrets) until the first
    list is in."""
    ctrl.tokens.start()
    task = asyncio.create_task(ctrl.intake.list_watch(plural))
    synced = ctrl.intake.members_synced if plural == "memberclusters" else ctrl.state.jobs_listed
    await asyncio.wait_for(synced.wait(), 5)
    return task


async def stopped(*tasks: asyncio.Task[Any]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_an_unexpected_validation_error_marks_the_job_invalid_not_the_hub_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a rule nobody wrote a message for")

    monkeypatch.setattr(intake, "placement_request", broken)
    ctrl = controller()
    ctrl.intake.on_job_event(WatchEvent("ADDED", gpujob_obj()))  # must not raise
    job = ctrl.state.jobs["u1"]
    assert job.request is None
    assert job.status.phase == "Failed"
    valid = next(c for c in job.status.conditions if c.type == "Valid")
    assert valid.status == "False"
    assert "a rule nobody wrote a message for" in valid.message
    await settle()
    assert not ctrl.stopped


def hello(cluster: str = "m1", cluster_uid: str = "") -> AgentHello:
    return AgentHello(
        cluster=cluster,
        protocol_version=PROTOCOL_VERSION,
        agent_version="t",
        cluster_uid=cluster_uid,
    )


async def test_a_stopped_controller_accepts_no_stream_and_no_message() -> None:
    ctrl = controller()
    live = ctrl.open_session(hello())
    ctrl.stop("leadership lost")
    with pytest.raises(StreamClosedError) as err:
        ctrl.open_session(hello("m2"))
    assert err.value.code == "UNAVAILABLE"
    with pytest.raises(StreamClosedError) as err:
        ctrl.heard(live)  # the first step of every message
    assert err.value.code == "UNAVAILABLE"


class AbortedError(Exception):
    pass


class FakeContext:
    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", "Bearer t1"),)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code, self.details = code, details
        raise AbortedError(details)


async def test_a_handshake_that_outlives_the_controller_is_refused() -> None:
    kube = FakeHubAPI(
        objects={"memberclusters": [membercluster_obj("m1", token_secret="t")], "gpujobs": []},
        secrets={"gpufed-system": [token_secret("t", "t1")]},
    )
    old, new = controller(kube=kube), controller()
    watch = await listed(old, "memberclusters")
    current: list[Controller | None] = [old]

    async def agent() -> AsyncIterator[pb.AgentMessage]:
        # The old term ends while the agent is still saying Hello.
        old.stop("internal error")
        current[0] = new
        yield pb.AgentMessage(hello=pb.Hello(cluster="m1", protocol_version=PROTOCOL_VERSION))
        await asyncio.Event().wait()

    service = AgentService(lambda: current[0])
    ctx = FakeContext()

    async def drain() -> None:
        async for _ in service.Connect(agent(), ctx):  # type: ignore[arg-type]
            pass

    with pytest.raises(AbortedError):
        # Before the fix the stream was served by the old controller forever.
        await asyncio.wait_for(drain(), 5)
    await stopped(watch)
    assert ctx.code == grpc.StatusCode.UNAVAILABLE, ctx.details
    assert "m1" not in old.state.members or old.state.members["m1"].session is None


async def test_an_agent_talking_to_another_kubernetes_cluster_is_refused_and_replaces_nothing() -> (
    None
):
    # A valid token in an agent whose kubeconfig points at another member used to replace the
    # real agent's stream, report the other cluster's nodes, fail this member's running jobs
    # (Missing) and delete the other cluster's gpufed Jobs as orphans.
    store = FakeStore()
    ctrl = controller(store)
    real = ctrl.open_session(hello(cluster_uid="uid-of-us-east"))
    assert ctrl.state.members["m1"].meta.cluster_uid == "uid-of-us-east", "recorded at first join"
    await settle()
    assert [meta.cluster_uid for _, meta in store.metas] == ["uid-of-us-east"], "and stored"
    with pytest.raises(StreamClosedError) as err:
        ctrl.open_session(hello(cluster_uid="uid-of-eu"))
    assert err.value.code == "PERMISSION_DENIED"
    assert "uid-of-us-east" in err.value.reason
    assert "uid-of-eu" in err.value.reason
    assert ctrl.state.members["m1"].session is real
    assert real.closed is None
    # An agent that cannot tell (an older one, or no access to kube-system) is let in.
    assert ctrl.open_session(hello()) is not real


async def test_deleting_the_member_forgets_its_cluster_identity() -> None:
    ctrl = controller()
    ctrl.open_session(hello(cluster_uid="old"))
    ctrl.members.gone("m1")
    ctrl.open_session(hello(cluster_uid="new"))
    assert ctrl.state.members["m1"].meta.cluster_uid == "new"


async def test_a_returned_member_is_unmarked_in_the_store_at_once_not_at_the_next_flush() -> None:
    # The e2e hub-outage drill caught a hub killed within the 2 s flush after a lost member
    # came back: restarted, it read the old lost mark and showed the member as lost again.
    store = FakeStore()
    kube = FakeHubAPI(objects={"memberclusters": [membercluster_obj("m1")], "gpujobs": []})
    ctrl = controller(store, kube)
    ctrl.restore(Loaded(members={"m1": MemberMeta(lost_at=1_000.0)}))
    watch = await listed(ctrl, "memberclusters")
    m = ctrl.state.members["m1"]
    assert m.health == "Lost"
    ctrl.mirror.start()
    ctrl.members.heard(m)
    await settle()
    assert [(c, meta.lost_at) for c, meta in store.metas] == [("m1", None)]
    assert not m.meta_dirty
    await asyncio.wait_for(ctrl.mirror.members.drained(), 5)
    await ctrl.mirror.stop()
    await stopped(watch)
    # The status written at the return says Ready and carries no lostTime (it used to until
    # the next periodic write, and a hub killed before that left it on the MemberCluster).
    written = [status for name, status in kube.member_statuses if name == "m1"]
    assert written, "the return writes the member status at once"
    assert written[-1].get("lostTime") is None
    ready = next(c for c in written[-1]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"


async def test_a_status_sent_before_the_new_leaders_job_list_is_applied_after_it() -> None:
    # From the crash-consistency review: after a long etcd outage the agents reconnected to the
    # new leader and sent their jobs' final status before its GPUJob list was in; the hub
    # dropped them and 16 finished jobs stayed Running for good (an agent sends a status once).
    kube = FakeHubAPI(
        objects={"memberclusters": [membercluster_obj("m1")], "gpujobs": [gpujob_obj("j", "u1")]}
    )
    ctrl = controller(kube=kube)
    ctrl.restore(
        Loaded(
            jobs={"u1": JobRecord(uid="u1", job="team-a/j", cluster="m1", gpus=8)},
            job_revisions={"u1": 5},
            work={
                ("m1", "u1"): (
                    WorkRecord(job_uid="u1", job="team-a/j", namespace="team-a", op="Apply"),
                    7,
                )
            },
        )
    )
    members = await listed(ctrl, "memberclusters")
    session = ctrl.open_session(hello())
    ctrl.heard(session)
    await ctrl.handle(session, WorkloadStatus(job_uid="u1", revision=7, phase="Succeeded"))
    assert "u1" not in ctrl.state.jobs  # the list is not in yet
    jobs = await listed(ctrl, "gpujobs")
    await stopped(members, jobs)
    assert ctrl.state.jobs["u1"].status.phase == "Succeeded"
    assert ctrl.state.jobs["u1"].status.cluster == "m1"


async def test_a_placed_job_listed_before_its_namespace_is_known_is_not_taken_for_an_orphan() -> (
    None
):
    # Found by the etcd-restart drill under load: a new term whose GPUJob list came before its
    # Namespace list held every job back (admission waits for the namespace's level), found
    # their etcd records without a job, took them for orphans and deleted their running copies.
    store = FakeStore()
    kube = SlowNamespaces(objects={"memberclusters": [], "gpujobs": [gpujob_obj("j", "u1")]})
    ctrl = controller(store, kube)
    ctrl.restore(
        Loaded(
            jobs={"u1": JobRecord(uid="u1", job="team-a/j", cluster="m1", gpus=8)},
            job_revisions={"u1": 5},
            work={
                ("m1", "u1"): (
                    WorkRecord(job_uid="u1", job="team-a/j", namespace="team-a", op="Apply"),
                    7,
                )
            },
        )
    )
    ctrl.intake.namespaces.listed([])  # nothing known about team-a yet
    jobs = await listed(ctrl, "gpujobs")
    await settle()
    assert ctrl.state.work[("m1", "u1")].record.op == "Apply", "the running copy is kept"
    assert "put_work" not in store.calls
    kube.answer.set()  # the namespace read answers: the job is taken in, its record adopted
    await settle()
    await stopped(jobs)
    assert ctrl.state.jobs["u1"].placed_cluster == "m1"
    assert ctrl.state.work[("m1", "u1")].record.op == "Apply"


class SlowNamespaces(FakeHubAPI):
    """A hub API whose Namespace reads answer only once ``answer`` is set."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.answer = asyncio.Event()

    async def get_namespace(self, name: str) -> dict[str, Any] | None:
        await self.answer.wait()
        return await super().get_namespace(name)
