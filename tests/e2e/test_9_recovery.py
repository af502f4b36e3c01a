"""Issue 24's remaining drills in the whole sandbox (the NotReady blip and the unreachable node
are ``test_9_not_ready.py``): faults a real fleet lives with, each with its timeline printed.

1. **a 10 s GPU-count drop** under a running job (the node's ``nvidia.com/gpu`` capacity and
   allocatable patched to 0, as a device-plugin restart does, then put back): the job shows
   ``GPUUnavailable`` at once and keeps running, same member Job, attempt 1, no suspect mark;
2. **an agent restart after the pods are gone**: while a member's agent is down, the node under
   a running job is deleted and its pod removed (what the pod garbage collector does to the pods
   of a deleted node); the member Job's controller makes a replacement pod pinned to the gone
   node. The agent that comes back never saw the old pod, yet the job is re-run elsewhere from
   what the member still has (``NodeLost``), not left Pending on a dead node;
3. **a leader change while a node is suspect** (two hub replicas,
   :class:`gpufed.sandbox.hubpair.HubPair`): a GPU drop under a job that waits 0 s marks the
   node suspect; the leader is killed; the new leader shows the same mark with the same expiry,
   does not place a job that only that node can hold while the mark lasts, and places it there
   once the mark expired;
4. **the same agent restart for a workload that does not replace its pod** (``backoffLimit:
   0``, the usual gang): the member's Job controller fails the Job for the removed pod
   (``BackoffLimitExceeded``) and no pod is left; the agent that comes back reads the failed
   Job's own template, pinned to the gone node, and reports ``NodeLost`` (rule 4a of
   :mod:`gpufed.sync.failure`): the job is re-run elsewhere, not failed for good.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from gpufed.api.fleet import FleetSpec, node_specs
from gpufed.sandbox.controlplane import agent_component
from gpufed.sandbox.faults import Fault, FaultRecord, FaultRunner
from gpufed.sandbox.hubpair import HubPair
from gpufed.sandbox.nodes import create_nodes
from tests.e2e.conftest import EXAMPLE_FLEET
from tests.e2e.harness import E2E, batch_job, unique, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

HOSTNAME_LABEL = "kubernetes.io/hostname"


def _conditions(st: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in st.get("conditions") or []}


def _runner(e2e: E2E) -> FaultRunner:
    return FaultRunner(e2e.sandbox, FleetSpec.load(EXAMPLE_FLEET))


def _withdraw_gpus(
    e2e: E2E, member: str, node: str, hold_s: float
) -> tuple[threading.Thread, list[FaultRecord]]:
    """Start a ``gpu-withdraw`` fault on ``member/node`` for ``hold_s`` in a thread; the list
    gets its record once undone."""
    done: list[FaultRecord] = []
    fault = Fault(0.0, "gpu-withdraw", f"{member}/{node}", hold_s)
    th = threading.Thread(target=lambda: done.append(_runner(e2e).apply(fault)), daemon=True)
    th.start()
    return th, done


def _pod_node(e2e: E2E, member: str, uid: str) -> str:
    [node] = wait_until(
        lambda: [p.spec.node_name for p in e2e.members[member].pods_of(uid, running=True)],
        "the pod running",
        30,
    )
    return str(node)


def _suspect(e2e: E2E, member: str, node: str) -> dict[str, Any] | None:
    """``node``'s entry in the member's ``status.suspectNodes`` (None: not suspect)."""
    st = e2e.hub.member(member).status
    for s in st.suspect_nodes if st else []:
        if s.node == node:
            return {"reason": s.reason, "until": s.until}
    return None


def _restore_node(e2e: E2E, member: str, node: str) -> None:
    [cluster] = [c for c in FleetSpec.load(EXAMPLE_FLEET).clusters if c.name == member]
    create_nodes(e2e.members[member].api, [s for s in node_specs(cluster) if s.name == node])


def test_a_10s_gpu_drop_is_shown_at_once_and_changes_nothing(e2e: E2E) -> None:
    hub = e2e.hub
    name = unique("gpu-drop")
    uid = hub.submit(name, batch_job(8), placement={"gpuProducts": ["H100"]})["metadata"]["uid"]
    st = hub.wait_phase(name, "Running", timeout_s=60)
    member = st["cluster"]
    [copy] = e2e.members[member].jobs_of(uid)
    node = _pod_node(e2e, member, uid)
    t0 = time.monotonic()
    seen: list[tuple[float, str]] = []
    fault, record = _withdraw_gpus(e2e, member, node, 10.0)

    def suspected() -> dict[str, Any] | None:
        s = hub.status(name)
        assert s.get("phase") == "Running", f"the GPU drop changed the job: {s}"
        return s if _conditions(s).get("GPUUnavailable") == "True" else None

    st = wait_until(suspected, "condition GPUUnavailable on the job", 20)
    seen.append((round(time.monotonic() - t0, 1), "GPUUnavailable shown"))
    [cond] = [c for c in st["conditions"] if c["type"] == "GPUUnavailable"]
    assert node in cond["message"]
    fault.join(60)
    [rec] = record
    assert not rec.error, rec.error
    seen.append((round(time.monotonic() - t0, 1), "GPUs back"))

    def cleared() -> dict[str, Any] | None:
        s = hub.status(name)
        assert s.get("phase") == "Running", f"the GPU drop changed the job: {s}"
        return s if _conditions(s).get("GPUUnavailable") in (None, "False") else None

    st = wait_until(cleared, "GPUUnavailable gone once the GPUs are back", 60)
    seen.append((round(time.monotonic() - t0, 1), "GPUUnavailable gone"))
    assert not st.get("restarts"), st.get("restartHistory")
    assert st.get("attempt") == 1
    [same] = e2e.members[member].jobs_of(uid)
    assert same.metadata.uid == copy.metadata.uid, "same run, no new copy"
    assert _suspect(e2e, member, node) is None
    events = hub.events(name)
    print(
        "gpu-drop timeline "
        + json.dumps({"node": node, "detail": rec.detail, "events_s": seen, "events": events})
    )
    hub.delete(name)


def _agent_restart_drill(
    e2e: E2E, label: str, backoff_limit: int, while_down: Callable[[Any, Any, str], str]
) -> None:
    """Drills 2 and 4: a running 8-GPU job; its member's agent SIGKILLed; the node under it
    deleted and its pod removed (what the pod garbage collector does to the pods of a deleted
    node); ``while_down(api, old_pod, uid)`` waits for what the member then shows and returns
    a line for the timeline; the agent started again. The job must run again as attempt 2 off
    that node (``NodeLost``), one copy, the timeline printed."""
    hub = e2e.hub
    name = unique(label)
    template = batch_job(8)
    template["spec"]["backoffLimit"] = backoff_limit
    uid = hub.submit(
        name,
        template,
        placement={"gpuProducts": ["H100"], "retry": {"onInfrastructureFailure": 2}},
    )["metadata"]["uid"]
    st = hub.wait_phase(name, "Running", timeout_s=60)
    member = st["cluster"]
    api = e2e.members[member]
    [old] = wait_until(lambda: api.pods_of(uid, running=True), "the pod running", 30)
    node = str(old.spec.node_name)
    agent = agent_component(member)
    t0 = time.monotonic()
    seen: list[tuple[float, str]] = []

    def mark(what: str) -> None:
        seen.append((round(time.monotonic() - t0, 1), what))

    e2e.kill(agent)
    mark("agent killed")
    try:
        api.core.delete_node(node)
        api.core.delete_namespaced_pod(
            old.metadata.name, old.metadata.namespace, grace_period_seconds=0
        )
        mark("node deleted, its pod removed")
        mark(while_down(api, old, uid))
    finally:
        e2e.start(agent)
    mark("agent started again")
    agent_back = time.monotonic()
    try:

        def elsewhere() -> dict[str, Any] | None:
            s = hub.status(name)
            assert s.get("phase") not in ("Failed", "Lost"), f"the job failed: {s}"
            ok = s.get("phase") == "Running" and (s.get("restarts") or 0) >= 1
            return s if ok else None

        st = wait_until(elsewhere, "the job running again", 90)
        mark("job Running again")
        rerun_s = round(time.monotonic() - agent_back, 1)
        assert st["attempt"] == 2
        [entry] = st["restartHistory"]
        assert (entry["attempt"], entry["cluster"], entry["nodes"], entry["reason"]) == (
            1,
            member,
            [node],
            "NodeLost",
        )
        placed = sorted(n for ps in st["placement"]["podSets"] for n in ps["nodes"])
        assert node not in placed
        assert sum(len(c) for c in e2e.copies(uid).values()) == 1, "one copy, never two"
        print(
            f"{label} timeline "
            + json.dumps(
                {
                    "member": member,
                    "node": node,
                    "events_s": seen,
                    "agent_back_to_running_again_s": rerun_s,
                    "new_placement": [st["cluster"], placed],
                }
            )
        )
    finally:
        _restore_node(e2e, member, node)
    hub.delete(name)
    # its suspect mark (90 s in the e2e hub) must not shrink the fleet of later tests
    wait_until(lambda: _suspect(e2e, member, node) is None, f"{node}'s suspect mark expired", 150)


def test_an_agent_restarted_after_the_pods_are_gone_re_runs_the_job(e2e: E2E) -> None:
    """Drill 2: a workload whose controller replaces a removed pod (``backoffLimit: 2``): the
    replacement is pinned to the gone node and Pending."""

    def replacement_pending(api: Any, old: Any, uid: str) -> str:
        def replacement() -> Any:
            pods = [p for p in api.pods_of(uid) if p.metadata.uid != old.metadata.uid]
            return pods[0] if pods and len(api.pods_of(uid)) == 1 else None

        new = wait_until(replacement, "the Job controller's replacement pod", 20)
        assert not new.spec.node_name
        assert new.status.phase == "Pending"
        return "replacement pod Pending, pinned to the gone node"

    _agent_restart_drill(e2e, "agent-restart", 2, replacement_pending)


def test_an_agent_restarted_after_a_backoff_limit_0_job_lost_its_node_re_runs_it(
    e2e: E2E,
) -> None:
    """Drill 4: a workload that never replaces its pod (``backoffLimit: 0``): the member's Job
    controller fails the Job for the removed pod and no pod is left; the agent reads the failed
    Job's template, pinned to the gone node."""

    def failed_and_empty(api: Any, _old: Any, uid: str) -> str:
        def failed() -> Any:
            jobs = api.jobs_of(uid)
            conds = {c.type: c for c in (jobs[0].status.conditions or [])} if jobs else {}
            cond = conds.get("Failed")
            ok = cond is not None and cond.status == "True" and not api.pods_of(uid)
            return cond if ok else None

        cond = wait_until(failed, "the member Job Failed, no pod left", 20)
        return f"member Job Failed ({cond.reason}: {cond.message}), no pod left"

    _agent_restart_drill(e2e, "agent-restart-backoff-0", 0, failed_and_empty)


def _ts(value: Any) -> float:
    """Seconds since the epoch of an RFC 3339 time (a str, as the models keep it)."""
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _until(mark: dict[str, Any]) -> float:
    return _ts(mark["until"])


def test_a_suspect_mark_survives_a_leader_change_and_still_expires(
    e2e: E2E, hub_pair: HubPair
) -> None:
    hub = e2e.hub
    name = unique("suspect")
    uid = hub.submit(
        name,
        batch_job(8),
        placement={
            "gpuProducts": ["H100"],
            "retry": {"onInfrastructureFailure": 2, "nodeNotReadySeconds": 0},
        },
    )["metadata"]["uid"]
    st = hub.wait_phase(name, "Running", timeout_s=90)
    member = st["cluster"]
    node = _pod_node(e2e, member, uid)
    t0 = time.monotonic()
    seen: list[tuple[float, str]] = []

    def mark(what: str) -> None:
        seen.append((round(time.monotonic() - t0, 1), what))

    fault, record = _withdraw_gpus(e2e, member, node, 5.0)
    first = wait_until(lambda: _suspect(e2e, member, node), f"{node} suspect", 30)
    mark(f"{node} suspect ({first['reason']})")
    assert first["reason"].startswith("GPUUnavailable")
    fault.join(60)
    [rec] = record
    assert not rec.error, rec.error
    mark("GPUs back")

    leader = wait_until(hub_pair.leader, "a leading replica", 30)
    e2e.kill(leader)
    killed_at = time.time()
    mark(f"{leader} killed")

    def other_leader() -> str | None:
        now = hub_pair.leader()
        return now if now not in (None, leader) else None

    new_leader = wait_until(other_leader, "a new leader", 60)
    mark(f"{new_leader} leads")

    def written_by_new_leader() -> bool:
        # a MemberCluster status written after the kill: only the new leader can have
        st = e2e.hub.member(member).status
        beat = st.last_heartbeat_time if st else None
        return beat is not None and _ts(beat) > killed_at + 1

    wait_until(written_by_new_leader, f"{member}'s status written by the new leader", 60)
    after = _suspect(e2e, member, node)
    assert after is not None, f"{node}'s suspect mark lost in the failover"
    assert _until(after) == pytest.approx(_until(first), abs=1.0), (first, after)
    mark("mark shown by the new leader, same expiry")

    # a job only that node can hold is not placed there while the mark lasts
    labels = e2e.members[member].core.read_node(node).metadata.labels or {}
    probe = unique("probe")
    template = batch_job(8)
    template["spec"]["template"]["spec"]["nodeSelector"] = {
        HOSTNAME_LABEL: labels.get(HOSTNAME_LABEL, node)
    }
    hub.submit(probe, template, placement={"gpuProducts": ["H100"]})
    mark("probe job pinned to the suspect node submitted")
    expires = _until(after)

    def placed() -> dict[str, Any] | None:
        s = hub.status(probe)
        assert s.get("phase") not in ("Failed", "Lost"), f"the probe failed: {s}"
        if s.get("cluster"):
            assert time.time() >= expires - 2.0, f"placed on {node} while it is suspect: {s}"
            return s
        return None

    st = wait_until(placed, "the probe placed once the mark expired", 180)
    mark("probe placed")
    assert st["cluster"] == member
    # The MemberCluster status drops the mark at its next write after the expiry (the probe can
    # be placed first, in the same second): wait for it rather than read it once.
    wait_until(
        lambda: _suspect(e2e, member, node) is None or None,
        f"{node}'s expired mark gone from the member status",
        30,
    )
    hub.wait_phase(probe, "Running", timeout_s=60)
    mark("probe Running on the once-suspect node")
    print(
        "leader-change-while-suspect timeline "
        + json.dumps(
            {
                "member": member,
                "node": node,
                "events_s": seen,
                "mark_until_after_failover_minus_before_s": round(_until(after) - _until(first), 3),
                "probe_placed_after_expiry_s": round(time.time() - expires, 1),
            }
        )
    )
    hub.delete(probe)
    hub.delete(name)
