"""``gpufed agent inventory --once --json`` against a real member: the documented shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import Member

pytestmark = pytest.mark.integration

GPU = "nvidia.com/gpu"


def test_inventory_once_json_has_the_documented_shape(member: Member) -> None:
    """Runs the installed command in its own process (as a user would; it configures logging
    for itself, which must not leak into the agents other tests run in this process)."""
    gpufed = Path(sys.executable).parent / "gpufed"
    args = ["agent", "inventory", "--once", "--json", "--cluster", member.name]
    result = subprocess.run(
        [str(gpufed), *args, "--kubeconfig", str(member.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {"cluster", "nodes", "summary"}
    assert set(report["summary"]) == {"gpus_total", "gpus_free"}
    assert report["cluster"] == member.name
    keys = {
        "name",
        "gpu_product",
        "nvlink_domain",
        "ready",
        "schedulable",
        "taints",
        "allocatable",
        "requested",
        "free",
        "gpus_via_dra",  # whole GPUs published through DRA ResourceSlices (0: none)
    }
    gpu_nodes = [n for n in report["nodes"] if GPU in n["allocatable"]]
    assert gpu_nodes
    for n in report["nodes"]:
        assert set(n) == keys
        assert all(
            isinstance(v, int)
            for k, v in n["allocatable"].items()
            if k == GPU or k.startswith("nvidia.com/mig-")
        )
        assert isinstance(n["allocatable"].get("cpu", ""), str)
        assert all(
            (isinstance(v, int) and v >= 0) or isinstance(v, str) for v in n["free"].values()
        )
    assert all(v >= 0 for v in report["summary"]["gpus_free"].values())
