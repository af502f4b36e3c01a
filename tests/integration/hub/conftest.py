"""Fixtures for hub integration tests, on the session sandbox (tests/conftest.py).

The hub tests use the sandbox's hub API server (with the gpufed CRDs applied here, once) and its
etcd, each test under a fresh key prefix; member clusters are played by a fake agent over real
gRPC (harness.py). Every GPUJob, MemberCluster and join Secret a test made is removed after it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpufed.cli.hubadmin import install_crds
from gpufed.hub.adapters.store import Store
from gpufed.sandbox.runtime import SandboxInfo
from tests.integration.hub.harness import JOB_NAMESPACES, TOKEN_NAMESPACE, HubAPI, wait_until


@pytest.fixture(scope="session")
def etcd_endpoint(sandbox: SandboxInfo) -> str:
    """``host:port`` of the sandbox's etcd (each hub test uses its own key prefix)."""
    return sandbox.etcd_url.split("://", 1)[-1].rstrip("/")


@pytest.fixture(scope="session")
def hub_kubeconfig(sandbox: SandboxInfo) -> Path:
    """The sandbox hub's admin kubeconfig, with the gpufed CRDs and test namespaces in place."""
    api = sandbox.api_client("hub")
    install_crds(api)
    core = k8s.CoreV1Api(api)
    for ns in (TOKEN_NAMESPACE, *JOB_NAMESPACES):
        with contextlib.suppress(ApiException):
            core.create_namespace({"metadata": {"name": ns}})
    custom = k8s.CustomObjectsApi(api)

    def served() -> bool:
        try:
            custom.list_cluster_custom_object("gpufed.io", "v1alpha1", "gpujobs")
            custom.list_cluster_custom_object("gpufed.io", "v1alpha1", "memberclusters")
            custom.list_cluster_custom_object("gpufed.io", "v1alpha1", "gpuqueues")
        except ApiException:
            return False
        return True

    wait_until(served, "the gpufed CRDs to be served")
    return sandbox.hub.kubeconfig


@pytest.fixture
def prefix() -> str:
    """A fresh etcd key prefix per test."""
    return f"/hubtest/{uuid.uuid4().hex[:8]}/"


@pytest.fixture
async def store(etcd_endpoint: str, prefix: str) -> AsyncIterator[Store]:
    s = await Store.connect([etcd_endpoint], prefix=prefix, hub_id="hub-a")
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def hub_api(hub_kubeconfig: Path) -> AsyncIterator[HubAPI]:
    """Test access to the hub API server; what the test made is removed afterwards."""
    api = await HubAPI.connect(hub_kubeconfig)
    try:
        yield api
    finally:
        await api.cleanup()
        await api.close()
