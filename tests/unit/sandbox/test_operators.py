"""The workload operators of the sandbox (gpufed.sandbox.operators, issue 28): the fleet field
that chooses them, their pinned builds (the fake `go` of conftest.py: own directories, stamps,
the build-info check), and what is rendered for a manager outside a pod (webhooks pointed at
127.0.0.1 with upstream's patches applied, certificates a rotator keeps, process command
lines). The real operators run in tests/e2e/test_12_operators.py."""

from __future__ import annotations

import base64
import textwrap
from pathlib import Path

import pytest

from gpufed.api.fleet import KNOWN_OPERATORS, FleetError, FleetSpec
from gpufed.sandbox import binaries as b
from gpufed.sandbox import operators as o
from tests.unit.sandbox.test_webhookcerts import check_issued

POOL = "nodePools: [{name: p, nodes: 1, gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8}}]"


def fleet(ops: str) -> FleetSpec:
    return FleetSpec.loads(f"clusters:\n  - name: a\n    operators: {ops}\n    {POOL}\n")


def test_a_fleet_chooses_operators_per_member_and_unknown_names_name_the_field() -> None:
    assert fleet("[jobset, kuberay]").clusters[0].operators == ("jobset", "kuberay")
    assert FleetSpec.loads(f"clusters:\n  - name: a\n    {POOL}\n").clusters[0].operators == ()
    with pytest.raises(FleetError) as err:
        fleet("[jobset, ray]")
    assert "clusters[0].operators" in str(err.value)
    assert "unknown operator 'ray'; choose from jobset, training-operator, kuberay" in str(
        err.value
    )
    with pytest.raises(FleetError, match=r"operators\[1\]: 'jobset' is listed twice"):
        fleet("[jobset, jobset]")


def test_every_known_operator_has_a_recipe_pinning_the_issue_versions() -> None:
    assert tuple(o.OPERATORS) == KNOWN_OPERATORS
    assert {n: op.tool.version() for n, op in o.OPERATORS.items()} == {
        "jobset": "v0.11.1",
        "training-operator": "v1.8.1",
        "kuberay": "v1.5.0",
    }


def test_operators_build_into_their_own_directories_and_are_checked_by_build_info(
    fake_go: Path, recipe: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, op in o.OPERATORS.items():
        path = op.tool.build(gobuild=recipe)
        version = op.tool.version(recipe)
        assert path == tmp_path / "cache" / "bin" / f"{name}-{version}_go1.26.8" / name
        assert b.read_stamp(path.parent)["pins"] == {name: version, "go": "go1.26.8"}
        # present and current: found without Go, and not built again
        assert op.tool.find(recipe) == path
    builds = [ln for ln in fake_go.read_text().splitlines() if " build " in ln]
    assert len(builds) == 3
    assert "sigs.k8s.io/jobset/pkg/version.GitVersion=v0.11.1" in builds[0]
    monkeypatch.setenv("FAKE_OPERATOR", "v0.0.1")
    with pytest.raises(
        b.BinariesError, match=r"not a workload operator built from sigs.k8s.io/jobset v0.11.1"
    ):
        o.JOBSET.tool.build(gobuild=recipe, force=True)


@pytest.fixture
def module(tmp_path: Path) -> Path:
    """A module laid out as JobSet's: a webhook manifest and a kustomize JSON patch."""
    d = tmp_path / "jobset"
    hooks = d / "config/components/webhook"
    (hooks / "patches").mkdir(parents=True)
    svc = "clientConfig: {service: {name: webhook-service, namespace: system, path: %s}}"
    (hooks / "manifests.yaml").write_text(
        textwrap.dedent(f"""\
        apiVersion: admissionregistration.k8s.io/v1
        kind: MutatingWebhookConfiguration
        metadata: {{name: mutating-webhook-configuration}}
        webhooks:
        - name: mjobset.kb.io
          {svc % "/mutate-jobset"}
          rules: [{{apiGroups: [jobset.x-k8s.io], resources: [jobsets]}}]
        - name: mpod.kb.io
          {svc % "/mutate--v1-pod"}
          rules: [{{apiGroups: [""], resources: [pods]}}]
        - name: mother.kb.io
          {svc % "/mutate-other"}
          rules: [{{apiGroups: [x], resources: [others]}}]
        """)
    )
    (hooks / "patches/mutating-patch.yaml").write_text(
        textwrap.dedent(f"""\
        - op: replace
          path: /webhooks/1
          value:
            name: mpod.kb.io
            {svc % "/mutate--v1-pod"}
            objectSelector: {{matchExpressions: [{{key: jobset.sigs.k8s.io/jobset-name, operator: Exists}}]}}
            rules: [{{apiGroups: [""], resources: [pods]}}]
        """)
    )
    (hooks / "patches/validating-patch.yaml").write_text("[]\n")
    return d


def test_webhooks_point_at_the_local_url_with_upstreams_patches_and_only_the_operators_resources(
    module: Path,
) -> None:
    (mutating,) = o.webhook_configurations(o.JOBSET, module, "https://127.0.0.1:9443", "Q0E=")
    assert mutating["metadata"] == {"name": "jobset-mutating-webhook-configuration"}
    by_name = {h["name"]: h for h in mutating["webhooks"]}
    assert set(by_name) == {"mjobset.kb.io", "mpod.kb.io"}  # "others" is not JobSet's
    assert by_name["mpod.kb.io"]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate--v1-pod",
        "caBundle": "Q0E=",
    }
    # the pod webhook only for the JobSet's own pods, as upstream's kustomization patches it
    assert by_name["mpod.kb.io"]["objectSelector"]["matchExpressions"][0]["key"] == (
        "jobset.sigs.k8s.io/jobset-name"
    )
    assert "objectSelector" not in by_name["mjobset.kb.io"]
    assert o.webhook_configurations(o.KUBERAY, module, "https://x", "Q0E=") == []


def test_a_patch_of_another_shape_is_refused_naming_the_file(module: Path) -> None:
    (module / "config/components/webhook/patches/mutating-patch.yaml").write_text(
        "- {op: add, path: /webhooks/-, value: {}}\n"
    )
    with pytest.raises(ValueError, match=r"mutating-patch.yaml: unsupported patch op 'add'"):
        o.webhook_configurations(o.JOBSET, module, "https://x", "Q0E=")


def test_the_training_operators_certificates_verify_as_its_rotator_checks(tmp_path: Path) -> None:
    certs = o.create_certs(o.TRAINING_OPERATOR)
    c = o.TRAINING_OPERATOR.certs
    assert (c.ca_name, c.service) == ("training-operator-ca", "training-operator.kubeflow.svc")
    check_issued(certs, ca_name=c.ca_name, organization=c.organization, service=c.service)
    crd = tmp_path / "manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
    crd.parent.mkdir(parents=True)
    crd.write_text(
        "kind: CustomResourceDefinition\nmetadata: {name: pytorchjobs.kubeflow.org}\n"
        "spec: {versions: [{name: v1}]}\n"
    )
    hooks = tmp_path / "manifests/base/webhook/manifests.yaml"
    hooks.parent.mkdir(parents=True)
    hooks.write_text("kind: ValidatingWebhookConfiguration\nwebhooks: []\n")
    objs = o.objects(o.TRAINING_OPERATOR, tmp_path, o.OperatorPorts(1, 2, 3), certs)
    assert [x["kind"] for x in objs] == [
        "Namespace",
        "Secret",
        "CustomResourceDefinition",
        "ValidatingWebhookConfiguration",
    ]
    # the configuration its rotator injects the CA into
    assert objs[3]["metadata"]["name"] == "validator.training-operator.kubeflow.org"
    secret = objs[1]
    assert secret["kind"] == "Secret"
    assert secret["metadata"] == {"name": "training-operator-webhook-cert", "namespace": "kubeflow"}
    assert base64.b64decode(secret["data"]["ca.crt"]) == certs.ca_crt


def test_each_operator_process_listens_on_127_0_0_1_without_leader_election(tmp_path: Path) -> None:
    ports = o.OperatorPorts(webhook=9443, metrics=8443, health=8081)
    kc = tmp_path / "kubeconfig"
    js = o.component(o.JOBSET, "m1", Path("/bin/jobset"), kc, ports, tmp_path)
    assert js.name == "jobset/m1"
    assert js.env["KUBECONFIG"] == str(kc)
    assert js.probe.url == "http://127.0.0.1:8081/readyz"
    cfg = o.jobset_configuration(ports, tmp_path / "certs")
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 9443, "certDir": str(tmp_path / "certs")}
    assert cfg["leaderElection"] == {"leaderElect": False}
    assert cfg["internalCertManagement"] == {"enable": False}
    to = o.component(o.TRAINING_OPERATOR, "m1", Path("/bin/to"), kc, ports, tmp_path)
    assert "--enable-scheme=pytorchjob" in to.argv
    assert "--leader-elect=false" in to.argv
    assert to.env["TMPDIR"] == str(tmp_path / "tmp")
    ray = o.component(o.KUBERAY, "m1", Path("/bin/kuberay"), kc, ports, tmp_path)
    assert "--enable-leader-election=false" in ray.argv
    assert ray.ports == [8081]  # no webhook: KubeRay's is off by default upstream


def test_ports_are_named_per_operator_and_member() -> None:
    f = FleetSpec.loads(
        f"clusters:\n  - name: a\n    operators: [jobset]\n    {POOL}\n"
        f"  - name: b\n    operators: [jobset, kuberay]\n    {POOL}\n  - name: c\n    {POOL}\n"
    )
    names = o.port_names(f)
    assert names == [
        f"{op}/{m}/{kind}"
        for m, op in [("a", "jobset"), ("b", "jobset"), ("b", "kuberay")]
        for kind in ("webhook", "metrics", "health")
    ]
    assert [op.name for op in o.used_operators(f)] == ["jobset", "kuberay"]
    ports = dict(zip(names, range(1000, 1000 + len(names)), strict=True))
    assert o.ports_of(o.KUBERAY, "b", ports) == o.OperatorPorts(1006, 1007, 1008)


def test_crd_schemas_lose_their_description_texts_but_not_a_field_named_description() -> None:
    schema = {
        "type": "object",
        "description": "A job.",
        "properties": {
            "description": {"type": "string", "description": "the user's description field"},
            "items": {"type": "array", "items": [{"type": "string", "description": "x"}]},
        },
    }
    assert o.without_descriptions(schema) == {
        "type": "object",
        "properties": {
            "description": {"type": "string"},
            "items": {"type": "array", "items": [{"type": "string"}]},
        },
    }
