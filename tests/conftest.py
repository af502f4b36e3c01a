"""Shared pytest fixtures.

Integration fixtures (they need the control-plane binaries; ``make integration`` builds them):

* ``sandbox`` (session): one sandbox for the whole test session, a hub and two members
  (``alpha``, ``beta``) from ``tests/fleets/small.yaml``, state dir under pytest's tmp dir,
  stopped at session end. It yields :class:`gpufed.sandbox.runtime.SandboxInfo`
  (``kubeconfig``, ``etcd_url``, ``hub_etcd_prefix``, ``clusters[name].server`` …).
  Share it: bringing one up costs ~10 s of a 2-core machine. Tests that change cluster-wide
  state must undo it; put objects in a namespace of your own.
* ``sandbox_runtime`` (session): the :class:`~gpufed.sandbox.runtime.Sandbox` behind it, for
  ``supervisor.kill/start`` of components, ``status()``, ``inventory()``.
* ``kube`` (session): ``kube("hub")`` / ``kube("alpha")`` -> a cached synchronous
  ``kubernetes.client.ApiClient`` for that context.
* ``kube_async`` (function): ``await kube_async("alpha")`` -> a ``kubernetes_asyncio``
  ApiClient, closed after the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from gpufed.api.fleet import FleetSpec
from gpufed.sandbox.binaries import BinariesError, BinDir, ensure_binaries
from gpufed.sandbox.kube import async_api_client
from gpufed.sandbox.runtime import Sandbox, SandboxInfo

REPO_ROOT = Path(__file__).resolve().parent.parent
SMALL_FLEET = REPO_ROOT / "tests" / "fleets" / "small.yaml"


@pytest.fixture(scope="session")
def sandbox_bin_dir() -> BinDir:
    """The control-plane binaries (built on first use, ~6 min cold)."""
    try:
        return ensure_binaries(progress=None)
    except BinariesError as exc:
        pytest.fail(f"control-plane binaries unavailable: {exc}")


@pytest.fixture(scope="session")
def small_fleet() -> FleetSpec:
    """tests/fleets/small.yaml: alpha (2 HGX H100 + 1 A100 mixed-MIG node, tainted) and beta
    (4 GB200 trays in 2 NVLink cliques)."""
    return FleetSpec.load(SMALL_FLEET)


@pytest.fixture(scope="session")
def sandbox_runtime(
    tmp_path_factory: pytest.TempPathFactory, sandbox_bin_dir: BinDir
) -> Iterator[Sandbox]:
    """The session's :class:`Sandbox`, up for the whole session."""
    sb = Sandbox(tmp_path_factory.mktemp("sandbox"), bin_dir=sandbox_bin_dir)
    sb.up(SMALL_FLEET)
    try:
        yield sb
    finally:
        sb.down()


@pytest.fixture(scope="session")
def sandbox(sandbox_runtime: Sandbox) -> SandboxInfo:
    """:class:`SandboxInfo` of the session sandbox (hub + alpha + beta)."""
    return sandbox_runtime.info()


@pytest.fixture(scope="session")
def kube(sandbox: SandboxInfo) -> Iterator[Callable[[str], k8s.ApiClient]]:
    """``kube(context)`` -> cached sync ApiClient for ``hub`` or a member."""
    clients: dict[str, k8s.ApiClient] = {}

    def get(context: str) -> k8s.ApiClient:
        if context not in clients:
            clients[context] = sandbox.api_client(context)
        return clients[context]

    yield get
    for c in clients.values():
        c.close()


@pytest.fixture
async def kube_async(sandbox: SandboxInfo) -> AsyncIterator[Callable[[str], Awaitable[Any]]]:
    """``await kube_async(context)`` -> kubernetes_asyncio ApiClient, closed after the test."""
    opened: list[Any] = []

    async def get(context: str) -> Any:
        c = await async_api_client(sandbox.kubeconfig, sandbox.clusters[context].context)
        opened.append(c)
        return c

    yield get
    for c in opened:
        await c.close()
