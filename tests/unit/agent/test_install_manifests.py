"""The install manifests (manifests/agent, manifests/hub): well-formed, complete kustomizations,
least-privilege RBAC, and agent arguments the real CLI accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.main import get_command

from gpufed.api.labels import JOB_UID_LABEL
from gpufed.cli.agent import app as agent_app
from gpufed.sync.grants import RESERVED_NAMESPACES, WORKLOAD_ROLE, grant_manifest
from gpufed.sync.manifests import DEFAULT_ALLOWED_KINDS

ROOT = Path(__file__).resolve().parents[3] / "manifests"


def docs(component: str) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((ROOT / component / "kustomization.yaml").read_text())
    out: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        out += [d for d in yaml.safe_load_all((ROOT / component / name).read_text()) if d]
    return out


@pytest.mark.parametrize("component", ["agent", "hub"])
def test_kustomization_lists_every_file_and_objects_are_namespaced_in_gpufed_system(
    component: str,
) -> None:
    files = {p.name for p in (ROOT / component).glob("*.yaml")} - {"kustomization.yaml"}
    kustomization = yaml.safe_load((ROOT / component / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == files
    kinds = {d["kind"] for d in docs(component)}
    assert {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
    } <= kinds
    cluster_scoped = (
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    )
    for d in docs(component):
        if d["kind"] not in cluster_scoped:
            assert d["metadata"]["namespace"] == "gpufed-system", d["metadata"]["name"]


@pytest.mark.parametrize("component", ["agent", "hub"])
def test_rbac_has_no_wildcards_and_no_escalation(component: str) -> None:
    for d in docs(component):
        if d["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in d["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(field, []), (d["metadata"]["name"], rule)
            assert not {"escalate", "impersonate"} & set(rule["verbs"])
            if "bind" in rule["verbs"]:
                # The one exception: the agent binds exactly its workload role (sync/grants.py).
                assert (component, d["metadata"]["name"]) == ("agent", "gpufed-agent")
                assert rule["verbs"] == ["bind"]
                assert rule["resources"] == ["clusterroles"]
                assert rule["resourceNames"] == [WORKLOAD_ROLE]


def agent_rules(name: str = "gpufed-agent") -> dict[tuple[str, str], set[str]]:
    role = next(
        d for d in docs("agent") if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name
    )
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                out.setdefault((group, res), set()).update(rule["verbs"])
    return out


def test_agent_may_read_nodes_and_pods_but_not_change_them() -> None:
    rules = agent_rules()
    assert rules[("", "nodes")] == {"get", "list", "watch"}
    assert rules[("", "pods")] == {"get", "list", "watch"}
    assert rules[("", "namespaces")] == {"get", "list", "watch", "create"}  # never deletes


def test_the_cluster_wide_role_reads_workloads_and_touches_no_secret_anywhere() -> None:
    """Cluster-wide, the agent reads what inventory and status watch in every namespace, and
    writes only Namespaces and its grants; Secrets, ConfigMaps and Services are not in it."""
    rules = agent_rules()
    for kind in (
        ("batch", "jobs"),
        ("jobset.x-k8s.io", "jobsets"),
        ("kubeflow.org", "pytorchjobs"),
        ("kubeflow.org", "mpijobs"),
        ("ray.io", "rayjobs"),
    ):
        assert rules[kind] == {"get", "list", "watch"}
    assert rules[("rbac.authorization.k8s.io", "rolebindings")] == {"get", "list", "create"}
    assert rules[("rbac.authorization.k8s.io", "clusterroles")] == {"bind"}
    writes = {k for k, verbs in rules.items() if verbs - {"get", "list", "watch"}}
    assert writes == {
        ("", "namespaces"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("rbac.authorization.k8s.io", "clusterroles"),
    }
    assert not {("", "secrets"), ("", "configmaps"), ("", "services")} & set(rules)
    [binding] = [d for d in docs("agent") if d["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == "gpufed-agent"  # the workload role is never bound so


def test_the_workload_role_manages_exactly_the_allowed_kinds() -> None:
    rules = agent_rules(WORKLOAD_ROLE)
    plural = {
        "Job.batch": ("batch", "jobs"),
        "JobSet.jobset.x-k8s.io": ("jobset.x-k8s.io", "jobsets"),
    }
    plural |= {"PyTorchJob.kubeflow.org": ("kubeflow.org", "pytorchjobs")}
    plural |= {"MPIJob.kubeflow.org": ("kubeflow.org", "mpijobs")}
    plural |= {"RayJob.ray.io": ("ray.io", "rayjobs")}
    plural |= {k: ("", k.lower() + "s") for k in ("ConfigMap", "Secret", "Service")}
    plural |= {
        "ResourceClaimTemplate.resource.k8s.io": ("resource.k8s.io", "resourceclaimtemplates")
    }
    # plus the ComputeDomain the hub renders for a multi-node NVLink job (never a user's)
    plural |= {"ComputeDomain.resource.nvidia.com": ("resource.nvidia.com", "computedomains")}
    # plus delete (only) on pods: a deleted copy's pods stranded on a Node that no longer exists
    # (gpufed.agent.stranded), and only pods labelled as a gpufed job's (admission.yaml)
    assert rules.pop(("", "pods")) == {"delete"}
    assert set(rules) == {
        plural[k] for k in DEFAULT_ALLOWED_KINDS | {"ComputeDomain.resource.nvidia.com"}
    }
    for verbs in rules.values():
        assert {"get", "list", "watch", "create", "delete"} <= verbs
    assert "patch" not in rules[("batch", "jobs")]  # create-only
    assert "update" not in set().union(*rules.values())


def test_the_grant_the_agent_writes_is_the_one_its_rbac_and_admission_allow() -> None:
    grant = grant_manifest("team-a", "gpufed-hub")
    assert grant["roleRef"]["name"] == WORKLOAD_ROLE
    assert grant["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpufed-agent", "namespace": "gpufed-system"}
    ]
    [sa] = [d for d in docs("agent") if d["kind"] == "ServiceAccount"]
    assert (sa["metadata"]["namespace"], sa["metadata"]["name"]) == (
        "gpufed-system",
        "gpufed-agent",
    )
    [policy] = [d for d in docs("agent") if d["kind"] == "ValidatingAdmissionPolicy"]
    [rb_rule] = [v for v in policy["spec"]["validations"] if "rolebindings" in v["expression"]]
    for needle in (
        f"'{WORKLOAD_ROLE}'",
        "'gpufed-agent'",
        "'gpufed-system'",
        "size(object.subjects) == 1",
    ):
        assert needle in rb_rule["expression"]
    reserved = next(v for v in policy["spec"]["variables"] if v["name"] == "reserved")
    for ns in RESERVED_NAMESPACES:
        assert f"'{ns}'" in reserved["expression"]


def test_the_agent_may_delete_only_pods_labelled_as_a_gpufed_jobs() -> None:
    """RBAC cannot select by label: the admission policy refuses the agent's delete of a pod
    without gpufed.io/job-uid (the only pods it deletes are a copy's, stranded on a gone node)."""
    [policy] = [d for d in docs("agent") if d["kind"] == "ValidatingAdmissionPolicy"]
    [rule] = [v for v in policy["spec"]["validations"] if "'pods'" in v["expression"]]
    for needle in ("request.operation != 'DELETE'", f"'{JOB_UID_LABEL}' in oldObject.metadata"):
        assert needle in rule["expression"]


def test_agent_deployment_arguments_are_accepted_by_the_cli() -> None:
    deployment = next(d for d in docs("agent") if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[0] == "agent"
    flags = {a.split("=", 1)[0] for a in args[1:]}
    command = get_command(agent_app)
    known = {opt for p in command.params for opt in p.opts}
    assert flags <= known
    assert {"--cluster", "--hub", "--token-file", "--ca-file"} <= flags
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "http")
    assert f"--health-port={port}" in args
    assert deployment["spec"]["strategy"]["type"] == "Recreate"


def test_hub_deployment_arguments_are_accepted_by_the_cli() -> None:
    from gpufed.cli.hub import app as hub_app

    deployment = next(d for d in docs("hub") if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[0] == "hub"
    flags = {a.split("=", 1)[0] for a in args[1:]}
    known = {opt for p in get_command(hub_app).params for opt in p.opts}
    assert flags <= known, flags - known
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--listen=0.0.0.0:{ports['grpc']}" in args
    assert f"--http-listen=0.0.0.0:{ports['http']}" in args


def test_the_agents_admission_policy_guards_every_reserved_namespace_for_its_account() -> None:
    [policy] = [d for d in docs("agent") if d["kind"] == "ValidatingAdmissionPolicy"]
    [binding] = [d for d in docs("agent") if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    [rule] = policy["spec"]["matchConstraints"]["resourceRules"]
    assert set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    assert rule["resources"] == ["*/*"]
    [who] = policy["spec"]["matchConditions"]
    assert "system:serviceaccount:gpufed-system:gpufed-agent" in who["expression"]
    reserved = next(v for v in policy["spec"]["variables"] if v["name"] == "reserved")
    for ns in ("kube-system", "kube-public", "kube-node-lease", "gpufed-system"):
        assert f"'{ns}'" in reserved["expression"]
