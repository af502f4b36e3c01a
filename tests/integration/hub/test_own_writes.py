"""The hub's two writes of one GPUJob — its status and its finalizer — do not conflict with each
other on a real hub API server, while a change by anyone else still fails the precondition.

Both writes carry a resourceVersion precondition. Before, a status write conditioned on the view
the finalizer patch started from failed with 409 (and the finalizer patch after a status write
too; each 409 cost a GET and a second write): the API server decides here, not the hub's code.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from gpufed.api.labels import FINALIZER
from gpufed.hub.adapters.kube import KubeAPI
from tests.integration.hub.harness import HubAPI, gpu_job

pytestmark = pytest.mark.integration

NS = "team-a"


@pytest.fixture
async def kube(hub_kubeconfig: Path) -> AsyncIterator[KubeAPI]:
    api = await KubeAPI.connect(hub_kubeconfig)
    try:
        yield api
    finally:
        await api.close()


async def test_status_and_finalizer_writes_from_one_view_both_land_without_a_conflict(
    hub_api: HubAPI, kube: KubeAPI
) -> None:
    created = await hub_api.create_job("own-writes", gpu_job(8))
    rv0 = created["metadata"]["resourceVersion"]
    # 1. Both computed from the same view (the watch's ADDED), sent at once.
    new_rv, obj = await asyncio.gather(
        kube.patch_job_status(NS, "own-writes", {"message": "placed"}, rv0),
        kube.set_job_finalizers(NS, "own-writes", [FINALIZER], rv0),
    )
    stored = await hub_api.job("own-writes")
    assert stored is not None
    assert stored["status"]["message"] == "placed"
    assert stored["metadata"]["finalizers"] == [FINALIZER]
    assert stored["metadata"]["resourceVersion"] in (new_rv, obj["metadata"]["resourceVersion"])
    # 2. A status write from a view that lags behind both (a watch event not yet delivered).
    rv2 = await kube.patch_job_status(NS, "own-writes", {"message": "running"}, rv0)
    # 3. The finalizer list as of rv0 is not the one now: a finalizer write from rv0 must not
    # skip our own finalizer patch.
    with pytest.raises(ApiException) as refused:
        await kube.set_job_finalizers(NS, "own-writes", [], rv0)
    assert refused.value.status == 409
    # 4. Anyone else's change still fails a status write conditioned on a view before it.
    await hub_api.custom.patch_namespaced_custom_object(
        "gpufed.io",
        "v1alpha1",
        NS,
        "gpujobs",
        "own-writes",
        {"metadata": {"labels": {"someone": "else"}}},
        _content_type="application/merge-patch+json",
    )
    with pytest.raises(ApiException) as conflict:
        await kube.patch_job_status(NS, "own-writes", {"message": "stale"}, rv2)
    assert conflict.value.status == 409
    stored = await hub_api.job("own-writes")
    assert stored is not None
    assert stored["status"]["message"] == "running"
    assert stored["metadata"]["finalizers"] == [FINALIZER]
