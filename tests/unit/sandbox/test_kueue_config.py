"""Pure parts of the MultiKueue sandbox (gpufed.sandbox.kueue_config, multikueue.object_path):
the Configuration rendering (client QPS/burst only when given), the webhook rewrite to
127.0.0.1 URLs, the CRDs' conversion webhook, the quota sums and the seeded certificates the
Kueue rotator accepts."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from gpufed.api.fleet import FleetSpec
from gpufed.sandbox import kueue_config as kc
from gpufed.sandbox.multikueue import MultiKueueOptions, object_path
from tests.unit.sandbox.test_webhookcerts import check_issued

SMALL_FLEET = Path(__file__).resolve().parents[2] / "fleets" / "small.yaml"
PORTS = kc.KueuePorts(webhook=9443, metrics=8443, health=8081)


def webhook_manifest() -> str:
    """A controller-gen shaped manifest: a Job, a ClusterQueue and a Pod webhook."""

    def hook(name: str, group: str, resource: str, path: str) -> dict[str, object]:
        return {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "clientConfig": {
                "service": {"name": "webhook-service", "namespace": "system", "path": path}
            },
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "rules": [
                {
                    "apiGroups": [group],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": [resource],
                }
            ],
        }

    docs = [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "mutating-webhook-configuration"},
            "webhooks": [
                hook("mjob.kb.io", "batch", "jobs", "/mutate-batch-v1-job"),
                hook("mpod.kb.io", "", "pods", "/mutate--v1-pod"),
            ],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "validating-webhook-configuration"},
            "webhooks": [
                hook("vclusterqueue.kb.io", "kueue.x-k8s.io", "clusterqueues", "/validate-cq"),
            ],
        },
    ]
    return yaml.safe_dump_all(docs)


def test_default_configuration_leaves_client_rate_limits_to_kueue() -> None:
    cfg = kc.configuration(PORTS, Path("/certs"))
    assert cfg["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert "clientConnection" not in cfg
    assert cfg["webhook"] == {"host": "127.0.0.1", "port": 9443, "certDir": "/certs"}
    assert cfg["health"]["healthProbeBindAddress"] == "127.0.0.1:8081"
    assert cfg["metrics"]["bindAddress"] == "127.0.0.1:8443"
    assert cfg["leaderElection"] == {"leaderElect": False}
    assert cfg["integrations"]["frameworks"] == ["batch/job"]
    assert cfg["featureGates"]["VisibilityOnDemand"] is False


def test_the_fast_configuration_sets_qps_and_burst() -> None:
    fast = MultiKueueOptions(qps=1000, burst=1000)
    cfg = kc.configuration(PORTS, Path("/c"), qps=fast.qps, burst=fast.burst)
    assert cfg["clientConnection"] == {"qps": 1000, "burst": 1000}


@pytest.mark.parametrize(("qps", "burst", "field"), [(0, None, "qps"), (None, -1, "burst")])
def test_a_non_positive_rate_limit_is_refused_naming_the_field(
    qps: float | None, burst: int | None, field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        kc.configuration(PORTS, Path("/c"), qps=qps, burst=burst)


def test_webhooks_point_at_the_local_url_with_the_ca_and_keep_only_kueue_and_jobs() -> None:
    out = kc.webhook_configurations(webhook_manifest(), "https://127.0.0.1:9443", "Q0E=")
    by_kind = {d["kind"]: d for d in out}
    mutating = by_kind["MutatingWebhookConfiguration"]
    assert mutating["metadata"]["name"] == kc.MUTATING_WEBHOOKS
    assert [h["name"] for h in mutating["webhooks"]] == ["mjob.kb.io"]
    assert mutating["webhooks"][0]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-batch-v1-job",
        "caBundle": "Q0E=",
    }
    validating = by_kind["ValidatingWebhookConfiguration"]
    assert validating["metadata"]["name"] == kc.VALIDATING_WEBHOOKS
    assert validating["webhooks"][0]["clientConfig"]["url"].endswith("/validate-cq")


def test_a_manifest_without_webhook_configurations_is_an_error() -> None:
    with pytest.raises(ValueError, match="no Mutating"):
        kc.webhook_configurations("kind: ConfigMap\n", "https://x", "")


def test_conversion_crds_get_the_local_conversion_webhook_and_others_do_not() -> None:
    texts = [
        yaml.safe_dump(
            {
                "kind": "CustomResourceDefinition",
                "metadata": {"name": n, "annotations": {"a": "b"}},
                "spec": {"group": "kueue.x-k8s.io"},
            }
        )
        for n in ("workloads.kueue.x-k8s.io", "resourceflavors.kueue.x-k8s.io")
    ]
    rf, wl = kc.crds(texts, "https://127.0.0.1:1", "Q0E=")
    assert rf["metadata"] == {"name": "resourceflavors.kueue.x-k8s.io"}
    assert "conversion" not in rf["spec"]
    conv = wl["spec"]["conversion"]
    assert conv["strategy"] == "Webhook"
    assert conv["webhook"]["clientConfig"] == {
        "url": "https://127.0.0.1:1/convert",
        "caBundle": "Q0E=",
    }


def test_quota_sums_the_members_node_allocatable() -> None:
    fleet = FleetSpec.load(SMALL_FLEET)
    alpha = kc.cluster_quota([fleet.cluster("alpha")])
    # 2 HGX nodes x 8 GPUs + 1 A100 node with 2 of 8 GPUs split into MIG: 16 + 6.
    assert alpha["nvidia.com/gpu"] == "22"
    total = kc.cluster_quota(fleet.clusters)
    assert total["nvidia.com/gpu"] == str(22 + 4 * 4)
    assert int(total["cpu"]) > 0
    assert int(total["memory"]) > int(alpha["memory"])


def test_manager_cluster_queue_carries_the_multikueue_admission_check() -> None:
    cq = kc.cluster_queue({"nvidia.com/gpu": "8"}, admission_check=kc.ADMISSION_CHECK)
    assert cq["spec"]["admissionChecksStrategy"] == {
        "admissionChecks": [{"name": kc.ADMISSION_CHECK}]
    }
    assert kc.cluster_queue({"cpu": "1"})["spec"].get("admissionChecksStrategy") is None
    assert kc.admission_check()["spec"]["controllerName"] == "kueue.x-k8s.io/multikueue"


def test_seeded_certificates_pass_the_rotator_checks_and_name_127_0_0_1() -> None:
    certs = kc.create_kueue_certs()
    check_issued(
        certs,
        ca_name="kueue-ca",
        organization="kueue",
        service="kueue-webhook-service.kueue-system.svc",
    )
    secret = kc.webhook_secret(certs)
    assert secret["metadata"] == {"name": kc.WEBHOOK_SECRET, "namespace": kc.KUEUE_NAMESPACE}
    assert base64.b64decode(secret["data"]["ca.crt"]) == certs.ca_crt
    assert set(secret["data"]) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}


def test_object_paths_of_cluster_and_namespaced_kinds() -> None:
    assert object_path(kc.local_queue("bench")) == (
        "/apis/kueue.x-k8s.io/v1beta2/namespaces/bench/localqueues/gpufed-bench"
    )
    assert object_path(kc.multikueue_cluster("alpha")) == (
        "/apis/kueue.x-k8s.io/v1beta2/multikueueclusters/alpha"
    )
    assert object_path(kc.kubeconfig_secret("alpha", "x")) == (
        "/api/v1/namespaces/kueue-system/secrets/multikueue-alpha"
    )


@pytest.mark.parametrize(
    "kwargs",
    [{"qps": -1.0}, {"qps": 0.0}, {"qps": float("nan")}, {"qps": float("inf")}, {"burst": 0}],
)
def test_bad_client_rates_are_refused_before_anything_starts(kwargs: dict[str, float]) -> None:
    # --kueue-qps -1 was refused only after a 107 s sandbox start, and nan rendered `qps: .nan`.
    from pydantic import ValidationError

    from gpufed.sandbox.multikueue import MultiKueueOptions

    with pytest.raises(ValidationError):
        MultiKueueOptions(**kwargs)
