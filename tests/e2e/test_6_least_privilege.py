"""The hub and the agents run with the shipped RBAC (manifests/), not as admin, and the agent's
identity cannot touch the reserved namespaces of its member.

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

from gpufed.sandbox import identities
from tests.e2e.harness import E2E

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
    member = sorted(e2e.members)[0]
    api = client_for(identities.kubeconfig_path(e2e.sandbox.state_dir, member))
    try:
        with pytest.raises(ApiException) as err:
            k8s.CoreV1Api(api).create_namespaced_config_map(
                namespace, {"metadata": {"name": "gpufed-drill"}, "data": {"k": "v"}}
            )
    finally:
        api.close()  # type: ignore[no-untyped-call]
    assert err.value.status == 403
    assert f"reserved namespace {namespace}" in str(err.value.body)


def test_the_agent_identity_may_create_in_a_tenant_namespace(e2e: E2E) -> None:
    member = sorted(e2e.members)[0]
    api = client_for(identities.kubeconfig_path(e2e.sandbox.state_dir, member))
    core = k8s.CoreV1Api(api)
    try:
        # (409 when an earlier run made it; any other refusal fails the create below)
        with contextlib.suppress(ApiException):
            core.create_namespace({"metadata": {"name": "gpufed-drill"}})
        core.create_namespaced_config_map(
            "gpufed-drill", {"metadata": {"generateName": "drill-"}, "data": {"k": "v"}}
        )
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
