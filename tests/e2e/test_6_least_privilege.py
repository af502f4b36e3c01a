"""The hub and the agents run with the shipped RBAC (manifests/), not as admin; the agent's
identity cannot touch the reserved namespaces of its member, reads Secrets only in the
namespaces its jobs landed in, and cannot grant itself or anyone else more.

The whole e2e suite runs on these identities (sandbox/identities.py), so every drill exercises
the shipped permissions; this file pins what the identities are, and what the agent's may not
do, with the very kubeconfigs the processes use.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from gpufed.api.labels import DEFAULT_ORIGIN, JOB_UID_LABEL, ORIGIN_LABEL
from gpufed.sandbox import identities
from gpufed.sync.grants import GRANT_SELECTOR, WORKLOAD_ROLE, grant_manifest
from tests.e2e.harness import DRILL_NS, E2E, batch_job, unique, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def client_for(path: Path) -> k8s.ApiClient:
    return k8s_config.new_client_from_config(config_file=str(path))


def user_of(path: Path) -> str:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return str(doc["users"][0]["name"])


def test_the_hub_and_every_agent_run_as_their_service_accounts(e2e: E2E) -> None:
    state = e2e.sandbox.state_dir
    assert user_of(identities.kubeconfig_path(state, "hub")) == "gpufed-hub"
    for member in e2e.members:
        path = identities.kubeconfig_path(state, member)
        assert user_of(path) == "gpufed-agent"
        api = client_for(path)
        try:
            review = k8s.AuthenticationV1Api(api).create_self_subject_review(
                k8s.V1SelfSubjectReview()
            )
        finally:
            api.close()  # type: ignore[no-untyped-call]
        assert (
            review.status.user_info.username == "system:serviceaccount:gpufed-system:gpufed-agent"
        )


@pytest.mark.parametrize("namespace", ["kube-system", "kube-public", "gpufed-system"])
def test_the_agent_identity_may_create_nothing_in_a_reserved_namespace(
    e2e: E2E, namespace: str
) -> None:
    """No grant there, so RBAC refuses the job's kinds; and the one thing RBAC lets it create
    anywhere, its own grant, is refused there by the admission policy."""
    member = sorted(e2e.members)[0]
    api = client_for(identities.kubeconfig_path(e2e.sandbox.state_dir, member))
    try:
        with pytest.raises(ApiException) as err:
            k8s.CoreV1Api(api).create_namespaced_config_map(
                namespace, {"metadata": {"name": "gpufed-drill"}, "data": {"k": "v"}}
            )
        assert err.value.status == 403
        with pytest.raises(ApiException) as err:
            k8s.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
                namespace, grant_manifest(namespace, DEFAULT_ORIGIN)
            )
    finally:
        api.close()  # type: ignore[no-untyped-call]
    assert err.value.status == 403
    assert f"reserved namespace {namespace}" in str(err.value.body)


def test_the_agent_identity_may_create_in_a_tenant_namespace_once_granted(e2e: E2E) -> None:
    """What the agent does for a job: create the namespace, its grant there, then the job's
    objects (a ConfigMap before the grant is 403)."""
    member = sorted(e2e.members)[0]
    api = client_for(identities.kubeconfig_path(e2e.sandbox.state_dir, member))
    core = k8s.CoreV1Api(api)
    cm = {"metadata": {"generateName": "drill-"}, "data": {"k": "v"}}
    try:
        # (409 when an earlier run made it; any other refusal fails the create below)
        with contextlib.suppress(ApiException):
            core.create_namespace({"metadata": {"name": "gpufed-drill"}})
        if (
            not k8s.RbacAuthorizationV1Api(e2e.members[member].api)
            .list_namespaced_role_binding("gpufed-drill", label_selector=GRANT_SELECTOR)
            .items
        ):
            with pytest.raises(ApiException) as err:
                core.create_namespaced_config_map("gpufed-drill", cm)
            assert err.value.status == 403
            k8s.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
                "gpufed-drill", grant_manifest("gpufed-drill", DEFAULT_ORIGIN)
            )

        def created() -> bool:
            # A new RoleBinding reaches the API server's authorizer through its informer: a
            # moment later, longer on a loaded machine (CI met a 403 right after the grant).
            try:
                core.create_namespaced_config_map("gpufed-drill", cm)
            except ApiException as exc:
                if exc.status != 403:
                    raise
                return False
            return True

        wait_until(created, "the grant to take effect", 30)
    finally:
        api.close()  # type: ignore[no-untyped-call]


def test_the_hub_identity_cannot_read_secrets_outside_its_namespace(e2e: E2E) -> None:
    api = client_for(identities.kubeconfig_path(e2e.sandbox.state_dir, "hub"))
    try:
        with pytest.raises(ApiException) as err:
            k8s.CoreV1Api(api).list_namespaced_secret("kube-system")
        assert err.value.status == 403
    finally:
        api.close()  # type: ignore[no-untyped-call]


# --- Secrets are readable only where gpufed runs jobs (the workload grants, sync/grants.py) -----

NEVER_USED = "gpufed-never-used"


@pytest.fixture(scope="module")
def landed(e2e_session: E2E) -> tuple[str, str]:
    """A GPUJob that ran in the drill namespace: (the member it landed in, its namespace)."""
    e2e_session.wait_healthy()
    job = e2e_session.hub.submit(unique("lp"), batch_job(1, run_for="1s"))
    uid = job["metadata"]["uid"]
    copies = wait_until(lambda: e2e_session.copies(uid) or None, "the job's copy in a member")
    [member] = copies
    # A namespace of that member that gpufed never used, with a Secret of its admins in it.
    core = e2e_session.members[member].core
    with contextlib.suppress(ApiException):
        core.create_namespace({"metadata": {"name": NEVER_USED}})
    with contextlib.suppress(ApiException):
        core.create_namespaced_secret(
            NEVER_USED, {"metadata": {"name": "admins"}, "stringData": {"k": "v"}}
        )
    return member, DRILL_NS


def test_the_agent_identity_reads_secrets_only_where_a_job_landed(
    e2e: E2E, landed: tuple[str, str]
) -> None:
    """With the agent's own token: Secrets of a namespace a job landed in can be listed;
    those of a namespace gpufed never used, and of all namespaces at once, are 403."""
    member, used = landed
    api = client_for(identities.kubeconfig_path(e2e.sandbox.state_dir, member))
    core = k8s.CoreV1Api(api)
    try:
        core.list_namespaced_secret(used)
        core.list_namespaced_config_map(used)
        for read in (
            lambda: core.list_namespaced_secret(NEVER_USED),
            lambda: core.read_namespaced_secret("admins", NEVER_USED),
            lambda: core.list_namespaced_config_map(NEVER_USED),
            core.list_secret_for_all_namespaces,
        ):
            with pytest.raises(ApiException) as err:
                read()
            assert err.value.status == 403
    finally:
        api.close()  # type: ignore[no-untyped-call]
    # The grant that allows it: the workload role, bound to the agent alone, labelled.
    rbac = k8s.RbacAuthorizationV1Api(e2e.members[member].api)
    [grant] = rbac.list_namespaced_role_binding(used, label_selector=GRANT_SELECTOR).items
    assert grant.metadata.labels[ORIGIN_LABEL] == DEFAULT_ORIGIN
    assert (grant.role_ref.kind, grant.role_ref.name) == ("ClusterRole", WORKLOAD_ROLE)
    assert [(s.kind, s.namespace, s.name) for s in grant.subjects] == [
        ("ServiceAccount", "gpufed-system", "gpufed-agent")
    ]
    assert not rbac.list_namespaced_role_binding(NEVER_USED).items


def _binding(role_kind: str, role: str, subject: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"generateName": "drill-"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [subject],
    }


AGENT_SA = {"kind": "ServiceAccount", "name": "gpufed-agent", "namespace": "gpufed-system"}
OTHER_SA = {"kind": "ServiceAccount", "name": "default", "namespace": NEVER_USED}


@pytest.mark.parametrize(
    ("role_kind", "role", "subject", "why"),
    [
        ("ClusterRole", "cluster-admin", AGENT_SA, "not currently held"),  # RBAC: no bind
        ("ClusterRole", "admin", AGENT_SA, "not currently held"),
        ("ClusterRole", WORKLOAD_ROLE, OTHER_SA, "its own ServiceAccount"),  # admission policy
    ],
)
def test_the_agent_identity_cannot_grant_more_than_its_workload_role_to_itself(
    e2e: E2E, landed: tuple[str, str], role_kind: str, role: str, subject: dict[str, str], why: str
) -> None:
    member, _ = landed
    api = client_for(identities.kubeconfig_path(e2e.sandbox.state_dir, member))
    try:
        with pytest.raises(ApiException) as err:
            k8s.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
                NEVER_USED, _binding(role_kind, role, subject)
            )
    finally:
        api.close()  # type: ignore[no-untyped-call]
    assert err.value.status == 403
    assert why in str(err.value.body)


def test_the_agent_identity_deletes_only_pods_labelled_as_a_gpufed_jobs(
    e2e: E2E, landed: tuple[str, str]
) -> None:
    """The workload role's pod ``delete`` (a deleted copy's pods stranded on a gone node,
    gpufed.agent.stranded) reaches only pods labelled gpufed.io/job-uid: the admission policy
    refuses the rest, where the grant would allow it."""
    member, used = landed
    admin = e2e.members[member].core
    names: dict[bool, str] = {}
    for labelled in (True, False):
        pod = {
            "metadata": {
                "generateName": "drill-",
                "labels": {JOB_UID_LABEL: "drill"} if labelled else {"drill": "yes"},
            },
            # bound to a node that does not exist: nothing schedules or runs it
            "spec": {
                "nodeName": "drill-gone",
                "securityContext": {
                    "runAsNonRoot": True,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [
                    {
                        "name": "c",
                        "image": "x:1",
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ],
            },
        }
        names[labelled] = admin.create_namespaced_pod(used, pod).metadata.name
    api = client_for(identities.kubeconfig_path(e2e.sandbox.state_dir, member))
    core = k8s.CoreV1Api(api)
    try:
        with pytest.raises(ApiException) as err:
            core.delete_namespaced_pod(names[False], used, grace_period_seconds=0)
        core.delete_namespaced_pod(names[True], used, grace_period_seconds=0)
    finally:
        api.close()  # type: ignore[no-untyped-call]
        with contextlib.suppress(ApiException):
            admin.delete_namespaced_pod(names[False], used, grace_period_seconds=0)
    assert err.value.status == 403
    assert "only delete pods labelled gpufed.io/job-uid" in str(err.value.body)
