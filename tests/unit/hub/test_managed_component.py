"""The managed-workloads component over the typed fakes: a managed Job gets one GPUJob, its
status follows the GPUJob's, its deletion deletes the GPUJob; nothing it did not make is
changed or deleted; a kind whose CRD is missing leaves the Job path working."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.components.config import HubConfig
from gpufed.hub.rules.managed import KINDS as MANAGED_KINDS
from tests.unit.hub.term import Term, settle
from tests.unit.hub.test_managed_rules import hub_job as plain_hub_job

GPUJOB_WATCH = "gpujobs/gpufed.io/managed-kind"
#: The hub watches only workloads labelled gpufed.io/queue (the fake keys watches by selector).
JOBS_WATCH = "jobs/gpufed.io/queue"


def managed_term() -> Term:
    """A term whose hub federates plain Jobs and JobSets (``--managed-kinds Job,JobSet``: off
    by default)."""
    return Term(config=HubConfig(insecure=True, managed_kinds=frozenset(MANAGED_KINDS)))


def hub_job(name: str = "train", **meta: Any) -> dict[str, Any]:
    """A managed Job opted in with its queue label."""
    labels = {"gpufed.io/queue": "default", **meta.pop("labels", {})}
    return plain_hub_job(name, labels=labels, **meta)


@pytest.fixture
async def term() -> AsyncIterator[Term]:
    t = managed_term()
    t.kube.unserved.add("jobsets")  # the hub cluster has no JobSet CRD
    t.kube.objects["jobs"] = []
    yield t
    t.ctrl.stop("test over")


async def run(t: Term) -> list[asyncio.Task[Any]]:
    tasks = [asyncio.ensure_future(t.ctrl._term.tasks.supervise(c)) for c in t.ctrl.managed.loops()]
    await settle()
    return tasks


def gpujob(t: Term, name: str, namespace: str = "team-a") -> dict[str, Any] | None:
    return t.kube._find("gpujobs", namespace, name)


async def push(t: Term, key: str, type_: str, obj: dict[str, Any]) -> None:
    t.kube.watch_events.setdefault(key, asyncio.Queue()).put_nowait(WatchEvent(type_, obj))
    await settle()
    await settle()


def unmanaged(name: str) -> dict[str, Any]:
    obj = hub_job(name)
    del obj["spec"]["managedBy"]
    obj["metadata"]["uid"] = f"uid-{name}"
    return obj


async def test_a_managed_job_is_federated_its_status_follows_and_its_deletion_cleans_up(
    term: Term,
) -> None:
    job = hub_job("train")
    term.kube.objects["jobs"].append(job)
    tasks = await run(term)
    made = gpujob(term, "job-train")
    assert made is not None
    assert made["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert term.kube.created == [("gpujobs", "team-a", "job-train")]
    assert term.ctrl.managed.unavailable.keys() == {"JobSet"}  # and the Job path works

    running = copy.deepcopy(made)
    running["status"] = {
        "phase": "Running",
        "active": 2,
        "ready": 2,
        "startTime": "2026-12-03T11:00:00Z",
    }
    await push(term, GPUJOB_WATCH, "MODIFIED", running)
    assert job["status"] == {"active": 2, "ready": 2, "startTime": "2026-12-03T11:00:00Z"}

    done = copy.deepcopy(running)
    done["status"] = {
        "phase": "Succeeded",
        "succeeded": 2,
        "startTime": "2026-12-03T11:00:00Z",
        "completionTime": "2026-12-03T11:02:00Z",
    }
    await push(term, GPUJOB_WATCH, "MODIFIED", done)
    assert {c["type"] for c in job["status"]["conditions"]} == {"SuccessCriteriaMet", "Complete"}
    assert job["status"]["completionTime"] == "2026-12-03T11:02:00Z"

    term.kube.objects["jobs"].remove(job)
    await push(term, JOBS_WATCH, "DELETED", job)
    assert term.kube.deleted == [("gpujobs", "team-a", "job-train")]
    assert not term.ctrl.stopped
    for task in tasks:
        task.cancel()


async def test_what_gpufed_did_not_make_is_never_changed_or_deleted(term: Term) -> None:
    # A GPUJob of the user's that holds the name a managed Job's GPUJob would take.
    theirs = {
        "apiVersion": "gpufed.io/v1alpha1",
        "kind": "GPUJob",
        "metadata": {
            "name": "job-taken",
            "namespace": "team-a",
            "uid": "u-theirs",
            "resourceVersion": "1",
        },
        "spec": {"template": {}},
    }
    term.kube.objects["gpujobs"].append(theirs)
    term.kube.objects["jobs"] += [hub_job("taken"), unmanaged("plain")]
    # A GPUJob in team-b claiming a managed Job of team-a as its owner.
    forged = copy.deepcopy(theirs)
    forged["metadata"].update(
        name="job-train",
        namespace="team-b",
        uid="u-forged",
        labels={"gpufed.io/managed-kind": "Job"},
        ownerReferences=[
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": "plain",
                "uid": "uid-plain",
                "controller": True,
            }
        ],
    )
    forged["status"] = {"phase": "Succeeded"}
    term.kube.objects["gpujobs"].append(forged)
    tasks = await run(term)
    assert term.kube.created == []  # no GPUJob for the unmanaged Job, none over the taken name
    assert [(n, r) for n, r, _ in term.kube.events] == [("taken", "GPUJobNameTaken")]
    assert theirs["metadata"]["resourceVersion"] == "1"
    assert "status" not in theirs
    assert term.kube.statuses == []  # the unmanaged Job's status untouched
    # The forged GPUJob names no workload of team-b: only team-b's own object is at stake,
    # and no object of team-a was touched.
    assert all(ns != "team-a" for _, ns, _ in term.kube.deleted)
    for task in tasks:
        task.cancel()


async def test_a_spec_edit_after_the_gpujob_was_made_is_reported_once_and_not_applied(
    term: Term,
) -> None:
    job = hub_job("train")
    term.kube.objects["jobs"].append(job)
    tasks = await run(term)
    edited = copy.deepcopy(job)
    edited["metadata"]["generation"] = 2
    await push(term, JOBS_WATCH, "MODIFIED", edited)
    await push(term, JOBS_WATCH, "MODIFIED", edited)
    reasons = [r for _, r, _ in term.kube.events]
    assert reasons.count("SpecChangeIgnored") == 1
    assert term.kube.created == [("gpujobs", "team-a", "job-train")]
    for task in tasks:
        task.cancel()


async def test_a_bad_placement_hint_fails_the_job_with_an_event_naming_the_annotation(
    term: Term,
) -> None:
    job = hub_job("train", annotations={"gpufed.io/nvlink": "Always"})
    term.kube.objects["jobs"].append(job)
    tasks = await run(term)
    assert term.kube.created == []
    (message,) = [m for _, r, m in term.kube.events if r == "InvalidSpec"]
    assert "metadata.annotations[gpufed.io/nvlink]" in message
    assert {c["type"] for c in job["status"]["conditions"]} == {"FailureTarget", "Failed"}
    for task in tasks:
        task.cancel()
