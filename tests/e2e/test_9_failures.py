"""Infrastructure failures (docs/design.md §7 item 6, issue 13) in the whole sandbox: kwok nodes
are deleted under running jobs, as a node that died would vanish from its cluster.

1. the node under a running job is deleted: the agent reports ``NodeLost``, the hub deletes
   what is left of the copy and places the job again off that node; it runs again and succeeds
   with ``status.restarts: 1`` (the timeline node deleted -> running again is printed);
2. a job whose code exits 1 is not re-run: Failed, one copy, no restart;
3. a 4-pod NVLink-Required job on the GB200 cliques loses the node of one pod: it is restarted
   whole (one new copy, every pod), again inside one NVLink domain.

Each deleted node is created again afterwards (from the example fleet), so later tests see
the fleet whole.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpufed.api.fleet import FleetSpec, node_specs
from gpufed.sandbox.nodes import create_nodes
from tests.e2e.conftest import EXAMPLE_FLEET
from tests.e2e.harness import E2E, batch_job, unique, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture
def restore_nodes(e2e: E2E) -> Iterator[list[tuple[str, str]]]:
    """Nodes a test deleted, as (member, node): created again from the fleet afterwards."""
    deleted: list[tuple[str, str]] = []
    yield deleted
    fleet = FleetSpec.load(EXAMPLE_FLEET)
    for member, node in deleted:
        [cluster] = [c for c in fleet.clusters if c.name == member]
        specs = [s for s in node_specs(cluster) if s.name == node]
        create_nodes(e2e.members[member].api, specs)


def _node_of(e2e: E2E, member: str, uid: str) -> list[str]:
    return sorted(p.spec.node_name for p in e2e.members[member].pods_of(uid, running=True))


def _placed_nodes(status: dict[str, Any]) -> list[str]:
    """The nodes the latest placement chose (attempt 1's pod may still terminate on its
    deleted node, so the member's pod list is no measure of where the job runs now)."""
    return sorted(n for ps in status["placement"]["podSets"] for n in ps["nodes"])


def test_a_deleted_node_re_runs_the_job_elsewhere_and_it_succeeds(
    e2e: E2E, restore_nodes: list[tuple[str, str]]
) -> None:
    hub = e2e.hub
    name = unique("node-loss")
    uid = hub.submit(
        name,
        batch_job(8, run_for="15s"),
        placement={"gpuProducts": ["H100"], "retry": {"onInfrastructureFailure": 2}},
    )["metadata"]["uid"]
    st = hub.wait_phase(name, "Running", timeout_s=60)
    member = st["cluster"]
    [node] = wait_until(lambda: _node_of(e2e, member, uid) or None, "the pod running", 30)
    deleted_at = time.monotonic()
    e2e.members[member].core.delete_node(node)
    restore_nodes.append((member, node))

    def running_again() -> dict[str, Any] | None:
        s = hub.status(name)
        return s if s.get("phase") == "Running" and (s.get("restarts") or 0) >= 1 else None

    phases: list[tuple[float, str]] = []

    def watch() -> dict[str, Any] | None:
        s = hub.status(name)
        if not phases or phases[-1][1] != s.get("phase"):
            phases.append((round(time.monotonic() - deleted_at, 2), str(s.get("phase"))))
        assert s.get("phase") != "Failed", f"shown Failed in between: {s}"
        return running_again()

    st = wait_until(watch, "the job running again", 60)
    running_s = time.monotonic() - deleted_at
    assert st["attempt"] == 2
    assert node not in _placed_nodes(st)
    [entry] = st["restartHistory"]
    assert (entry["attempt"], entry["cluster"], entry["nodes"], entry["reason"]) == (
        1,
        member,
        [node],
        "NodeLost",
    )
    st = hub.wait_phase(name, "Succeeded", timeout_s=60)
    assert st["restarts"] == 1
    assert sum(len(c) for c in e2e.copies(uid).values()) == 1, "one copy, never two"
    print(
        "failure-drill timeline "
        + json.dumps(
            {"node": node, "phases_after_delete_s": phases, "running_again_s": round(running_s, 2)}
        )
    )


def test_a_job_exiting_1_is_not_re_run(e2e: E2E) -> None:
    hub = e2e.hub
    name = unique("exit-1")
    uid = hub.submit(name, batch_job(1, run_for="1s", exit_code=1))["metadata"]["uid"]
    st = hub.wait_phase(name, "Failed", timeout_s=60)
    assert not st.get("restarts")
    assert st.get("attempt") == 1
    assert sum(len(c) for c in e2e.copies(uid).values()) == 1


def test_an_nvlink_gang_that_loses_one_pod_restarts_whole_on_one_domain(
    e2e: E2E, restore_nodes: list[tuple[str, str]]
) -> None:
    hub = e2e.hub
    name = unique("gang")
    uid = hub.submit(
        name,
        batch_job(4, pods=4),
        placement={"gpuProducts": ["GB200"], "topology": {"nvlink": "Required"}},
    )["metadata"]["uid"]
    st = hub.wait_phase(name, "Running", timeout_s=60)
    member = st["cluster"]
    assert len(st["placement"]["nvlinkDomains"]) == 1
    nodes = wait_until(
        lambda: ((n := _node_of(e2e, member, uid)) and len(n) == 4 and n) or None,
        "4 pods running",
        30,
    )
    [old_job] = e2e.members[member].jobs_of(uid)
    e2e.members[member].core.delete_node(nodes[0])
    restore_nodes.append((member, nodes[0]))

    def restarted() -> dict[str, Any] | None:
        s = hub.status(name)
        assert s.get("phase") != "Failed", f"shown Failed in between: {s}"
        return s if s.get("phase") == "Running" and s.get("restarts") == 1 else None

    st = wait_until(restarted, "the gang running again", 60)
    assert len(st["placement"]["nvlinkDomains"]) == 1
    assert nodes[0] not in _placed_nodes(st)
    assert len(_placed_nodes(st)) == 4
    [new_job] = e2e.members[st["cluster"]].jobs_of(uid)
    assert new_job.metadata.uid != old_job.metadata.uid, "restarted whole: a new Job"
    hub.delete(name)
