"""`gpufed submit` and `gpufed delete` against the real hub API server (CRDs installed).

From a new user's report: a misspelt field (``spec.placment``) used to be dropped silently by
the API server's default field validation, and the job ran without the constraint.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpufed.cli.main import app
from tests.integration.hub.harness import HubAPI, gpu_job

pytestmark = pytest.mark.integration


def gpujob(name: str, spec_extra: dict[str, object]) -> dict[str, object]:
    return {
        "apiVersion": "gpufed.io/v1alpha1",
        "kind": "GPUJob",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"template": gpu_job(2), **spec_extra},
    }


def run(kubeconfig: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args, f"--kubeconfig={kubeconfig}"])
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("spec_extra", "field"),
    [
        ({"placment": {"gpuProducts": ["NVIDIA-H100-80GB-HBM3"]}}, "spec.placment"),
        ({"placement": {"gpuProduct": ["NVIDIA-H100-80GB-HBM3"]}}, "spec.placement.gpuProduct"),
    ],
)
async def test_submit_refuses_a_misspelt_field_naming_it(
    tmp_path: Path, hub_kubeconfig: Path, hub_api: HubAPI, spec_extra: dict[str, object], field: str
) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(gpujob("typo", spec_extra)))
    code, out = run(hub_kubeconfig, "submit", "-f", str(f))
    assert code == 1, out
    assert f'unknown field "{field}"' in out
    assert await hub_api.job("typo") is None, "nothing was created"


async def test_submit_then_delete_and_explain_of_a_missing_job_gives_a_hint(
    tmp_path: Path, hub_kubeconfig: Path, hub_api: HubAPI
) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(gpujob("short-lived", {})))
    code, out = run(hub_kubeconfig, "submit", "-f", str(f))
    assert code == 0, out
    assert await hub_api.job("short-lived") is not None
    # No hub runs in this test, so no finalizer holds the GPUJob: delete returns once it is gone.
    code, out = run(hub_kubeconfig, "delete", "team-a/short-lived", "--timeout", "30")
    assert code == 0, out
    assert "deleted" in out
    assert await hub_api.job("short-lived") is None
    code, out = run(hub_kubeconfig, "explain", "team-a/short-lived")
    assert code == 1
    assert "not found" in out
    assert "gpufed get jobs -A" in out
