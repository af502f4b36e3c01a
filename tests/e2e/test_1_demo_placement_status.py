"""`gpufed demo` on the example fleet: topology placement, Succeeded and Failed with the member's
reason, a job no member can ever hold rejected at once.

The demo runs as a user runs it (a subprocess of the `gpufed` command) against the session's
running sandbox, which it reuses; its JSON line and the objects it leaves on the hub and in
the members are then checked.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from gpufed.api.labels import GPU_CLIQUE_LABEL
from gpufed.cli.demo import EXAMPLE_JOBS, load_examples
from gpufed.sandbox.controlplane import gpufed_command
from tests.e2e.harness import E2E

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def demo_run(e2e_session: E2E) -> Iterator[dict[str, Any]]:
    """Run `gpufed demo --json` once for this module; yields its exit code, rows by job and
    the final GPUJob objects. The demo's namespaces are emptied afterwards."""
    e2e_session.wait_healthy()
    proc = subprocess.run(
        [*gpufed_command(), "demo", "--state-dir", str(e2e_session.info.state_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "[]"
    rows = {r["job"]: r for r in json.loads(last)} if last.startswith("[") else {}
    jobs = {}
    for ex in load_examples(EXAMPLE_JOBS):
        jobs[ex.key] = e2e_session.hub.job(ex.name, ex.namespace) or {}
    yield {
        "code": proc.returncode,
        "out": proc.stdout,
        "err": proc.stderr,
        "rows": rows,
        "jobs": jobs,
    }
    for ns in ("team-a", "team-b"):
        e2e_session.hub.clear(ns)


def test_every_example_ends_as_its_expect_annotation_says(demo_run: dict[str, Any]) -> None:
    assert demo_run["code"] == 0, demo_run["out"][-4000:] + demo_run["err"][-2000:]
    examples = load_examples(EXAMPLE_JOBS)
    assert set(demo_run["rows"]) == {ex.key for ex in examples}
    for ex in examples:
        assert ex.expect.unmet(demo_run["jobs"][ex.key]) is None, ex.key
    for row in demo_run["rows"].values():
        assert set(row) == {
            "job",
            "gpus",
            "topology",
            "cluster",
            "domain",
            "phase",
            "placement_ms",
            "dispatch_ms",
        }


def test_placement_follows_gpu_product_nvlink_topology_mig_and_taints(
    demo_run: dict[str, Any], e2e_session: E2E
) -> None:
    rows = demo_run["rows"]
    h100 = rows["team-a/llama-finetune-h100"]
    assert (h100["cluster"], h100["gpus"]) == ("us-east-hgx", 8)
    assert h100["domain"].startswith("node:us-east-hgx-h100-")  # one HGX node = one domain

    nvl = rows["team-a/pretrain-nvl72"]
    assert (nvl["cluster"], nvl["gpus"], nvl["topology"]) == ("eu-nvl72", 32, "Required")
    assert nvl["domain"].startswith("clique:")
    assert "," not in nvl["domain"]
    # In the member, the 8 pods ran on 8 GB200 trays of exactly that clique.
    uid = demo_run["jobs"]["team-a/pretrain-nvl72"]["metadata"]["uid"]
    member = e2e_session.members["eu-nvl72"]
    pods = member.pods_of(uid)
    assert len(pods) == 8
    nodes = {p.spec.node_name for p in pods}
    assert len(nodes) == 8
    cliques = {member.core.read_node(n).metadata.labels[GPU_CLIQUE_LABEL] for n in nodes}
    assert cliques == {nvl["domain"].removeprefix("clique:")}

    mig = rows["team-b/mig-inference"]
    assert mig["cluster"] == "ap-a100-mig"
    mig_pods = e2e_session.members["ap-a100-mig"].pods_of(
        demo_run["jobs"]["team-b/mig-inference"]["metadata"]["uid"]
    )
    assert len(mig_pods) == 2
    assert all(
        p.spec.containers[0].resources.limits == {"nvidia.com/mig-1g.10gb": "1"} for p in mig_pods
    )

    giant = rows["team-a/giant-nvlink"]
    assert giant["cluster"] is None
    assert giant["phase"] == "Failed"
    placement = demo_run["jobs"]["team-a/giant-nvlink"]["status"]["placement"]
    assert placement["outcome"] == "Rejected"
    # Every member says why it could never hold 96 GPUs in one NVLink domain.
    assert {r["cluster"] for r in placement["rejections"]} == set(e2e_session.members)
    assert all(r["code"] == "UnschedulableAndUnresolvable" for r in placement["rejections"])
    for name in ("llama-finetune-h100", "pretrain-nvl72", "notebook-2gpu"):
        row = rows[f"team-a/{name}"]
        assert row["placement_ms"] is not None
        assert row["dispatch_ms"] is not None


def _conditions(obj: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(c["type"], c["status"], c.get("reason", "")) for c in obj["status"]["conditions"]]


def test_succeeded_mirrors_the_member_jobs_conditions_counts_and_times(
    demo_run: dict[str, Any], e2e_session: E2E
) -> None:
    obj = demo_run["jobs"]["team-a/llama-finetune-h100"]
    st = obj["status"]
    assert st["phase"] == "Succeeded"
    assert st["succeeded"] == 1
    assert st["startTime"]
    assert st["completionTime"]
    (member_job,) = e2e_session.members["us-east-hgx"].jobs_of(obj["metadata"]["uid"])
    member_conds = [(c.type, c.status, c.reason or "") for c in member_job.status.conditions or []]
    hub_conds = _conditions(obj)
    # The hub's own conditions first, then the member's in the member's order.
    assert [c[0] for c in hub_conds[:3]] == ["Valid", "Placed", "Dispatched"]
    assert hub_conds[-len(member_conds) :] == member_conds
    assert ("Complete", "True") in {(t, s) for t, s, _ in member_conds}


def test_failed_carries_the_members_reason(demo_run: dict[str, Any], e2e_session: E2E) -> None:
    obj = demo_run["jobs"]["team-b/eval-crash"]
    st = obj["status"]
    assert st["phase"] == "Failed"
    assert st["failed"] == 1
    cluster = st["cluster"]
    (member_job,) = e2e_session.members[cluster].jobs_of(obj["metadata"]["uid"])
    member_failed = next(c for c in member_job.status.conditions if c.type == "Failed")
    hub_failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert hub_failed["reason"] == member_failed.reason == "BackoffLimitExceeded"
    assert hub_failed["message"] == member_failed.message
    assert "BackoffLimitExceeded" in st["message"]
    assert cluster in st["message"]
