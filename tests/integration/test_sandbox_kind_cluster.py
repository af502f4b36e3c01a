"""kind provider end to end: where a Docker engine runs, the fleet comes up as kind clusters
with kwok GPU nodes. Skipped (with the reason) where `docker info` fails, as on the 2-core
development machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufed.api.fleet import FleetSpec
from gpufed.sandbox.kind import KindProvider, kind_cluster_name
from gpufed.sandbox.kube import api_client, list_nodes_raw

pytestmark = pytest.mark.integration

ONE_NODE = """
clusters:
  - name: kindm
    nodePools:
      - {name: hgx, nodes: 1, gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}}
"""


def test_fleet_as_kind_clusters_with_kwok_gpu_nodes(tmp_path: Path) -> None:
    ok, reason = KindProvider.available()
    if not ok:
        pytest.skip(f"kind provider needs a Docker engine: {reason}")
    fleet = FleetSpec.loads(ONE_NODE)
    provider = KindProvider(tmp_path)
    try:
        kubeconfig = provider.up(fleet)
        api = api_client(kubeconfig, f"kind-{kind_cluster_name('kindm')}")
        names = {n["metadata"]["name"] for n in list_nodes_raw(api)}
        assert "kindm-hgx-000" in names
    finally:
        provider.down(fleet)
