"""Apply strategies (gpufed.sync.apply): validation, create-only vs server-side apply,
adoption, never re-creating a job that ran, deletion, and API error messages."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.api.labels import DEFAULT_ORIGIN
from gpufed.api.labels import ORIGIN_LABEL as ORIGIN
from gpufed.sync.apply import (
    GRANT_WAIT_TRIES,
    ApplyResult,
    ApplyStrategy,
    ManifestRefusedError,
    ObjectRef,
    api_error_message,
    apply_object,
    check_manifests,
    delete_object,
    ensure_namespace,
    main_workload,
    ref_of,
    strategy_for,
)
from gpufed.sync.grants import grant_name, is_grant
from gpufed.sync.ownership import Owner, OwnershipConflictError

from .builders import config_map, gpu_job
from .fakes import FakeApiError, MemoryCluster


def own(uid: str) -> Owner:
    return Owner(DEFAULT_ORIGIN, uid)


def test_job_is_create_only_and_supporting_kinds_are_server_side_applied() -> None:
    assert strategy_for("Job.batch") is ApplyStrategy.CREATE_ONLY
    assert strategy_for("ConfigMap") is ApplyStrategy.SERVER_SIDE_APPLY
    assert strategy_for("JobSet.jobset.x-k8s.io") is ApplyStrategy.SERVER_SIDE_APPLY


def test_check_fills_namespace_and_label_and_orders_supporting_objects_first() -> None:
    job = gpu_job("uid-1")
    del job["metadata"]["labels"]
    out = check_manifests([job, config_map("uid-1")], namespace="team-a", owner=own("uid-1"))
    assert [o["kind"] for o in out] == ["ConfigMap", "Job"]
    assert out[1]["metadata"]["namespace"] == "team-a"
    assert out[1]["metadata"]["labels"] == {
        "gpufed.io/job-uid": "uid-1",
        "gpufed.io/origin": DEFAULT_ORIGIN,
    }
    assert "namespace" not in job["metadata"]  # the input is not modified


@pytest.mark.parametrize(
    ("manifest", "fragment"),
    [
        (gpu_job("uid-1", namespace="kube-system"), "differs from the job namespace"),
        (
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "x"},
            },
            "ClusterRole.rbac.authorization.k8s.io is not allowed",
        ),
        ({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}}, "not allowed"),
        (gpu_job("someone-else"), "is not this job's UID"),
        (
            {**gpu_job("uid-1"), "metadata": {"name": "x", "labels": {ORIGIN: "other-hub"}}},
            "'other-hub' is not this agent's hub origin 'gpufed-hub' (start the agent with",
        ),
        ({"apiVersion": "batch/v1", "kind": "Job", "metadata": {}}, "metadata.name: missing"),
        ({"kind": "Job", "metadata": {"name": "x"}}, "apiVersion: missing"),
    ],
)
def test_manifests_outside_the_job_namespace_or_allow_list_are_refused(
    manifest: dict[str, object], fragment: str
) -> None:
    with pytest.raises(ManifestRefusedError, match="manifests\\[0\\]") as err:
        check_manifests([manifest], namespace="team-a", owner=own("uid-1"))
    assert fragment in str(err.value)


def test_main_workload_is_the_first_workload_kind() -> None:
    ref = main_workload([config_map("u"), gpu_job("u", "train")])
    assert ref is not None
    assert (ref.kind_group, ref.name) == ("Job.batch", "train")
    assert main_workload([]) is None


async def test_create_only_creates_then_adopts_without_updating() -> None:
    api = MemoryCluster()
    api.namespaces["team-a"] = {}
    job = check_manifests([gpu_job("uid-1")], namespace="team-a", owner=own("uid-1"))[0]
    assert await apply_object(api, job, owner=own("uid-1")) is ApplyResult.CREATED
    changed = {**job, "spec": {"parallelism": 99}}
    assert await apply_object(api, changed, owner=own("uid-1")) is ApplyResult.ADOPTED
    assert api.objects[ref_of(job)]["spec"] == job["spec"]  # never updated
    # A new job costs one request; an existing one is found by the 409 and read once.
    assert [op for op, _ in api.calls] == ["create", "create", "get"]


async def test_a_job_that_ran_is_not_created_again() -> None:
    api = MemoryCluster()
    api.namespaces["team-a"] = {}
    job = check_manifests([gpu_job("uid-1")], namespace="team-a", owner=own("uid-1"))[0]
    assert await apply_object(api, job, owner=own("uid-1"), may_create=False) is ApplyResult.MISSING
    assert not api.objects
    cm = check_manifests([config_map("uid-1")], namespace="team-a", owner=own("uid-1"))[0]
    assert await apply_object(api, cm, owner=own("uid-1"), may_create=False) is ApplyResult.MISSING


async def test_create_race_409_is_adopted_after_reread() -> None:
    api = MemoryCluster()
    api.namespaces["team-a"] = {}
    job = check_manifests([gpu_job("uid-1")], namespace="team-a", owner=own("uid-1"))[0]

    real_create = api.create

    async def create_racing(obj: dict[str, object]) -> dict[str, object]:
        api.put(obj)  # someone else (an earlier agent instance) created it meanwhile
        return await real_create(obj)

    api.create = create_racing  # type: ignore[method-assign]
    assert await apply_object(api, job, owner=own("uid-1")) is ApplyResult.ADOPTED


async def test_name_taken_by_another_job_is_reported_not_overwritten() -> None:
    api = MemoryCluster()
    api.namespaces["team-a"] = {}
    theirs = api.put(
        check_manifests([gpu_job("old-uid")], namespace="team-a", owner=own("old-uid"))[0]
    )
    job = check_manifests([gpu_job("new-uid")], namespace="team-a", owner=own("new-uid"))[0]
    with pytest.raises(OwnershipConflictError, match="belongs to job 'old-uid' of this hub") as err:
        await apply_object(api, job, owner=own("new-uid"), member="us-east")
    assert err.value.retryable is False  # a live job's object: retrying cannot help
    assert api.objects[ref_of(job)] == theirs
    cm = check_manifests([config_map("new-uid")], namespace="team-a", owner=own("new-uid"))[0]
    api.put({**cm, "metadata": {**cm["metadata"], "labels": {}}})
    with pytest.raises(OwnershipConflictError, match="carries no gpufed ownership labels"):
        await apply_object(api, cm, owner=own("new-uid"), may_create=False)


async def test_server_side_apply_over_own_object_is_conditional_on_the_version_read() -> None:
    """A new object costs one create; an existing one of this job is read, checked and applied
    (field manager gpufed, force) with the resourceVersion read as precondition."""
    api = MemoryCluster()
    api.namespaces["team-a"] = {}
    cm = check_manifests([config_map("uid-1")], namespace="team-a", owner=own("uid-1"))[0]
    assert await apply_object(api, cm, owner=own("uid-1")) is ApplyResult.CREATED
    uid = api.objects[ref_of(cm)]["metadata"]["uid"]
    assert await apply_object(api, cm, owner=own("uid-1")) is ApplyResult.APPLIED  # idempotent
    assert [op for op, _ in api.calls] == ["create", "create", "get", "apply"]
    assert api.objects[ref_of(cm)]["metadata"]["uid"] == uid  # the same object, updated


async def test_temporary_errors_retry_and_rejections_do_not() -> None:
    api = MemoryCluster()
    api.namespaces["team-a"] = {}
    cm = check_manifests([config_map("uid-1")], namespace="team-a", owner=own("uid-1"))[0]
    api.fail_next = [FakeApiError(503, "etcd leader changed"), FakeApiError(429, "slow down")]
    assert await apply_object(api, cm, owner=own("uid-1")) is ApplyResult.CREATED
    assert len(api.calls) == 3
    api.calls.clear()
    api.fail_next = [FakeApiError(422, 'ConfigMap "x" is invalid: data: Invalid value')]
    with pytest.raises(FakeApiError) as err:
        await apply_object(api, cm, owner=own("uid-1"))
    assert len(api.calls) == 1
    assert api_error_message(err.value) == 'ConfigMap "x" is invalid: data: Invalid value'


async def test_namespace_is_created_labelled_managed_once() -> None:
    api = MemoryCluster()
    assert await ensure_namespace(api, "team-a", origin="hub-x") is True
    assert api.namespaces["team-a"]["metadata"]["labels"] == {"gpufed.io/managed": "true"}
    assert await ensure_namespace(api, "team-a", origin="hub-x") is False


async def test_a_created_namespace_carries_the_pod_security_level_and_an_existing_one_is_left() -> (
    None
):
    """The member's own Pod Security Admission enforces the level the hub checked; a namespace
    the member's admins made is never relabelled."""
    api = MemoryCluster()
    assert await ensure_namespace(api, "team-a", "restricted", origin="hub-x") is True
    assert api.namespaces["team-a"]["metadata"]["labels"] == {
        "gpufed.io/managed": "true",
        "pod-security.kubernetes.io/enforce": "restricted",
    }
    theirs = {"metadata": {"name": "team-b", "labels": {"owner": "admins"}}}
    api.namespaces["team-b"] = theirs
    assert await ensure_namespace(api, "team-b", "baseline", origin="hub-x") is False
    assert api.namespaces["team-b"] == {
        "metadata": {"name": "team-b", "labels": {"owner": "admins"}}
    }


def grant_in(api: MemoryCluster, namespace: str) -> dict[str, Any] | None:
    ref = ObjectRef("rbac.authorization.k8s.io/v1", "RoleBinding", namespace, grant_name("hub-x"))
    return api.objects.get(ref)


async def test_the_workload_grant_goes_to_new_and_existing_namespaces_never_reserved_ones() -> None:
    """The agent may write a job's objects only where its grant binds the workload role: in a
    namespace it creates and in one that already existed; never in a reserved namespace."""
    api = MemoryCluster()
    api.namespaces["team-b"] = {"metadata": {"name": "team-b"}}
    api.namespaces["kube-system"] = {"metadata": {"name": "kube-system"}}
    for ns in ("team-a", "team-b", "kube-system"):
        await ensure_namespace(api, ns, origin="hub-x")
    for ns in ("team-a", "team-b"):
        grant = grant_in(api, ns)
        assert grant is not None
        assert is_grant(grant)
        assert grant["metadata"]["labels"] == {
            "gpufed.io/origin": "hub-x",
            "app.kubernetes.io/managed-by": "gpufed-agent",
        }
        assert grant["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "gpufed-agent-workload",
        }
    assert grant_in(api, "kube-system") is None


async def test_ensure_namespace_returns_once_the_authorizer_applies_the_new_grant() -> None:
    """RBAC follows a new RoleBinding a moment later: a write made at once would be refused
    (403), so ensure_namespace asks (SelfSubjectAccessReview) until it is allowed, on fake
    time, and gives up after a bounded number of reviews."""
    api = MemoryCluster()
    api.not_allowed_yet = 3
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    await ensure_namespace(api, "team-a", origin="hub-x", sleep=sleep)
    assert slept == [0.05, 0.1, 0.2]
    assert [op for op, _ in api.calls].count("allowed") == 4
    api.not_allowed_yet = 100  # never: the writes go ahead after the last review
    slept.clear()
    await ensure_namespace(api, "team-b", origin="hub-x", sleep=sleep)
    assert len(slept) == GRANT_WAIT_TRIES
    assert sum(slept) < 10


async def test_a_rolebinding_of_the_grants_name_made_by_someone_else_is_left_as_it_is() -> None:
    api = MemoryCluster()
    api.namespaces["team-a"] = {"metadata": {"name": "team-a"}}
    theirs = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": grant_name("hub-x"), "namespace": "team-a"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "User", "name": "alice"}],
    }
    stored = api.put(theirs)
    await ensure_namespace(api, "team-a", origin="hub-x")
    assert grant_in(api, "team-a") == stored
    assert not is_grant(stored)


async def test_delete_reports_whether_the_object_existed() -> None:
    api = MemoryCluster()
    api.namespaces["team-a"] = {}
    job = check_manifests([gpu_job("uid-1")], namespace="team-a", owner=own("uid-1"))[0]
    await apply_object(api, job, owner=own("uid-1"))
    assert await delete_object(api, ref_of(job)) is True
    assert await delete_object(api, ref_of(job)) is False


def test_api_error_message_falls_back_to_status_and_reason() -> None:
    class BareError(Exception):
        status = 500
        reason = "Internal Server Error"
        body = b"not json"

    assert api_error_message(BareError()) == "HTTP 500: Internal Server Error"
    assert api_error_message(ValueError("boom")) == "boom"
