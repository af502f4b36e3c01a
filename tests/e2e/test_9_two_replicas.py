"""Two hub replicas in the sandbox, as the Deployment runs them (docs/hub.md, "Replicas"): both
answer ``/readyz`` 200, each labels its own Pod ``gpufed.io/hub-role`` and a Service that
selects ``leader`` (:class:`gpufed.sandbox.hubpair.HubPair`: a TCP forwarder on the address the
agents dial, choosing the Ready Pod labelled leader on each new connection, as kube-proxy
follows the EndpointSlice) brings every agent to the leader. The leader is killed (SIGKILL, no
resignation): the other replica leads, relabels its Pod, the agents reconnect through the same
address, and no job is lost or duplicated. The drill's timeline is printed.

The sandbox's own hub is stopped for the drill (its gRPC port becomes the Service's) and is
started again afterwards (the ``hub_pair`` fixture).
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import pytest
from kubernetes import client as k8s

from gpufed.api.labels import HUB_ROLE_LABEL
from gpufed.sandbox.controlplane import TOKEN_NAMESPACE
from gpufed.sandbox.hubpair import REPLICAS, HubPair
from tests.e2e.harness import E2E, batch_job, http_status, unique, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def metric(pair: HubPair, replica: str, name: str) -> float | None:
    """The value of an unlabelled metric on ``replica`` (None: no answer or no such line)."""
    try:
        with urllib.request.urlopen(pair.url(replica, "/metrics"), timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    return None


def pod_name(replica: str) -> str:
    return "gpufed-" + replica.replace("/", "-")


def test_both_replicas_are_ready_agents_follow_the_leader_and_a_killed_leader_loses_nothing(
    e2e: E2E, hub_pair: HubPair
) -> None:
    pair = hub_pair
    core: Any = k8s.CoreV1Api(e2e.info.api_client("hub"))
    agents = len(e2e.members)
    t0 = time.monotonic()
    timeline: list[tuple[float, str]] = []

    def mark(what: str) -> None:
        timeline.append((time.monotonic() - t0, what))

    def role(replica: str) -> str | None:
        labels = core.read_namespaced_pod(pod_name(replica), TOKEN_NAMESPACE).metadata.labels
        return (labels or {}).get(HUB_ROLE_LABEL)

    def status(replica: str, path: str) -> int | None:
        return http_status(pair.url(replica, path))

    def leader() -> str | None:
        return next((r for r in REPLICAS if status(r, "/leaderz") == 200), None)

    first = wait_until(leader, "a replica to lead", 90)
    [standby] = [r for r in REPLICAS if r != first]
    mark(f"{first} leads")
    wait_until(
        lambda: all(status(r, "/readyz") == 200 for r in REPLICAS), "both replicas Ready", 60
    )
    mark("both replicas answer /readyz 200")
    wait_until(lambda: role(first) == "leader" and role(standby) == "standby", "roles")
    mark(f"Pods labelled: {first}=leader, {standby}=standby")
    wait_until(
        lambda: metric(pair, first, "gpufed_agents_connected") == agents,
        "agents on the leader",
        90,
    )
    assert metric(pair, standby, "gpufed_agents_connected") == 0.0
    assert status(standby, "/leaderz") == 503
    mark(f"{agents} agents connected to {first}, none to {standby}")

    hub = e2e.hub
    before = unique("before")
    before_uid = hub.submit(before, batch_job(4))["metadata"]["uid"]
    cluster = hub.wait_phase(before, "Running", timeout_s=90)["cluster"]
    (copy,) = e2e.members[cluster].jobs_of(before_uid)
    mark(f"job {before} Running on {cluster}")

    e2e.kill(first)
    t_kill = time.monotonic()
    mark(f"{first} killed (SIGKILL, no resignation)")
    wait_until(lambda: status(standby, "/leaderz") == 200, f"{standby} to lead", 60)
    mark(f"{standby} leads")
    wait_until(lambda: role(standby) == "leader", f"{standby}'s Pod labelled leader", 30)
    mark(f"{standby}'s Pod labelled leader")
    wait_until(
        lambda: metric(pair, standby, "gpufed_agents_connected") == agents,
        "agents reconnected",
        90,
    )
    mark(f"{agents} agents reconnected to {standby} (through the same Service address)")
    recovered_s = time.monotonic() - t_kill

    after = unique("after")
    after_uid = hub.submit(after, batch_job(4))["metadata"]["uid"]
    hub.wait_phase(after, "Running", timeout_s=90)
    mark(f"job {after} Running")
    st = hub.status(before)
    assert (st["phase"], st["cluster"]) == ("Running", cluster), "the first job kept running"
    assert {j.metadata.uid for j in e2e.members[cluster].jobs_of(before_uid)} == {copy.metadata.uid}
    for uid in (before_uid, after_uid):
        assert sum(len(v) for v in e2e.copies(uid).values()) == 1, "one member copy per job"
    mark("no job lost or duplicated (one member Job each, the first one unchanged)")

    print(f"\ntwo-replica drill (leader lease {e2e.options.leader_lease_s} s):")
    for at, what in timeline:
        print(f"  t+{at:6.1f}s  {what}")
    print(f"  kill -> agents back on the new leader: {recovered_s:.1f}s")
