"""A member whose agent stops (docs/design.md §7 item 5, docs/hub.md "Members: membership, health,
loss"), with the session's timers: member lease 5 s, member-lost timeout 30 s.

1. within its lease the member turns NotReady (``LeaseExpired``): its jobs are untouched and
   it gets no new job;
2. after the member-lost timeout it is lost (``ClusterLost``): a ``reschedule: Never`` job
   turns ``Lost``, a ``reschedule: OnClusterLoss`` job is placed again in another member;
3. when the agent returns: the member is Ready again, the rescheduled job's old copy is deleted
   (fenced), the lost job's copy stays and is not re-run, and the waiting job is placed there.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.harness import E2E, batch_job, unique, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

#: Slack on the hub's timers: the member status is written every 2 s and the machine is slow.
SLACK_S = 6.0


def _condition_reasons(status: dict[str, object]) -> set[str]:
    return {str(c.get("reason")) for c in status.get("conditions") or []}  # type: ignore[union-attr]


def test_a_member_whose_agent_stops_turns_not_ready_then_lost_and_its_jobs_follow_policy(
    e2e: E2E,
) -> None:
    hub = e2e.hub
    lease, lost = e2e.options.member_lease_s, e2e.options.member_lost_s
    training = {"clusterSelector": {"matchLabels": {"tier": "training"}}}
    moving = unique("moving")
    moving_uid = hub.submit(
        moving, batch_job(4), placement={**training, "reschedule": "OnClusterLoss"}
    )["metadata"]["uid"]
    x = hub.wait_phase(moving, "Running")["cluster"]
    (y,) = {"us-east-hgx", "eu-nvl72"} - {x}
    region = {"matchLabels": {"region": hub.member(x).spec.labels["region"]}}
    staying = unique("staying")
    staying_uid = hub.submit(staying, batch_job(4), placement={"clusterSelector": region})[
        "metadata"
    ]["uid"]
    assert hub.wait_phase(staying, "Running")["cluster"] == x
    (staying_copy,) = e2e.members[x].jobs_of(staying_uid)

    # 1. The agent stops: NotReady within the lease, jobs untouched, no new work.
    e2e.kill(f"agent/{x}")
    stopped = time.monotonic()
    wait_until(
        lambda: hub.member_condition(x) == ("False", "LeaseExpired"),
        f"{x} NotReady (LeaseExpired)",
        lease + SLACK_S,
    )
    waiting = unique("waiting")
    hub.submit(waiting, batch_job(2), placement={"clusterSelector": region})
    st = wait_until(
        lambda: (s := hub.status(waiting)).get("placement") and s,
        "a decision for the new job",
        20,
    )
    assert st["phase"] == "Pending"
    assert "NotReady" in st["message"]
    for name in (moving, staying):
        assert hub.status(name)["phase"] == "Running"
        assert hub.status(name)["cluster"] == x
    assert time.monotonic() - stopped < lost  # all of the above before the lost timeout

    # 2. The member-lost timeout: Never -> Lost; OnClusterLoss -> placed again elsewhere.
    wait_until(
        lambda: hub.member_condition(x) == ("False", "ClusterLost"),
        f"{x} lost (ClusterLost)",
        lost + SLACK_S,
    )
    st = hub.wait_phase(staying, "Lost", timeout_s=SLACK_S)
    assert "ClusterLost" in _condition_reasons(st)
    # Running on y, not the last status shown on x: a non-terminal status change is written
    # status_hold_s (1 s) after it happened, so Running on x can still show just after
    # the staying job turned Lost.
    st = wait_until(
        lambda: (s := hub.status(moving)).get("phase") == "Running" and s.get("cluster") == y and s,
        f"{moving} Running on {y}",
        30,
    )
    assert st["cluster"] == y
    assert len(e2e.members[y].jobs_of(moving_uid)) == 1
    assert hub.status(waiting)["phase"] == "Pending"

    # 3. The agent returns: Ready again, the fenced copy is deleted, the lost job's copy stays.
    e2e.start(f"agent/{x}")
    wait_until(lambda: hub.member_ready(x), f"{x} Ready again", 30)
    wait_until(lambda: e2e.members[x].jobs_of(moving_uid) == [], "the old copy fenced off", 30)
    assert hub.wait_phase(waiting, "Running", timeout_s=30)["cluster"] == x
    (still,) = e2e.members[x].jobs_of(staying_uid)
    assert still.metadata.uid == staying_copy.metadata.uid  # not re-created, not re-run
    assert hub.status(staying)["phase"] == "Lost"
    assert list(e2e.copies(moving_uid)) == [y]
    # Each transition is an Event on the MemberCluster (`kubectl describe membercluster` shows
    # them: they name its UID).
    uid = hub.member(x).metadata.uid
    events = hub.member_events(x)
    assert {
        ("Warning", "NotReady", uid),
        ("Warning", "Lost", uid),
        ("Normal", "Ready", uid),
    } <= set(events), events
