"""What one tenant's managed workload can do to everyone else: nothing. An oversized workload is
refused, not sent to etcd; an API error of one workload is retried for it alone and never ends
the leader term; a watch event too large to read makes the hub list again; the hub's memory
of warnings goes with the workload; a JobSet, like a Job, never runs twice; a workload waiting
for a taken GPUJob name gets it when the name frees. (Found by a hostile-tenant review;
docs/hub.md, "Plain workloads on the hub".)"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpufed.api.gpujob import GPUJob
from gpufed.hub.components import managed as component
from gpufed.hub.rules import managed as rules
from gpufed.hub.rules.podsets import time_limit_of
from tests.unit.hub.term import Term, settle
from tests.unit.hub.test_managed_component import (
    GPUJOB_WATCH,
    JOBS_WATCH,
    gpujob,
    hub_job,
    managed_term,
    push,
    run,
)

#: etcd's default --max-request-bytes: what one stored object may weigh.
ETCD_LIMIT = 1536 * 1024


class EtcdTooLargeError(Exception):
    """kube-apiserver's answer when etcd refuses a value over its request limit: 500
    "etcdserver: request is too large" (kubernetes/kubernetes#112152)."""

    status = 500
    body = '{"kind":"Status","message":"etcdserver: request is too large","code":500}'


class UnavailableError(Exception):
    """A 503 of the hub's API server (overloaded, restarting)."""

    status = 503
    body = '{"kind":"Status","message":"the server is currently unable to handle the request"}'


@pytest.fixture
async def term(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Term]:
    monkeypatch.setattr(component, "RETRY_BASE_S", 0.01)
    monkeypatch.setattr(component, "TAKEN_RECHECK_S", 0.01)
    t = managed_term()
    t.kube.unserved.add("jobsets")
    t.kube.objects["jobs"] = []
    yield t
    t.ctrl.stop("test over")


def _size(obj: dict[str, Any]) -> int:
    return len(json.dumps(obj, separators=(",", ":")))


def padded_job(name: str = "big", env_bytes: int = 1100 * 1024) -> dict[str, Any]:
    """A Job the hub's API server stores: ~250 KiB of annotations (the API's cap is 256 KiB) and
    a large env value."""
    job = hub_job(name, annotations={f"pad.example/{i}": "x" * 2000 for i in range(125)})
    containers = job["spec"]["template"]["spec"]["containers"]
    containers[0]["env"] = [{"name": "PAD", "value": "y" * env_bytes}]
    return job


def reasons(t: Term) -> list[str]:
    return [r for _, r, _ in t.kube.events]


def test_the_workloads_annotations_travel_once() -> None:
    job = padded_job(env_bytes=1000 * 1024)
    body = rules.gpujob_for(job, rules.KINDS["Job"])
    # Before: every annotation in the GPUJob's metadata and again in its template (1.6 MiB for a
    # 1.35 MiB Job). Now the GPUJob weighs about what the Job does.
    assert _size(body) < _size(job) + 4096
    assert "pad.example/0" not in body["metadata"]["annotations"]
    assert "pad.example/0" in body["spec"]["template"]["metadata"]["annotations"]
    assert body["metadata"]["annotations"][rules.GENERATION_ANNOTATION] == "1"


async def test_an_oversized_workload_is_refused_and_nothing_is_sent(term: Term) -> None:
    job = padded_job()
    term.kube.objects["jobs"].append(job)
    tasks = await run(term)
    assert term.kube.created == []
    assert reasons(term) == ["InvalidSpec"]
    assert "over the 1 MiB" in term.kube.events[0][2]
    assert {c["type"] for c in job["status"]["conditions"]} == {"FailureTarget", "Failed"}
    assert not term.ctrl.stopped
    for task in tasks:
        task.cancel()


async def test_etcds_request_is_too_large_refuses_that_workload_and_the_term_goes_on(
    term: Term, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(component, "MAX_GPUJOB_BYTES", 10 * 2**20)  # let it reach the API
    real_create = term.kube.create_object

    async def create(group: str, version: str, ns: str, plural: str, body: dict[str, Any]) -> Any:
        if _size(body) > ETCD_LIMIT:
            raise EtcdTooLargeError("etcdserver: request is too large")
        return await real_create(group, version, ns, plural, body)

    monkeypatch.setattr(term.kube, "create_object", create)
    big, small = padded_job("big", env_bytes=1600 * 1024), hub_job("small")
    big["metadata"]["uid"] = "uid-big"
    term.kube.objects["jobs"] += [big, small]
    tasks = await run(term)
    assert not term.ctrl.stopped
    assert term.kube.created == [("gpujobs", "team-a", "job-small")]
    assert ("big", "InvalidSpec") in [(n, r) for n, r, _ in term.kube.events]
    assert big["status"]["conditions"][-1]["type"] == "Failed"
    for task in tasks:
        task.cancel()


async def test_a_5xx_on_one_status_write_is_retried_for_that_workload_not_the_term(
    term: Term, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = hub_job("train")
    term.kube.objects["jobs"].append(job)
    tasks = await run(term)
    made = gpujob(term, "job-train")
    assert made is not None
    real_replace = term.kube.replace_status
    failures = [UnavailableError("503"), UnavailableError("503")]

    async def replace_status(*args: Any, **kwargs: Any) -> str:
        if failures:
            raise failures.pop()
        return await real_replace(*args, **kwargs)

    monkeypatch.setattr(term.kube, "replace_status", replace_status)
    running = copy.deepcopy(made)
    running["status"] = {"phase": "Running", "active": 2, "startTime": "2026-12-03T11:00:00Z"}
    await push(term, GPUJOB_WATCH, "MODIFIED", running)
    assert not term.ctrl.stopped
    for _ in range(50):  # two backoffs of 0.01 and 0.02 s
        if job.get("status"):
            break
        await asyncio.sleep(0.01)
    assert job["status"]["startTime"] == "2026-12-03T11:00:00Z"
    assert not failures
    assert not term.ctrl.stopped
    for task in tasks:
        task.cancel()


async def test_the_warned_generation_goes_with_the_workload(term: Term) -> None:
    job = hub_job("train")
    term.kube.objects["jobs"].append(job)
    tasks = await run(term)
    for gen in range(2, 12):
        edited = copy.deepcopy(job)
        edited["metadata"]["generation"] = gen
        await push(term, JOBS_WATCH, "MODIFIED", edited)
    assert reasons(term).count("SpecChangeIgnored") == 10
    assert len(term.ctrl.managed._warned) == 1  # the last warned generation only
    term.kube.objects["jobs"].remove(job)
    await push(term, JOBS_WATCH, "DELETED", job)
    await settle()
    assert term.ctrl.managed._warned == {}
    for task in tasks:
        task.cancel()


def _hub_jobset(name: str = "js") -> dict[str, Any]:
    job = hub_job(name)
    inner = copy.deepcopy(job["spec"])
    inner.pop("managedBy")
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": "js-uid-1",
            "resourceVersion": "7",
            "generation": 1,
            "labels": {"gpufed.io/queue": "default"},
        },
        "spec": {
            "managedBy": "gpufed.io/hub",
            "replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": inner}}],
        },
    }


async def test_a_running_jobset_whose_gpujob_is_deleted_is_not_run_a_second_time() -> None:
    t = managed_term()
    t.kube.objects["jobs"] = []
    js = _hub_jobset()
    t.kube.objects["jobsets"] = [js]
    tasks = await run(t)
    made = gpujob(t, "jobset-js")
    assert made is not None
    running = copy.deepcopy(made)
    running["status"] = {"phase": "Running", "active": 2, "startTime": "2026-12-03T11:00:00Z"}
    await push(t, GPUJOB_WATCH, "MODIFIED", running)
    assert rules.has_started(rules.KINDS["JobSet"], js["status"])
    t.kube.objects["gpujobs"].remove(made)
    await push(t, GPUJOB_WATCH, "DELETED", running)
    assert t.kube.created == [("gpujobs", "team-a", "jobset-js")]  # once
    assert js["status"]["terminalState"] == "Failed"
    for task in tasks:
        task.cancel()
    t.ctrl.stop("test over")


async def test_a_workload_waiting_for_a_taken_name_is_federated_when_it_frees(term: Term) -> None:
    theirs = {
        "apiVersion": "gpufed.io/v1alpha1",
        "kind": "GPUJob",
        "metadata": {"name": "job-train", "namespace": "team-a", "uid": "u-theirs"},
        "spec": {"template": {}},
    }
    term.kube.objects["gpujobs"].append(theirs)
    term.kube.objects["jobs"].append(hub_job("train"))
    tasks = await run(term)
    assert term.kube.created == []
    assert reasons(term) == ["GPUJobNameTaken"]
    # That GPUJob carries no managed-kind label: the hub's labelled GPUJob watch never reports
    # its deletion, so the hub reads it again now and then (TAKEN_RECHECK_S).
    term.kube.objects["gpujobs"].remove(theirs)
    for _ in range(100):
        if term.kube.created:
            break
        await asyncio.sleep(0.01)
    assert term.kube.created == [("gpujobs", "team-a", "job-train")]
    for task in tasks:
        task.cancel()


async def test_a_watch_event_too_large_to_read_makes_the_hub_list_again() -> None:
    """A watch line over aiohttp's limit raises LineTooLong; watching again from the same
    resourceVersion would meet the same event forever."""
    from aiohttp.http_exceptions import LineTooLong

    from gpufed.hub.adapters.listwatch import list_watch

    lists: list[int] = []
    watched: list[str] = []

    async def list_fn() -> tuple[list[dict[str, Any]], str]:
        lists.append(1)
        if len(lists) > 2:
            raise asyncio.CancelledError
        return [], str(100 * len(lists))

    async def watch_fn(rv: str) -> AsyncIterator[Any]:
        watched.append(rv)
        raise LineTooLong(b"{...", 4 * 2**20)
        yield  # pragma: no cover

    async def no_sleep(_: float) -> None:
        return None

    with pytest.raises(asyncio.CancelledError):
        await list_watch(
            "jobs",
            list_fn,
            watch_fn,
            on_listed=lambda _: None,
            on_event=lambda _: None,
            sleep=no_sleep,
        )
    assert watched == ["100", "200"]  # each list moved past it, no re-watch from the same rv


def test_a_list_whose_job_is_not_its_only_workload_gets_no_limit_from_the_job() -> None:
    """A dummy Job with activeDeadlineSeconds: 1 beside a JobSet must not make the whole
    GPUJob "limited" (backfill would lend it held nodes, and the member stops only the Job)."""
    dummy = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "dummy"},
        "spec": {
            "activeDeadlineSeconds": 1,
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}
            },
        },
    }
    big = _hub_jobset("big")
    big["spec"].pop("managedBy")
    big["metadata"] = {"name": "big"}

    def gpujob_of(*items: dict[str, Any]) -> GPUJob:
        template = {"apiVersion": "v1", "kind": "List", "items": list(items)}
        return GPUJob.model_validate(
            {
                "apiVersion": "gpufed.io/v1alpha1",
                "kind": "GPUJob",
                "metadata": {"name": "g", "namespace": "team-a", "uid": "u"},
                "spec": {"template": template},
            }
        )

    assert time_limit_of(gpujob_of(dummy, big)) is None
    assert time_limit_of(gpujob_of(dummy)) == 1
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {}}
    assert time_limit_of(gpujob_of(dummy, service)) == 1
