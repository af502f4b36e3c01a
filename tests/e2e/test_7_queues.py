"""Two teams with fleet-wide quotas on one GPU product (GPUQueues) on the example fleet: jobs
wait and run as the quotas say, a finished job's quota goes to the team's waiting job, and
`gpufed get queues` shows it."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpufed.api.labels import GROUP, VERSION
from gpufed.sandbox.controlplane import gpufed_command
from tests.e2e.harness import E2E, H100, batch_job, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TEAMS = {"q-team-a": 16, "q-team-b": 8}  # queue (and namespace) -> H100 nominal


@pytest.fixture
def teams(e2e: E2E) -> Iterator[E2E]:
    """GPUQueues q-team-a (16 H100) and q-team-b (8 H100), each over its own namespace;
    the queues and the teams' jobs are removed afterwards."""
    for name, nominal in TEAMS.items():
        e2e.hub.create_queue(name, gpu_product=H100, nominal=nominal)
    try:
        yield e2e
    finally:
        for name in TEAMS:
            e2e.hub.clear(name)
            with contextlib.suppress(ApiException):
                e2e.hub.custom.delete_cluster_custom_object(GROUP, VERSION, "gpuqueues", name)


def get_queues(e2e: E2E) -> dict[str, dict[str, Any]]:
    """`gpufed get queues --json` as a user runs it, by queue name."""
    proc = subprocess.run(
        [*gpufed_command(), "get", "queues", "--json", f"--kubeconfig={e2e.info.kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return {r["name"]: r for r in json.loads(proc.stdout)}


def test_two_teams_run_within_their_quotas_and_get_queues_shows_it(teams: E2E) -> None:
    hub = teams.hub
    h100_only = {"gpuProducts": [H100]}
    for i in range(3):
        hub.submit(f"a{i}", batch_job(8), namespace="q-team-a", placement=h100_only)
    for i in range(2):
        hub.submit(f"b{i}", batch_job(8), namespace="q-team-b", placement=h100_only)

    def phases(ns: str) -> list[str]:
        return sorted(str((j.get("status") or {}).get("phase", "Pending")) for j in hub.jobs(ns))

    # 64 H100s free, but team-a may use 16 and team-b 8: two and one run, one each waits.
    wait_until(
        lambda: phases("q-team-a") == ["Pending", "Running", "Running"], "team-a: 2 run, 1 waits"
    )
    wait_until(lambda: phases("q-team-b") == ["Pending", "Running"], "team-b: 1 runs, 1 waits")
    waiting = next(
        j for j in hub.jobs("q-team-a") if (j.get("status") or {}).get("phase") == "Pending"
    )
    assert "q-team-a uses 16 of 16 NVIDIA-H100-80GB-HBM3" in waiting["status"]["message"]

    def shown() -> dict[str, dict[str, Any]] | None:
        rows = get_queues(teams)
        a, b = rows.get("q-team-a"), rows.get("q-team-b")
        ok = (
            a is not None
            and b is not None
            and a["usage"] == [{"gpuProduct": H100, "nominal": 16, "used": 16, "borrowed": 0}]
            and b["usage"] == [{"gpuProduct": H100, "nominal": 8, "used": 8, "borrowed": 0}]
            and (a["pending_jobs"], a["admitted_jobs"]) == (1, 2)
            and (b["pending_jobs"], b["admitted_jobs"]) == (1, 1)
        )
        return rows if ok else None

    rows = wait_until(shown, "get queues: 16/16 and 8/8, one pending each")
    assert rows["q-team-a"]["active"] == "True"

    # One of team-a's jobs goes: its waiting job runs; team-b still waits (its own quota).
    running = next(
        j for j in hub.jobs("q-team-a") if (j.get("status") or {}).get("phase") == "Running"
    )
    hub.delete(running["metadata"]["name"], "q-team-a")
    wait_until(
        lambda: phases("q-team-a") == ["Running", "Running"], "team-a's waiting job runs", 90
    )
    assert phases("q-team-b") == ["Pending", "Running"]
