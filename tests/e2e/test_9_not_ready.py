"""Issue 24's drills in the whole sandbox: a node that is not Ready for a while is a suspicion,
not a failure; an unreachable node does not strand the job.

The member's kwok is stopped (:meth:`gpufed.sandbox.faults.FaultRunner.hold_not_ready`), so
nothing turns the nodes Ready again or confirms a pod gone, and their ``Ready`` condition is
set as the node lifecycle controller would for a silent kubelet:

1. **a 20 s NotReady blip** under a running job: the job shows ``NodeNotReady`` at once, and
   when the node comes back nothing changed: same member copy, no restart, no suspect mark;
2. **an unreachable node** (``Ready=Unknown`` on every node of the member for 60 s) under a
   job that waits 5 s (``retry.nodeNotReadySeconds``): its old pod stays Terminating (no
   kubelet to confirm), yet the job runs again on another member before the node returns.

The timelines are printed.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from gpufed.api.fleet import FleetSpec
from gpufed.sandbox.faults import FaultRunner
from tests.e2e.conftest import EXAMPLE_FLEET
from tests.e2e.harness import E2E, batch_job, unique, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _conditions(st: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in st.get("conditions") or []}


def _runner(e2e: E2E) -> FaultRunner:
    return FaultRunner(e2e.sandbox, FleetSpec.load(EXAMPLE_FLEET))


def test_a_20s_not_ready_blip_does_not_fail_the_running_job(e2e: E2E) -> None:
    hub = e2e.hub
    name = unique("blip")
    uid = hub.submit(name, batch_job(8), placement={"gpuProducts": ["H100"]})["metadata"]["uid"]
    st = hub.wait_phase(name, "Running", timeout_s=60)
    member = st["cluster"]
    [copy] = e2e.members[member].jobs_of(uid)
    [node] = wait_until(
        lambda: [p.spec.node_name for p in e2e.members[member].pods_of(uid, running=True)],
        "the pod running",
        30,
    )
    seen: list[tuple[float, str]] = []
    t0 = time.monotonic()
    blip = threading.Thread(
        target=_runner(e2e).hold_not_ready, args=(member, 20.0), kwargs={"nodes": [node]}
    )
    blip.start()

    def suspected() -> dict[str, Any] | None:
        s = hub.status(name)
        assert s.get("phase") == "Running", f"the blip changed the job: {s}"
        return s if _conditions(s).get("NodeNotReady") == "True" else None

    wait_until(suspected, "condition NodeNotReady on the job", 20)
    seen.append((round(time.monotonic() - t0, 1), "NodeNotReady shown"))
    blip.join(120)
    seen.append((round(time.monotonic() - t0, 1), "kwok back"))

    def cleared() -> dict[str, Any] | None:
        s = hub.status(name)
        return s if _conditions(s).get("NodeNotReady") in (None, "False") else None

    st = wait_until(cleared, "NodeNotReady gone once the node is Ready", 60)
    seen.append((round(time.monotonic() - t0, 1), "NodeNotReady gone"))
    assert st["phase"] == "Running"
    assert not st.get("restarts"), st.get("restartHistory")
    assert st.get("attempt") == 1
    [same] = e2e.members[member].jobs_of(uid)
    assert same.metadata.uid == copy.metadata.uid, "same run, no new copy"
    assert node not in hub.suspects(member)
    print("not-ready-blip timeline " + json.dumps({"node": node, "events_s": seen}))
    hub.delete(name)


def test_an_unreachable_node_does_not_strand_the_job(e2e: E2E) -> None:
    hub = e2e.hub
    name = unique("unreach")
    uid = hub.submit(
        name,
        batch_job(
            1, tolerations=[{"operator": "Exists", "effect": "NoSchedule", "key": "dedicated"}]
        ),
        placement={"retry": {"onInfrastructureFailure": 3, "nodeNotReadySeconds": 5}},
    )["metadata"]["uid"]
    st = hub.wait_phase(name, "Running", timeout_s=60)
    member = st["cluster"]
    [old_pod] = wait_until(
        lambda: e2e.members[member].pods_of(uid, running=True), "the pod running", 30
    )
    t0 = time.monotonic()
    outage = threading.Thread(
        target=_runner(e2e).hold_not_ready, args=(member, 60.0), kwargs={"status": "Unknown"}
    )
    outage.start()
    try:

        def elsewhere() -> dict[str, Any] | None:
            s = hub.status(name)
            assert s.get("phase") not in ("Failed", "Lost"), f"the outage failed the job: {s}"
            ok = s.get("phase") == "Running" and s.get("cluster") != member
            return s if ok else None

        st = wait_until(elsewhere, "the job running on another member", 55)
        again_s = round(time.monotonic() - t0, 1)
        stuck = [
            p for p in e2e.members[member].pods_of(uid) if p.metadata.uid == old_pod.metadata.uid
        ]
        assert outage.is_alive(), "the node came back before the re-run: the drill proves nothing"
        assert st["restarts"] == 1
        [entry] = st["restartHistory"]
        print(
            "unreachable-node timeline "
            + json.dumps(
                {
                    "member": member,
                    "running_elsewhere_s": again_s,
                    "new_cluster": st["cluster"],
                    "reason": entry["reason"],
                    "old_pod_still_there": bool(stuck),
                    "old_pod_terminating": bool(stuck and stuck[0].metadata.deletion_timestamp),
                }
            )
        )
    finally:
        outage.join(120)
    # the member confirms the old pod gone once its "kubelet" is back
    wait_until(
        lambda: (
            not [
                p
                for p in e2e.members[member].pods_of(uid)
                if p.metadata.uid == old_pod.metadata.uid
            ]
        ),
        "the old pod gone after the node returned",
        90,
    )
    hub.delete(name)
    # its suspect marks (90 s in the e2e hub) must not shrink the fleet of later tests
    wait_until(lambda: not hub.suspects(member), f"suspect marks on {member} expired", 150)
