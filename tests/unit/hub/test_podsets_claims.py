"""Jobs that claim GPUs through DRA (gpufed.hub.rules.claims via derive_pod_sets): pods that name
ResourceClaimTemplates of the GPUJob's List are sized from them, their CEL selectors carried;
every shape gpufed cannot size exactly is refused naming the field and what is supported."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpufed.api.errors import FieldError
from gpufed.hub.rules.podsets import derive_pod_sets
from tests.unit.hub.builders import manifest_list

H100_SEL = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
MEM_SEL = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('79Gi')) >= 0"


def claim_template(
    name: str = "gpus",
    *,
    count: int | None = 4,
    selectors: list[str] = (),
    **exactly: Any,  # type: ignore[assignment]
) -> dict[str, Any]:
    """A ResourceClaimTemplate of ``count`` GPUs of class gpu.nvidia.com."""
    ex: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", **exactly}
    if count is not None:
        ex["count"] = count
    if selectors:
        ex["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": ex}]}}},
    }


def claiming_job(
    *claims: dict[str, Any], parallelism: int = 2, limits: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A batch/v1 Job of ``parallelism`` pods, each with ``claims`` in spec.resourceClaims."""
    resources: dict[str, Any] = {"claims": [{"name": c["name"]} for c in claims]}
    if limits:
        resources["limits"] = limits
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {
            "parallelism": parallelism,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "resourceClaims": list(claims),
                    "containers": [{"name": "main", "image": "t:1", "resources": resources}],
                }
            },
        },
    }


def by_template(name: str = "gpus", claim: str = "gpus") -> dict[str, str]:
    return {"name": claim, "resourceClaimTemplateName": name}


def test_pods_are_sized_from_their_claim_templates_and_carry_the_selectors() -> None:
    tpl = claim_template(count=4, selectors=[H100_SEL, MEM_SEL])
    (ps,) = derive_pod_sets(manifest_list(tpl, claiming_job(by_template(), parallelism=3)))
    assert ps.count == 3
    assert ps.gpus_per_pod == 4
    assert ps.gpus == 12
    assert ps.claim_selectors == tuple(sorted([H100_SEL, MEM_SEL]))


def test_two_templates_add_up_and_count_defaults_to_one() -> None:
    a = claim_template("a", count=None)
    b = claim_template("b", count=2, allocationMode="ExactCount")
    (ps,) = derive_pod_sets(
        manifest_list(a, b, claiming_job(by_template("a", "x"), by_template("b", "y")))
    )
    assert ps.gpus_per_pod == 3
    assert ps.claim_selectors == ()


def test_pods_without_claims_keep_the_extended_resource_path() -> None:
    job = claiming_job(by_template())
    job["spec"]["template"]["spec"].pop("resourceClaims")
    job["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": 8}
    }
    (ps,) = derive_pod_sets(manifest_list(claim_template(), job))
    assert ps.gpus_per_pod == 8
    assert ps.claim_selectors is None


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        (
            lambda t, j: j["spec"]["template"]["spec"]["resourceClaims"][0].update(
                resourceClaimName="shared", resourceClaimTemplateName=None
            ),
            "spec.template.items[1].spec.template.spec.resourceClaims[0].resourceClaimName",
            "resourceClaimTemplateName",
        ),
        (
            lambda t, j: j["spec"]["template"]["spec"]["resourceClaims"][0].update(
                resourceClaimTemplateName="elsewhere"
            ),
            "spec.template.items[1].spec.template.spec.resourceClaims[0].resourceClaimTemplateName",
            "kind: List",
        ),
        (
            lambda t, j: t["spec"]["spec"]["devices"]["requests"][0].update(
                firstAvailable=[{"name": "a", "deviceClassName": "gpu.nvidia.com"}], exactly=None
            ),
            "spec.template.items[0].spec.spec.devices.requests[0].firstAvailable",
            "exactly",
        ),
        (
            lambda t, j: t["spec"]["spec"]["devices"]["requests"][0]["exactly"].update(
                allocationMode="All"
            ),
            "spec.template.items[0].spec.spec.devices.requests[0].exactly.allocationMode",
            "ExactCount",
        ),
        (
            lambda t, j: t["spec"]["spec"]["devices"]["requests"][0]["exactly"].update(
                deviceClassName="mig.nvidia.com"
            ),
            "spec.template.items[0].spec.spec.devices.requests[0].exactly.deviceClassName",
            "gpu.nvidia.com",
        ),
        (
            lambda t, j: t["spec"]["spec"]["devices"]["requests"][0]["exactly"].update(
                selectors=[
                    {"cel": {"expression": "device.attributes['gpu.nvidia.com'].uuid == 'GPU-1'"}}
                ]
            ),
            "spec.template.items[0].spec.spec.devices.requests[0].exactly.selectors[0].cel.expression",
            "supported: device.driver",
        ),
        (
            lambda t, j: t["spec"]["spec"]["devices"]["requests"][0]["exactly"].update(
                selectors=[
                    {"cel": {"expression": "device.attributes['gpu.nvidia.com'].exists(a, true)"}}
                ]
            ),
            "spec.template.items[0].spec.spec.devices.requests[0].exactly.selectors[0].cel.expression",
            "does not evaluate",
        ),
        (
            lambda t, j: t["spec"]["spec"]["devices"].update(
                constraints=[{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]
            ),
            "spec.template.items[0].spec.spec.devices.constraints",
            "not supported",
        ),
        (
            lambda t, j: j["spec"]["template"]["spec"]["containers"][0]["resources"].update(
                limits={"nvidia.com/gpu": 1}
            ),
            "spec.template.items[1].spec.template.spec.containers",
            "one or the other",
        ),
    ],
    ids=[
        "shared-claim",
        "template-not-in-list",
        "firstAvailable",
        "allocation-all",
        "mig-class",
        "uuid-selector",
        "macro",
        "constraints",
        "both-paths",
    ],
)
def test_shapes_gpufed_cannot_size_exactly_are_refused_naming_the_field(
    change: Any, field: str, says: str
) -> None:
    tpl, job = claim_template(), claiming_job(by_template())
    change(tpl, job)
    with pytest.raises(FieldError) as err:
        derive_pod_sets(manifest_list(tpl, job))
    assert err.value.field == field
    assert says in str(err.value)


def test_the_worked_example_is_sized_from_its_claim_template() -> None:
    """manifests/examples/dra/claim-h100.yaml: 2 pods x 4 GPUs, the H100 selector carried."""
    import yaml

    from gpufed.api.gpujob import GPUJob
    from gpufed.hub.rules.podsets import placement_request

    path = Path(__file__).resolve().parents[3] / "manifests/examples/dra/claim-h100.yaml"
    obj = yaml.safe_load(path.read_text())
    obj["metadata"]["uid"] = "u-dra"
    request = placement_request(GPUJob.model_validate(obj), submitted_at=0)
    (ps,) = request.pod_sets
    assert (ps.count, ps.gpus_per_pod) == (2, 4)
    assert ps.claim_selectors is not None
    assert len(ps.claim_selectors) == 1
    assert "startsWith('NVIDIA H100')" in ps.claim_selectors[0]


def test_claimed_gpus_charge_the_queue_like_any_other() -> None:
    """Quotas count a job's claimed GPUs under the product it lands on (2 pods x 4 GPUs of
    the worked example, read from its YAML), as they count nvidia.com/gpu limits."""
    import yaml

    from gpufed.api.gpujob import GPUJob
    from gpufed.hub.rules.podsets import placement_request
    from gpufed.placement.quotausage import demand_of

    path = Path(__file__).resolve().parents[3] / "manifests/examples/dra/claim-h100.yaml"
    obj = yaml.safe_load(path.read_text())
    obj["metadata"]["uid"] = "u-dra"
    items = obj["spec"]["template"]["items"]
    count = items[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"]
    pods = items[1]["spec"]["parallelism"]
    request = placement_request(GPUJob.model_validate(obj), submitted_at=0)
    assert demand_of(request, "NVIDIA-H100-80GB-HBM3") == {"NVIDIA-H100-80GB-HBM3": count * pods}
