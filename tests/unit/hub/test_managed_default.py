"""Plain workloads at the hub are off unless asked for (hostile review H3: with a kind on,
whoever may create a Job may run GPU jobs, whatever RBAC says about ``gpujobs``): the hub's
config, its ``--managed-kinds`` flag and the Helm chart default to none; the kustomize base (the
RBAC the sandbox hub runs with) and the chart's CI values, which must render it, opt in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufed.hub.components.config import HubConfig
from tests.unit.cli.test_hub_flags import config_of
from tests.unit.hub.term import Term

ROOT = Path(__file__).resolve().parents[3]
BOTH = frozenset({"Job", "JobSet"})


def test_a_hub_config_without_managed_kinds_federates_no_plain_workload() -> None:
    """The config default is empty, and a controller built with it runs no list or watch of
    Jobs, JobSets or their GPUJobs (so no labelled Job ever becomes a GPUJob)."""
    assert HubConfig(insecure=True).managed_kinds == frozenset()
    t = Term()
    assert t.ctrl.managed.loops() == []
    t.ctrl.stop("test over")
    opted_in = Term(config=HubConfig(insecure=True, managed_kinds=BOTH))
    loops = opted_in.ctrl.managed.loops()
    assert len(loops) == 3  # the GPUJobs it made, Jobs, JobSets
    for loop in loops:
        loop.close()
    opted_in.ctrl.stop("test over")


@pytest.mark.parametrize(
    ("args", "kinds"),
    [
        ([], frozenset()),
        (["--managed-kinds", "Job,JobSet"], BOTH),
        (["--managed-kinds", " Job "], frozenset({"Job"})),
        (["--managed-kinds", ""], frozenset()),
    ],
)
def test_the_managed_kinds_flag_defaults_to_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], kinds: frozenset[str]
) -> None:
    config = config_of(tmp_path, monkeypatch, args)
    assert config.managed_kinds == kinds


def _yaml(path: str) -> Any:
    return yaml.safe_load((ROOT / path).read_text())


def test_the_chart_defaults_to_none_and_its_ci_values_opt_in_as_the_kustomize_base_does() -> None:
    """The chart's default is ``[]``; the kustomize base passes ``--managed-kinds=Job,JobSet``
    and holds the rules the hub then needs (read Jobs, patch their status, create and delete
    GPUJobs); the chart's CI values opt in alike (tests/integration/test_helm_charts.py checks
    that both render the same objects)."""
    assert _yaml("charts/gpufed-hub/values.yaml")["managedKinds"] == []
    assert set(_yaml("charts/gpufed-hub/ci/test-values.yaml")["managedKinds"]) == BOTH
    deployment = next(
        d
        for d in yaml.safe_load_all((ROOT / "manifests/hub/deployment.yaml").read_text())
        if d and d["kind"] == "Deployment"
    )
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--managed-kinds=Job,JobSet" in args
    role = next(
        d
        for d in yaml.safe_load_all((ROOT / "manifests/hub/rbac.yaml").read_text())
        if d and d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpufed-hub"
    )
    rules = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert {"get", "list", "watch"} <= rules[("batch", "jobs")]
    assert rules[("batch", "jobs/status")] == {"patch"}
    assert {"create", "delete"} <= rules[("gpufed.io", "gpujobs")]
