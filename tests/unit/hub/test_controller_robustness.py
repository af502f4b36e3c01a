"""The leader survives what one job or one stream can throw at it (found by the system review).

- A GPUJob whose validation fails in an unexpected way is marked invalid; it does not stop
  the controller (a List with two Jobs of one name used to crash-loop the hub, disconnecting
  every agent each time).
- A stream whose handshake straddles the end of a controller's term is refused: it used to be
  bound to the dead controller, whose heartbeats the new leader never saw, so the whole fleet
  was declared lost while every agent ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from gpufed.api.membercluster import MemberClusterSpec, SecretKeyRef
from gpufed.api.protocol import agent_pb2 as pb
from gpufed.hub import core
from gpufed.hub.config import HubConfig
from gpufed.hub.core import PROTOCOL_VERSION, Controller
from gpufed.hub.kube import WatchEvent
from gpufed.hub.metrics import HubMetrics
from gpufed.hub.service import AgentService
from gpufed.hub.sessions import StreamClosedError
from tests.unit.hub.builders import batch_job


class QuietKube:
    """Events are dropped; nothing else is called by these tests."""

    async def emit_event(self, *args: Any, **kwargs: Any) -> None:
        return None


class MetaStore:
    """Records member meta writes (the only store call these tests make)."""

    def __init__(self) -> None:
        self.metas: list[tuple[str, Any]] = []

    async def put_member_meta(self, cluster: str, meta: Any) -> None:
        self.metas.append((cluster, meta))


def controller(store: MetaStore | None = None) -> Controller:
    return Controller(
        HubConfig(insecure=True),
        store=store or MetaStore(),  # type: ignore[arg-type]
        kube=QuietKube(),  # type: ignore[arg-type]
        metrics=HubMetrics(),
    )


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def job_obj(uid: str = "u1") -> dict[str, Any]:
    return {
        "apiVersion": "gpufed.io/v1alpha1",
        "kind": "GPUJob",
        "metadata": {
            "name": "j",
            "namespace": "team-a",
            "uid": uid,
            "resourceVersion": "1",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "finalizers": ["gpufed.io/member-cleanup"],
        },
        "spec": {"template": batch_job(8)},
    }


async def test_an_unexpected_validation_error_marks_the_job_invalid_not_the_hub_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a rule nobody wrote a message for")

    monkeypatch.setattr(core, "placement_request", broken)
    ctrl = controller()
    ctrl._on_job_event(WatchEvent("ADDED", job_obj()))  # must not raise
    job = ctrl.jobs["u1"]
    assert job.request is None
    assert job.status.phase == "Failed"
    valid = next(c for c in job.status.conditions if c.type == "Valid")
    assert valid.status == "False"
    assert "a rule nobody wrote a message for" in valid.message
    assert not ctrl._stopped.is_set()


def hello(cluster: str = "m1") -> pb.Hello:
    return pb.Hello(cluster=cluster, protocol_version=PROTOCOL_VERSION, agent_version="t")


async def test_a_stopped_controller_accepts_no_stream_and_no_message() -> None:
    ctrl = controller()
    live = ctrl.open_session("m1", hello())
    ctrl.stop("leadership lost")
    with pytest.raises(StreamClosedError) as err:
        ctrl.open_session("m2", hello("m2"))
    assert err.value.code == "UNAVAILABLE"
    with pytest.raises(StreamClosedError) as err:
        await ctrl.handle(live, pb.AgentMessage(heartbeat=pb.Heartbeat()))
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
    old, new = controller(), controller()
    old.members_synced.set()
    current: list[Controller | None] = [old]
    hello_sent = asyncio.Event()

    async def authenticate(token: str) -> str:
        return "m1"

    old.authenticate = authenticate  # type: ignore[method-assign]

    async def agent() -> AsyncIterator[pb.AgentMessage]:
        # The old term ends while the agent is still saying Hello.
        old.stop("internal error")
        current[0] = new
        hello_sent.set()
        yield pb.AgentMessage(hello=hello())
        await asyncio.Event().wait()

    service = AgentService(lambda: current[0])
    ctx = FakeContext()

    async def drain() -> None:
        async for _ in service.Connect(agent(), ctx):  # type: ignore[arg-type]
            pass

    with pytest.raises(AbortedError):
        # Before the fix the stream was served by the old controller forever.
        await asyncio.wait_for(drain(), 5)
    assert ctx.code == grpc.StatusCode.UNAVAILABLE, ctx.details
    assert "m1" not in old.members or old.members["m1"].session is None


async def test_an_agent_talking_to_another_kubernetes_cluster_is_refused_and_replaces_nothing() -> (
    None
):
    # A valid token in an agent whose kubeconfig points at another member used to replace the
    # real agent's stream, report the other cluster's nodes, fail this member's running jobs
    # (Missing) and delete the other cluster's gpufed Jobs as orphans.
    store = MetaStore()
    ctrl = controller(store)
    first = hello()
    first.cluster_uid = "uid-of-us-east"
    real = ctrl.open_session("m1", first)
    assert ctrl.members["m1"].meta.cluster_uid == "uid-of-us-east", "recorded at first join"
    await settle()
    assert [meta.cluster_uid for _, meta in store.metas] == ["uid-of-us-east"], "and stored"
    wrong = hello()
    wrong.cluster_uid = "uid-of-eu"
    with pytest.raises(StreamClosedError) as err:
        ctrl.open_session("m1", wrong)
    assert err.value.code == "PERMISSION_DENIED"
    assert "uid-of-us-east" in err.value.reason
    assert "uid-of-eu" in err.value.reason
    assert ctrl.members["m1"].session is real
    assert real.closed is None
    # An agent that cannot tell (an older one, or no access to kube-system) is let in.
    assert ctrl.open_session("m1", hello()) is not real


async def test_deleting_the_member_forgets_its_cluster_identity() -> None:
    ctrl = controller()
    first = hello()
    first.cluster_uid = "old"
    ctrl.open_session("m1", first)
    ctrl._member_gone("m1")
    rebuilt = hello()
    rebuilt.cluster_uid = "new"
    ctrl.open_session("m1", rebuilt)
    assert ctrl.members["m1"].meta.cluster_uid == "new"


async def test_a_returned_member_is_unmarked_in_the_store_at_once_not_at_the_next_flush() -> None:
    # The e2e hub-outage drill caught a hub killed within the 2 s flush after a lost member
    # came back: restarted, it read the old lost mark and showed the member as lost again.
    store = MetaStore()
    ctrl = controller(store)
    written: list[dict[str, Any]] = []
    ctrl.member_status.submit = lambda name, payload, **kw: written.append(payload)  # type: ignore[method-assign]
    m = core.MemberState("m1", spec=MemberClusterSpec(join_token_ref=SecretKeyRef(name="t")))
    m.meta = m.meta.model_copy(update={"lost_at": 1_000.0})
    m.health = "Lost"
    ctrl.members["m1"] = m
    ctrl._heard(m)
    await settle()
    assert [(c, meta.lost_at) for c, meta in store.metas] == [("m1", None)]
    assert not m.meta_dirty
    # The status written at the return says Ready and carries no lostTime (it used to until
    # the next periodic write, and a hub killed before that left it on the MemberCluster).
    assert written, "the return writes the member status at once"
    assert written[-1].get("lostTime") is None
    ready = next(c for c in written[-1]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"


async def test_a_status_sent_before_the_new_leaders_job_list_is_applied_after_it() -> None:
    # From the crash-consistency review: after a long etcd outage the agents reconnected to the
    # new leader and sent their jobs' final status before its GPUJob list was in; the hub
    # dropped them and 16 finished jobs stayed Running for good (an agent sends a status once).
    from gpufed.api.work import WorkloadStatus
    from gpufed.hub.records import JobRecord, WorkRecord
    from gpufed.hub.store import Loaded

    ctrl = controller()
    ctrl._restore(
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
    ctrl._member("m1").spec = MemberClusterSpec(join_token_ref=SecretKeyRef(name="t"))
    session = ctrl.open_session("m1", hello())
    ctrl._on_workload(session, WorkloadStatus(job_uid="u1", revision=7, phase="Succeeded"))
    assert "u1" not in ctrl.jobs  # the list is not in yet
    ctrl._on_job_event(WatchEvent("ADDED", job_obj("u1")))
    ctrl._jobs_listed()
    assert ctrl.jobs["u1"].status.phase == "Succeeded"
    assert ctrl.jobs["u1"].status.cluster == "m1"
