"""``spec.placement.retry.nodeNotReadySeconds``: how long a not-Ready node under a running job
is waited out (gpufed.api.gpujob.Retry); bounded 0-3,600 in the model and in the CRD."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gpufed.api.gpujob import GPUJob, Retry

CRD = Path(__file__).parents[3] / "manifests" / "crds" / "gpufed.io_gpujobs.yaml"


def job(retry: dict[str, Any]) -> GPUJob:
    return GPUJob.model_validate(
        {
            "apiVersion": "gpufed.io/v1alpha1",
            "kind": "GPUJob",
            "metadata": {"name": "j", "namespace": "team-a", "uid": "u-1"},
            "spec": {
                "template": {"apiVersion": "batch/v1", "kind": "Job", "spec": {}},
                "placement": {"retry": retry},
            },
        }
    )


def test_node_not_ready_seconds_defaults_to_kubernetes_300s() -> None:
    assert Retry().node_not_ready_seconds == 300
    assert job({"nodeNotReadySeconds": 0}).spec.placement.retry is not None


@pytest.mark.parametrize("value", [-1, 3601])
def test_node_not_ready_seconds_out_of_bounds_is_refused_naming_the_field(value: int) -> None:
    with pytest.raises(ValidationError) as err:
        job({"nodeNotReadySeconds": value})
    (e,) = err.value.errors()
    assert e["loc"][-1] == "nodeNotReadySeconds"


def test_the_crd_bounds_node_not_ready_seconds() -> None:
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    field = spec["properties"]["placement"]["properties"]["retry"]["properties"][
        "nodeNotReadySeconds"
    ]
    assert (field["minimum"], field["maximum"], field["default"]) == (0, 3600, 300)
