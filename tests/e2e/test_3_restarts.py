"""Process restarts (docs/design.md §7 item 4): nothing is created twice, nothing is forgotten.

* an agent killed and restarted: the member's objects are adopted, not re-created; the hub's
  inventory is resynced with what changed meanwhile; a job that finished meanwhile is reported;
* the hub killed after placing a job but before the member object exists, then restarted:
  exactly one member object; and the same for a burst of jobs with the hub killed mid-way;
* the hub's etcd state lost (docs/design.md §7 item 7): the hub rebuilds from the GPUJobs'
  status and the agents' held jobs; running jobs keep their member objects and pods.
"""

from __future__ import annotations

import asyncio

import aetcd
import pytest

from gpufed.hub.adapters.store import parse_endpoint
from tests.e2e.harness import E2E, H100, batch_job, unique, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def test_agent_restart_recreates_nothing_and_resyncs_the_inventory(e2e: E2E) -> None:
    hub, member = e2e.hub, e2e.members["us-east-hgx"]
    total = hub.gpus_total("us-east-hgx", H100)
    h100 = {"gpuProducts": [H100]}
    steady = unique("steady")
    steady_uid = hub.submit(steady, batch_job(8), placement=h100)["metadata"]["uid"]
    short = unique("short")
    short_uid = hub.submit(short, batch_job(1, run_for="6s"), placement=h100)["metadata"]["uid"]
    hub.wait_phase(steady, "Running")
    hub.wait_phase(short, "Running")
    (before,) = member.jobs_of(steady_uid)
    pods_before = {p.metadata.uid for p in member.pods_of(steady_uid)}
    busy = {p.spec.node_name for uid in (steady_uid, short_uid) for p in member.pods_of(uid)}
    idle = next(n for n in member.node_names() if n not in busy)

    e2e.kill("agent/us-east-hgx")
    # While the agent is away: a node is cordoned and the short job finishes in the member.
    member.cordon(idle)
    try:
        wait_until(
            lambda: any(
                c.type == "Complete" and c.status == "True"
                for c in (member.jobs_of(short_uid)[0].status.conditions or [])
            ),
            "the short job Complete in the member",
        )
        assert hub.phase(short) == "Running"  # nobody told the hub yet
        e2e.start("agent/us-east-hgx")

        wait_until(
            lambda: hub.gpus_total("us-east-hgx", H100) == total - 8,
            "the hub's inventory without the cordoned node",
            30,
        )
        st = hub.wait_phase(short, "Succeeded", timeout_s=30)
        assert st["succeeded"] == 1
        (after,) = member.jobs_of(steady_uid)
        assert after.metadata.uid == before.metadata.uid  # adopted, not re-created
        assert after.metadata.creation_timestamp == before.metadata.creation_timestamp
        assert {p.metadata.uid for p in member.pods_of(steady_uid)} == pods_before
        assert hub.phase(steady) == "Running"
        assert len(member.jobs_of(short_uid)) == 1  # the finished job is not re-run
    finally:
        member.cordon(idle, False)
    wait_until(lambda: hub.gpus_total("us-east-hgx", H100) == total, "the node back", 30)


def test_hub_killed_between_placement_and_member_create_makes_one_copy(e2e: E2E) -> None:
    hub, nvl = e2e.hub, e2e.members["eu-nvl72"]
    # With the NVL72 member's agent gone the hub can place there (the member stays Ready for
    # its 5 s lease) but nothing reaches the member: the work item waits in etcd.
    e2e.kill("agent/eu-nvl72")
    name = unique("gang")
    uid = hub.submit(name, batch_job(4, pods=8), placement={"topology": {"nvlink": "Required"}})[
        "metadata"
    ]["uid"]
    st = hub.wait_phase(name, "Placed", timeout_s=e2e.options.member_lease_s)
    assert st["cluster"] == "eu-nvl72"
    assert nvl.jobs_of(uid) == []

    e2e.kill("hub")
    e2e.start("agent/eu-nvl72")
    e2e.start("hub")
    hub.wait_phase(name, "Running", timeout_s=60)
    copies = e2e.copies(uid)
    assert list(copies) == ["eu-nvl72"]
    assert len(copies["eu-nvl72"]) == 1
    wait_until(lambda: len(nvl.pods_of(uid, running=True)) == 8, "8 pods running")


def test_hub_killed_during_a_burst_places_and_creates_every_job_once(e2e: E2E) -> None:
    hub = e2e.hub
    names = [unique(f"burst-{i:02d}") for i in range(24)]
    uids = {n: hub.submit(n, batch_job(1 + i % 4))["metadata"]["uid"] for i, n in enumerate(names)}

    def placed() -> int:
        return sum(1 for o in hub.jobs() if (o.get("status") or {}).get("cluster"))

    wait_until(lambda: placed() >= 6, "a quarter of the burst placed", 60)
    e2e.kill("hub")
    e2e.start("hub")
    for n in names:
        hub.wait_phase(n, "Running", timeout_s=60)
    for n, uid in uids.items():
        copies = e2e.copies(uid)
        assert sum(len(v) for v in copies.values()) == 1, (n, copies)
        st = hub.status(n)
        assert list(copies) == [st.get("cluster")], (n, st)


def _wipe_hub_state(e2e: E2E) -> int:
    """Delete every key under the hub's etcd prefix (the hub is stopped); the count deleted."""
    cp = e2e.info.control_plane
    assert cp is not None
    host, port = parse_endpoint(e2e.info.etcd_url.split("://", 1)[-1])

    async def wipe() -> int:
        async with aetcd.Client(host=host, port=port) as etcd:
            reply = await etcd.delete_prefix(cp.hub_etcd_prefix.encode())
            return int(reply.deleted)

    return asyncio.run(wipe())


def test_hub_state_lost_keeps_running_jobs_and_recreates_nothing(e2e: E2E) -> None:
    # Before the state epoch, the restarted hub sent every agent an empty desired set: each
    # agent deleted every labelled object and the GPUJobs were placed and run again.
    hub = e2e.hub
    names = [unique("survivor-hgx"), unique("survivor-nvl")]
    uids = {
        names[0]: hub.submit(names[0], batch_job(8), placement={"gpuProducts": [H100]}),
        names[1]: hub.submit(
            names[1], batch_job(4, pods=2), placement={"topology": {"nvlink": "Required"}}
        ),
    }
    before: dict[str, tuple[str, str, set[str]]] = {}
    for n, job in uids.items():
        uid = job["metadata"]["uid"]
        cluster = hub.wait_phase(n, "Running")["cluster"]
        member = e2e.members[cluster]
        wait_until(lambda m=member, u=uid: len(m.pods_of(u, running=True)) > 0, "pods running")
        (copy,) = member.jobs_of(uid)
        before[n] = (cluster, copy.metadata.uid, {p.metadata.uid for p in member.pods_of(uid)})

    e2e.kill("hub")
    assert _wipe_hub_state(e2e) > 0
    e2e.start("hub")
    e2e.wait_healthy(120)

    after = unique("after-wipe")
    after_uid = hub.submit(after, batch_job(1, run_for="3s"))["metadata"]["uid"]
    hub.wait_phase(after, "Succeeded", timeout_s=60)
    for n, job in uids.items():
        uid = job["metadata"]["uid"]
        cluster, copy_uid, pods = before[n]
        st = hub.status(n)
        assert (st["phase"], st["cluster"]) == ("Running", cluster), (n, st)
        copies = e2e.copies(uid)
        assert list(copies) == [cluster], (n, copies)
        assert [j.metadata.uid for j in copies[cluster]] == [copy_uid]  # never re-created
        assert {p.metadata.uid for p in e2e.members[cluster].pods_of(uid)} == pods
    assert sum(len(v) for v in e2e.copies(after_uid).values()) == 1
