"""Outages of the hub and of etcd.

* The hub down for longer than the member lease, then restarted: it counts every member's
  silence from its own start, so no member is declared lost and no job is touched; a job that
  finished meanwhile is reported once the agents are back (docs/design.md §7 item 5).
* etcd (the sandbox's one etcd: every API server and the hub's state) killed and started
  again: the hub stops leading while etcd is gone and resumes afterwards without losing or
  duplicating anything.
"""

from __future__ import annotations

import time

import pytest

from gpufed.sandbox.supervisor import http_ok
from tests.e2e.harness import E2E, batch_job, unique, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def _lost_marks(e2e: E2E) -> dict[str, str]:
    """Members the hub ever declared lost: lostTime set or Ready reason ClusterLost."""
    marks = {}
    for m in e2e.members:
        st = e2e.hub.member(m).status
        reason = e2e.hub.member_condition(m)[1]
        if (st is not None and st.lost_time is not None) or reason == "ClusterLost":
            marks[m] = reason
    return marks


def test_hub_down_longer_than_the_lease_declares_no_member_lost_and_touches_no_job(
    e2e: E2E,
) -> None:
    hub = e2e.hub
    # An earlier drill may have had a member lost; start once its return shows in the status,
    # so any lost mark seen below is the restarted hub's own.
    wait_until(lambda: _lost_marks(e2e) == {}, "no lost marks left by earlier drills", 30)
    steady = unique("steady")
    steady_uid = hub.submit(steady, batch_job(2))["metadata"]["uid"]
    finishing = unique("finishing")
    hub.submit(finishing, batch_job(1, run_for="4s"))
    before = hub.wait_phase(steady, "Running")
    hub.wait_phase(finishing, "Running")
    (copy,) = e2e.members[before["cluster"]].jobs_of(steady_uid)

    e2e.kill("hub")
    # The outage itself is the point: keep the hub away for twice the member lease (and long
    # enough for the finishing job to end meanwhile).
    time.sleep(2 * e2e.options.member_lease_s)
    e2e.start("hub")
    seen: dict[str, str] = {}

    def healthy() -> bool:
        seen.update(_lost_marks(e2e))
        return all(hub.member_ready(m) for m in e2e.members)

    wait_until(healthy, "every member Ready on the restarted hub", 60)
    assert seen == {}
    st = hub.wait_phase(finishing, "Succeeded", timeout_s=30)
    assert st["succeeded"] == 1
    after = hub.status(steady)
    assert (after["phase"], after["cluster"]) == ("Running", before["cluster"])
    assert [c["type"] for c in after["conditions"]] == [c["type"] for c in before["conditions"]]
    assert [j.metadata.uid for j in e2e.members[before["cluster"]].jobs_of(steady_uid)] == [
        copy.metadata.uid
    ]
    assert "ClusterLost" not in {*hub.events(steady), *hub.events(finishing)}
    assert _lost_marks(e2e) == {}


def test_etcd_restart_pauses_the_hub_which_resumes_without_losing_or_duplicating(
    e2e: E2E,
) -> None:
    hub = e2e.hub
    cp = e2e.info.control_plane
    assert cp is not None
    before = unique("before")
    before_uid = hub.submit(before, batch_job(4))["metadata"]["uid"]
    cluster = hub.wait_phase(before, "Running")["cluster"]
    (copy,) = e2e.members[cluster].jobs_of(before_uid)

    e2e.kill("etcd")
    wait_until(lambda: not http_ok(f"{cp.hub_http}/leaderz"), "the hub to stop leading", 30)
    assert e2e.running("hub")  # paused, not dead
    e2e.start("etcd")
    e2e.wait_healthy(120)

    after = unique("after")
    after_uid = hub.submit(after, batch_job(4))["metadata"]["uid"]
    hub.wait_phase(after, "Running", timeout_s=60)
    st = hub.status(before)
    assert (st["phase"], st["cluster"]) == ("Running", cluster)
    assert {j.metadata.uid for j in e2e.members[cluster].jobs_of(before_uid)} == {copy.metadata.uid}
    for uid in (before_uid, after_uid):
        assert sum(len(v) for v in e2e.copies(uid).values()) == 1
    assert sorted(j["metadata"]["name"] for j in hub.jobs()) == sorted([before, after])


def test_a_member_whose_api_server_is_down_while_its_agent_runs_turns_not_ready_then_ready(
    e2e: E2E,
) -> None:
    # Its agent kept the stream open, so the member stayed Ready and work sent there was
    # retried every 5 s forever with nothing in the jobs' status.
    hub = e2e.hub
    member = sorted(e2e.members)[0]
    wait_until(lambda: hub.member_ready(member), f"{member} Ready before the drill", 60)
    e2e.kill(f"apiserver/{member}")
    try:
        status, _reason = wait_until(
            lambda: (c := hub.member_condition(member))[1] == "MemberAPIUnreachable" and c,
            f"{member} NotReady with reason MemberAPIUnreachable",
            60,
        )
        assert status == "False"
        assert e2e.running(f"agent/{member}"), "the agent itself kept running"
    finally:
        e2e.start(f"apiserver/{member}")
    wait_until(lambda: hub.member_ready(member), f"{member} Ready again", 90)
    e2e.wait_healthy()
