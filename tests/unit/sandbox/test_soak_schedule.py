"""The soak's schedules are seeded: the same seed gives the same jobs and faults, another seed
others; ``--faults`` picks kinds; no fault outlives the run."""

from __future__ import annotations

import pytest

from gpufed.api.fleet import node_specs
from gpufed.api.gpujob import GPUJob
from gpufed.api.queue import GPUQueue
from gpufed.sandbox.faults import FAULT_KINDS, fault_schedule, parse_kinds
from gpufed.sandbox.soakload import job_schedule, soak_fleet, soak_queues


def test_the_same_seed_gives_the_same_schedule() -> None:
    fleet = soak_fleet()
    assert job_schedule(7, 1800) == job_schedule(7, 1800)
    assert fault_schedule(7, 1800, FAULT_KINDS, fleet) == fault_schedule(
        7, 1800, FAULT_KINDS, fleet
    )
    assert job_schedule(7, 1800) != job_schedule(8, 1800)
    assert fault_schedule(7, 1800, FAULT_KINDS, fleet) != fault_schedule(
        8, 1800, FAULT_KINDS, fleet
    )


def test_the_stream_mixes_kinds_priorities_and_namespaces() -> None:
    jobs = job_schedule(1, 1800)
    assert {j.kind for j in jobs} == {"plain", "nvlink", "mig", "fail"}
    assert {j.namespace for j in jobs} == {"soak-a", "soak-b"}
    prios = {j.manifest["spec"]["placement"].get("priorityClassName") for j in jobs}
    assert prios == {None, "soak-low", "soak-high"}
    assert all(j.expect == ("fail" if j.kind == "fail" else "succeed") for j in jobs)
    for j in jobs[:20]:
        GPUJob.model_validate(j.manifest)  # every manifest is a valid GPUJob
    assert len({j.name for j in jobs}) == len(jobs)
    for q in soak_queues():
        GPUQueue.model_validate(q)


def test_faults_pick_kinds_targets_and_end_before_the_run() -> None:
    fleet = soak_fleet()
    faults = fault_schedule(3, 1800, ["kwok-stop", "node-delete"], fleet)
    assert {f.kind for f in faults} == {"kwok-stop", "node-delete"}
    nodes = {f"{c.name}/{s.name}" for c in fleet.clusters for s in node_specs(c)}
    for f in faults:
        assert f.at_s + f.hold_s <= 1800
        if f.kind == "node-delete":
            assert f.target in nodes
        else:
            assert f.target in {"soak-hgx", "soak-mix"}
            assert 10 <= f.hold_s <= 90
    assert all(fault_schedule(1, 1800, FAULT_KINDS, fleet)[i].at_s >= 20 for i in range(3))


def test_unknown_fault_kinds_are_named() -> None:
    assert parse_kinds(None) == FAULT_KINDS
    assert parse_kinds("leader-kill, etcd-restart") == ("leader-kill", "etcd-restart")
    with pytest.raises(ValueError, match=r"unknown fault kind.*bogus.*choose among"):
        parse_kinds("leader-kill,bogus")
