"""Re-runs after infrastructure failures (gpufed.hub.components.lifecycle, rule 5) through a real leader term over
typed fakes: an infrastructure cause requeues the job through hub.requeue (never Failed in
between), the new attempt avoids the suspect node and its pods learn the attempt; an
application failure stays Failed; a job without re-runs left fails for good."""

from __future__ import annotations

import json
from typing import Any

from gpufed.api.stream import InventoryDelta
from gpufed.api.work import Condition, FailureCause, WorkAck, WorkloadStatus
from gpufed.hub.adapters.ports import WatchEvent
from tests.unit.hub.builders import hgx_node
from tests.unit.hub.term import Term, running, sent, settle


def report(uid: str, rev: int, phase: str, failure: FailureCause | None) -> WorkloadStatus:
    return WorkloadStatus(
        job_uid=uid, revision=rev, kind="Job.batch", name="j", phase=phase, failure=failure
    )  # type: ignore[arg-type]


NODE_LOST = FailureCause(
    kind="Infrastructure", reason="NodeLost", message="node m1-n0 was deleted", nodes=("m1-n0",)
)


def _manifest_env(t: Term, cluster: str, uid: str) -> tuple[str, list[dict[str, Any]]]:
    work = t.store.work[(cluster, uid)][0]
    [job] = [json.loads(m) if isinstance(m, (str, bytes)) else m for m in work.manifests]
    pod = job["spec"]["template"]
    return pod["metadata"]["annotations"]["gpufed.io/attempt"], pod["spec"]["containers"][0]["env"]


async def test_a_lost_node_re_runs_the_job_elsewhere_as_attempt_2() -> None:
    t, s, rev = await running()
    job = t.ctrl.state.jobs["u1"]
    assert _manifest_env(t, "m1", "u1")[0] == "1"
    await t.ctrl.handle(s, report("u1", rev, "Running", NODE_LOST))
    await settle()
    record = t.store.jobs["u1"][0]
    assert record.stopping is not None
    assert record.stopping.kind == "InfrastructureFailure"
    [(op, _, del_rev)] = sent(s)
    assert op == "delete"
    restarting = next(c for c in job.status.conditions if c.type == "Restarting")
    assert restarting.status == "True"
    assert restarting.reason == "NodeLost"
    # The member's Job fails meanwhile: never shown Failed, the re-run is under way.
    await t.ctrl.handle(s, report("u1", rev, "Failed", NODE_LOST))
    await settle()
    assert job.status.phase != "Failed"
    await t.ctrl.handle(s, WorkAck(job_uid="u1", revision=del_rev, result="Deleted"))
    t.ctrl.members.on_delta(
        t.ctrl.state.members["m1"], InventoryDelta(seq=3, upserts=(hgx_node("m1-n0"),))
    )
    await settle()
    assert job.status.phase == "Pending"
    assert job.status.restarts == 1
    [entry] = job.status.restart_history
    assert (entry.attempt, entry.cluster, entry.nodes, entry.reason) == (
        1,
        "m1",
        ["m1-n0"],
        "NodeLost",
    )
    # The backoff before the first re-run (--rerun-backoff-base, 60 s): not placed before.
    assert job.status.next_attempt_at is not None
    assert t.store.jobs["u1"][0].not_before == t.clock.wall() + 60
    await t.ctrl.scheduler.cycle()
    assert job.status.attempt == 1, "re-run before its backoff passed"
    t.clock.advance(59)
    await t.ctrl.lifecycle.due()
    await t.ctrl.scheduler.cycle()
    assert job.status.attempt == 1, "re-run before its backoff passed"
    t.clock.advance(1)
    await t.ctrl.lifecycle.due()
    # m1-n0 is idle again in the inventory, but suspect: the new attempt goes to m1-n1.
    await t.ctrl.scheduler.cycle()
    assert job.status.attempt == 2
    assert job.status.next_attempt_at is None
    assert job.status.placement.pod_sets[0].nodes == {"m1-n1": 1}  # type: ignore[union-attr]
    attempt, env = _manifest_env(t, "m1", "u1")
    assert attempt == "2"
    assert {"name": "GPUFED_ATTEMPT", "value": "2"} in env
    assert [x.node for x in t.ctrl.suspects.of_member("m1", t.ctrl._term.mono())] == ["m1-n0"]


async def test_an_application_failure_stays_failed_and_nothing_is_deleted() -> None:
    t, s, rev = await running()
    app_fail = FailureCause(kind="Application", reason="BackoffLimitExceeded", exit_codes=(1,))
    await t.ctrl.handle(s, report("u1", rev, "Failed", app_fail))
    await settle()
    job = t.ctrl.state.jobs["u1"]
    assert job.status.phase == "Failed"
    assert not job.status.restarts
    assert t.store.jobs["u1"][0].stopping is None
    assert [x for x in sent(s) if x[0] == "delete"] == []


async def test_a_declared_exit_code_is_an_infrastructure_failure() -> None:
    t, s, rev = await running({"retry": {"infrastructureExitCodes": [134]}})
    xid = FailureCause(kind="Application", reason="BackoffLimitExceeded", exit_codes=(134,))
    await t.ctrl.handle(s, report("u1", rev, "Failed", xid))
    await settle()
    record = t.store.jobs["u1"][0]
    assert record.stopping is not None
    assert record.stopping.reason == "InfrastructureExitCode"


async def test_without_re_runs_left_the_job_fails_for_good() -> None:
    t, s, rev = await running({"retry": {"onInfrastructureFailure": 0}})
    await t.ctrl.handle(s, report("u1", rev, "Running", NODE_LOST))
    await settle()
    job = t.ctrl.state.jobs["u1"]
    assert job.status.phase == "Failed"
    cond = next(c for c in job.status.conditions if c.type == "InfrastructureFailure")
    assert (cond.status, cond.reason) == ("True", "RetriesExhausted")
    assert t.store.jobs["u1"][0].stopping is None
    assert [x for x in sent(s) if x[0] == "delete"] == []


async def test_suspect_nodes_show_in_the_member_status_and_get_clusters() -> None:
    from gpufed.cli.jobs import cluster_rows, explain_text

    t, s, rev = await running()
    await t.ctrl.handle(s, report("u1", rev, "Running", NODE_LOST))
    await settle()
    seen: list[Any] = []
    t.ctrl.mirror.member_status = lambda name, status: seen.append(status)  # type: ignore[method-assign]
    t.ctrl.members.write_status(t.ctrl.state.members["m1"])
    [status] = seen
    assert [x.node for x in status.suspect_nodes] == ["m1-n0"]
    assert "NodeLost" in status.suspect_nodes[0].reason
    raw = {
        "apiVersion": "gpufed.io/v1alpha1",
        "kind": "MemberCluster",
        "metadata": {"name": "m1"},
        "spec": {"joinTokenRef": {"name": "t"}},
        "status": status.model_dump(by_alias=True, exclude_none=True, mode="json"),
    }
    [row] = cluster_rows([raw])
    assert [x["node"] for x in row["suspect_nodes"]] == ["m1-n0"]
    # and explain names the restart once the copy is gone
    job = t.ctrl.state.jobs["u1"]
    [(_, _, del_rev)] = sent(s)
    await t.ctrl.handle(s, WorkAck(job_uid="u1", revision=del_rev, result="Deleted"))
    t.ctrl.members.on_delta(
        t.ctrl.state.members["m1"], InventoryDelta(seq=3, upserts=(hgx_node("m1-n0"),))
    )
    await settle()
    text = explain_text(
        {
            "apiVersion": "gpufed.io/v1alpha1",
            "kind": "GPUJob",
            "metadata": {"name": "j", "namespace": "team-a", "uid": "u1"},
            "spec": {"template": {"apiVersion": "batch/v1", "kind": "Job", "spec": {}}},
            "status": job.status.model_dump(by_alias=True, exclude_none=True, mode="json"),
        }
    )
    assert "restarted 1 time(s)" in text
    assert "attempt 1 in m1 on m1-n0: NodeLost" in text
    assert "Restarting=True" in text


async def test_the_retry_budget_counts_across_attempts() -> None:
    """Re-placed after one re-run, the job keeps its requeue count: with a budget of 1 the
    second infrastructure failure is final (a re-placement that forgot it would loop)."""
    t, s, rev = await running({"retry": {"onInfrastructureFailure": 1}})
    job = t.ctrl.state.jobs["u1"]
    await t.ctrl.handle(s, report("u1", rev, "Running", NODE_LOST))
    await settle()
    [(_, _, del_rev)] = sent(s)
    await t.ctrl.handle(s, WorkAck(job_uid="u1", revision=del_rev, result="Deleted"))
    t.ctrl.members.on_delta(
        t.ctrl.state.members["m1"], InventoryDelta(seq=3, upserts=(hgx_node("m1-n0"),))
    )
    await settle()
    t.clock.advance(60)
    await t.ctrl.lifecycle.due()
    await t.ctrl.scheduler.cycle()
    assert t.store.jobs["u1"][0].requeue_counts == {"InfrastructureFailure": 1}
    [(_, _, rev2)] = [x for x in sent(s) if x[0] == "apply"]
    await t.ctrl.handle(s, WorkAck(job_uid="u1", revision=rev2, result="Applied"))
    lost2 = NODE_LOST.model_copy(update={"nodes": ("m1-n1",), "message": "node m1-n1 gone"})
    await t.ctrl.handle(s, report("u1", rev2, "Running", lost2))
    await settle()
    assert job.status.phase == "Failed"
    assert job.status.restarts == 1


async def test_the_jobs_node_grace_reaches_the_agent_with_its_manifests() -> None:
    """spec.placement.retry.nodeNotReadySeconds: 0 goes to the member as the annotation the
    agent reads (node_not_ready_of); a job that does not say gets none (the agent's 300 s)."""
    from gpufed.sync.manifests import node_not_ready_of

    t, _s, _rev = await running({"retry": {"nodeNotReadySeconds": 0}})
    work = t.store.work[("m1", "u1")][0]
    manifests = [json.loads(m) if isinstance(m, (str, bytes)) else m for m in work.manifests]
    assert node_not_ready_of(manifests) == 0
    t2, _s2, _rev2 = await running()
    work2 = t2.store.work[("m1", "u1")][0]
    plain = [json.loads(m) if isinstance(m, (str, bytes)) else m for m in work2.manifests]
    assert "gpufed.io/node-not-ready-seconds" not in plain[0]["metadata"]["annotations"]


async def test_suspect_marks_survive_a_leader_change_until_their_expiry() -> None:
    # issue 24 item 3: the marks were leader memory; a new leader placed on the broken node.
    t, s, rev = await running()
    await t.ctrl.handle(s, report("u1", rev, "Running", NODE_LOST))
    await settle()
    await t.ctrl.members.flush()
    t.clock.advance(600)
    successor = Term(store=t.store, kube=t.kube, clock=t.clock)
    await successor.ctrl.load()
    [mark] = successor.ctrl.suspects.of_member("m1", t.clock.mono())
    assert mark.node == "m1-n0"
    assert mark.until_wall == t.clock.wall() - 600 + 3600, "the same expiry, not a new one"
    t.clock.advance(3000)
    assert successor.ctrl.suspects.of_member("m1", t.clock.mono()) == []


async def test_the_marks_are_stored_with_the_rerun_decision_not_at_the_next_flush() -> None:
    # A leader that dies right after storing the re-run (no flush since the failure) must
    # leave the marks behind, or its successor places the re-run on the broken node.
    t, s, rev = await running()
    await t.ctrl.handle(s, report("u1", rev, "Running", NODE_LOST))
    await settle()
    assert t.store.jobs["u1"][0].stopping is not None, "the re-run decision is stored"
    successor = Term(store=t.store, kube=t.kube, clock=t.clock)  # no members.flush()
    await successor.ctrl.load()
    assert [m.node for m in successor.ctrl.suspects.of_member("m1", t.clock.mono())] == ["m1-n0"]


async def test_a_suspicion_is_shown_at_once_and_gone_when_the_node_recovers() -> None:
    # issue 24 item 1, the hub side: condition NodeNotReady and a Warning Event while the
    # agent's grace period runs; no re-run, no suspect mark; gone once the node is Ready.
    t, s, rev = await running()
    job = t.ctrl.state.jobs["u1"]
    suspicion = Condition(
        type="NodeNotReady",
        status="True",
        reason="NodeNotReady",
        message="node m1-n0 not Ready since 2026-01-01T00:00:00Z; an infrastructure failure "
        "at 2026-01-01T00:05:00Z unless it recovers",
        last_transition_time="2026-01-01T00:00:00Z",
    )
    blip = report("u1", rev, "Running", None).model_copy(update={"conditions": (suspicion,)})
    await t.ctrl.handle(s, blip)
    await t.ctrl.handle(s, blip)
    await settle()
    [cond] = [c for c in job.status.conditions if c.type == "NodeNotReady"]
    assert (cond.status, cond.last_transition_time) == ("True", "2026-01-01T00:00:00Z")
    assert [r for _, r, _ in t.kube.events].count("NodeNotReady") == 1, (
        "one Event, not one a report"
    )
    await t.ctrl.handle(s, report("u1", rev, "Running", None))
    await settle()
    assert not [c for c in job.status.conditions if c.type == "NodeNotReady"]
    assert job.status.phase == "Running"
    assert t.store.jobs["u1"][0].stopping is None
    assert t.ctrl.suspects.of_member("m1", t.clock.mono()) == []


async def test_the_backoff_and_the_retry_budget_survive_a_leader_change() -> None:
    """Issue 24 item 3: a new leader (or a restarted hub) over the same etcd keeps the re-run's
    backoff (not placed before ``not_before``) and the budget already used (with a budget of 1
    the next infrastructure failure is final, not a fresh start)."""
    t, s, rev = await running({"retry": {"onInfrastructureFailure": 1}})
    await t.ctrl.handle(s, report("u1", rev, "Running", NODE_LOST))
    await settle()
    [(_, _, del_rev)] = sent(s)
    await t.ctrl.handle(s, WorkAck(job_uid="u1", revision=del_rev, result="Deleted"))
    t.ctrl.members.on_delta(
        t.ctrl.state.members["m1"], InventoryDelta(seq=3, upserts=(hgx_node("m1-n0"),))
    )
    await settle()
    await t.ctrl.members.flush()  # the suspect mark in the member's meta record
    not_before = t.store.jobs["u1"][0].not_before
    assert not_before == t.clock.wall() + 60
    t.clock.advance(30)
    # A new leader term over the same etcd and hub API.
    t2 = Term(store=t.store, kube=t.kube, clock=t.clock)
    await t2.ctrl.load()
    t2.member("m1", hgx_node("m1-n0"), hgx_node("m1-n1"))
    s2 = t2.connect("m1")
    for obj in t.kube.objects["gpujobs"]:
        t2.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()
    job = t2.ctrl.state.jobs["u1"]
    await t2.ctrl.lifecycle.due()
    await t2.ctrl.scheduler.cycle()
    record = t2.store.jobs["u1"][0]
    assert record.cluster is None, "the new leader re-ran it before its backoff passed"
    assert (record.not_before, record.budget_used) == (not_before, 1)
    t.clock.advance(30)
    await t2.ctrl.lifecycle.due()
    await t2.ctrl.scheduler.cycle()
    record = t2.store.jobs["u1"][0]
    assert (record.cluster, record.attempt) == ("m1", 2)
    assert job.status.placement.pod_sets[0].nodes == {"m1-n1": 1}  # type: ignore[union-attr]
    [(_, _, rev2)] = [x for x in sent(s2) if x[0] == "apply"]
    await t2.ctrl.handle(s2, WorkAck(job_uid="u1", revision=rev2, result="Applied"))
    lost2 = NODE_LOST.model_copy(update={"nodes": ("m1-n1",), "message": "node m1-n1 gone"})
    await t2.ctrl.handle(s2, report("u1", rev2, "Running", lost2))
    await settle()
    assert job.status.phase == "Failed", "the budget used before the failover was forgotten"
    assert "no re-run left (1 used" in job.status.message
