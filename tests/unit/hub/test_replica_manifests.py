"""The hub's shipped manifests keep every replica useful (manifests/hub/): the Service selects
the Pod label the leader sets (gpufed.api.labels.HUB_ROLE_LABEL), the replicas get their Pod's
name and namespace, the hub may patch its Pods, a rollout surges before it removes a Ready
replica, and the PodDisruptionBudget leaves one replica standing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpufed.api.labels import HUB_ROLE_LABEL

HUB = Path(__file__).resolve().parents[3] / "manifests" / "hub"


def docs(name: str) -> dict[str, dict[str, Any]]:
    return {
        f"{d['kind']}/{d['metadata']['name']}": d
        for d in yaml.safe_load_all((HUB / name).read_text())
        if d
    }


def test_the_service_selects_the_leaders_pod_label_and_the_pdb_keeps_one_replica() -> None:
    found = docs("deployment.yaml")
    deploy = found["Deployment/gpufed-hub"]
    selector = found["Service/gpufed-hub"]["spec"]["selector"]
    assert selector == {"app.kubernetes.io/name": "gpufed-hub", HUB_ROLE_LABEL: "leader"}
    metrics = found["Service/gpufed-hub-metrics"]["spec"]
    assert metrics["selector"] == {"app.kubernetes.io/name": "gpufed-hub"}, "every replica"
    assert deploy["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pdb = found["PodDisruptionBudget/gpufed-hub"]["spec"]
    assert pdb["minAvailable"] < deploy["spec"]["replicas"]
    assert pdb["selector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    env = {
        e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
        for e in container["env"]
        if "fieldRef" in e.get("valueFrom", {})
    }
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_the_hub_may_patch_its_own_pods_and_nothing_else_about_pods() -> None:
    found = docs("rbac.yaml")
    role = found["Role/gpufed-hub-pod-role"]
    assert role["metadata"]["namespace"] == "gpufed-system"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
    binding = found["RoleBinding/gpufed-hub-pod-role"]
    assert binding["roleRef"]["name"] == "gpufed-hub-pod-role"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpufed-hub", "namespace": "gpufed-system"}
    ]
    cluster_role = found["ClusterRole/gpufed-hub"]
    assert not any("pods" in r["resources"] for r in cluster_role["rules"])
