"""A hub that lost (or restored an old copy of) its etcd state rebuilds its placements from the
GPUJob status and the agents' held jobs (gpufed.hub.components.rebuild), places none of them a second
time, and sends no Delete while it does; its Welcome carries the state epoch."""

from __future__ import annotations

from typing import Any

from gpufed.api.gpujob import GPUJobStatus
from gpufed.api.stream import AgentHello, HeldJob
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.adapters.sessions import PROTOCOL_VERSION
from gpufed.hub.components.term import Claim, claim_of
from gpufed.hub.rules.records import JobRecord, WorkRecord
from tests.unit.hub.builders import batch_job, gpujob_obj, hgx_node
from tests.unit.hub.term import Term, sent, settle


def record(cluster: str | None, attempt: int = 1) -> JobRecord:
    return JobRecord(uid="u1", job="team-a/j", cluster=cluster, attempt=attempt)


def test_the_status_wins_over_no_record_and_over_an_older_record() -> None:
    st = GPUJobStatus(phase="Running", cluster="b", attempt=2)
    assert claim_of(None, st, ()) == Claim("b", 2, "status")
    assert claim_of(record("a", 1), st, ()) == Claim("b", 2, "status")
    assert claim_of(record("a", 2), st, ()) is None  # equal attempt: the durable record wins
    assert claim_of(record("b", 2), st, ()) is None
    # A status from before attempts were written counts as attempt 1.
    assert claim_of(None, GPUJobStatus(phase="Placed", cluster="a"), ()) == Claim("a", 1, "status")


def test_without_a_member_in_the_status_exactly_one_holding_agent_wins() -> None:
    st = GPUJobStatus(phase="Pending")
    assert claim_of(None, st, ["a"]) == Claim("a", 1, "agent")
    assert claim_of(None, st, ["a", "b"]) is None
    assert claim_of(None, st, ()) is None
    assert claim_of(record("a"), st, ["b"]) is None


def running_on(cluster: str, uid: str = "u1", attempt: int | None = 1) -> dict[str, Any]:
    obj = gpujob_obj("j", uid, template=batch_job(8))
    obj["status"] = {"phase": "Running", "cluster": cluster, "gpus": 8}
    if attempt is not None:
        obj["status"]["attempt"] = attempt
    return obj


async def see(t: Term, obj: dict[str, Any]) -> None:
    t.kube.objects["gpujobs"].append(obj)
    t.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()


async def test_wiped_state_adopts_the_running_job_and_never_places_it() -> None:
    t = Term()
    await t.ctrl.load()  # an empty etcd: a new epoch
    assert t.store.epoch_id is not None
    t.member("m1", hgx_node("n1"))
    await see(t, running_on("m1"))
    await t.ctrl.scheduler.cycle()
    assert "place" not in t.store.calls
    assert "adopt" in t.store.calls
    rec, _ = t.store.jobs["u1"]
    assert (rec.cluster, rec.attempt) == ("m1", 1)
    assert t.store.acks[("m1", "u1")].applied  # it ran: never created again
    assert t.store.reservations == {}  # the member's inventory counts its pods
    s = t.connect("m1")
    first = s.outbox.get_nowait()
    assert first is not None
    assert first.welcome.hub_epoch == t.ctrl.epoch
    out = sent(s)
    assert ("desired_set", "u1", 0) in out
    assert not any(op == "delete" for op, _, _ in out)
    assert t.ctrl.state.work[("m1", "u1")].applied_before  # the agent adopts, never creates


async def test_an_old_backup_record_loses_to_a_newer_status_and_nothing_is_deleted() -> None:
    t = Term()
    # Restored from a backup: the record says m1 attempt 1; the GPUJob says m2 attempt 2.
    t.store.epoch_id = "old"
    t.store.jobs["u1"] = (record("m1", 1), 3)
    t.store.work[("m1", "u1")] = (
        WorkRecord(job_uid="u1", job="team-a/j", namespace="team-a", op="Apply"),
        3,
    )
    await t.ctrl.load()
    t.member("m1", hgx_node("n1"))
    t.member("m2", hgx_node("n1"))
    await see(t, running_on("m2", attempt=2))
    rec, _ = t.store.jobs["u1"]
    assert (rec.cluster, rec.attempt) == ("m2", 2)
    assert ("m1", "u1") not in t.store.work  # forgotten, not turned into a Delete
    old = t.connect("m1")
    assert not any(op == "delete" for op, _, _ in sent(old))


async def test_a_job_only_its_agent_knows_is_adopted_on_that_member() -> None:
    t = Term()
    await t.ctrl.load()
    t.member("m1", hgx_node("n1"))
    await see(t, gpujob_obj("j", "u1", template=batch_job(8)))  # no status: never written
    t.ctrl.open_session(
        AgentHello(
            cluster="m1",
            protocol_version=PROTOCOL_VERSION,
            held_jobs=(HeldJob(job_uid="u1", hub_epoch="gone", kind="Job.batch", name="x"),),
        )
    )
    await settle()
    await t.ctrl.scheduler.cycle()
    assert "place" not in t.store.calls
    assert t.store.jobs["u1"][0].cluster == "m1"


async def test_held_jobs_without_a_gpujob_are_counted_not_deleted() -> None:
    t = Term()
    await t.ctrl.load()
    t.member("m1", hgx_node("n1"))
    t.ctrl.state.jobs_listed.set()
    s = t.ctrl.open_session(
        AgentHello(
            cluster="m1", protocol_version=PROTOCOL_VERSION, held_jobs=(HeldJob(job_uid="zz"),)
        )
    )
    assert not any(op == "delete" for op, _, _ in sent(s))
    metric = t.ctrl.metrics.rebuild_unclaimed.labels("m1")._value.get()
    assert metric == 1


async def test_the_epoch_is_written_once_and_kept_across_restarts() -> None:
    t = Term()
    await t.ctrl.load()
    first = t.ctrl.epoch
    again = Term(store=t.store)
    await again.ctrl.load()
    assert again.ctrl.epoch == first
    assert t.store.calls.count("ensure_epoch") == 1
