"""Short GPU names and per-job allocation through the hub's intake: the spec keeps what the
user wrote, the placement request (and so placement and status) carries the GFD products; an
unknown name fails the job with ``Valid=False`` naming ``spec.placement.gpuProducts[i]``."""

from __future__ import annotations

from typing import Any

import pytest

from gpufed.api.errors import FieldError
from gpufed.hub.adapters.ports import WatchEvent
from gpufed.hub.rules.podsets import placement_request
from tests.unit.hub.builders import batch_job, gpujob, gpujob_obj, hgx_node
from tests.unit.hub.term import Term, sent, settle


def test_short_names_reach_placement_as_products_and_the_spec_is_kept() -> None:
    job = gpujob(batch_job(8), placement={"gpuProducts": ["H100", "h200"]})
    req = placement_request(job, submitted_at=0)
    assert req.gpu_products == ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H200")
    assert job.spec.placement.gpu_products == ["H100", "h200"]


def test_an_unknown_gpu_name_names_the_field_and_a_close_name() -> None:
    job = gpujob(batch_job(8), placement={"gpuProducts": ["H200", "H10O"]})
    with pytest.raises(FieldError) as err:
        placement_request(job, submitted_at=0)
    assert err.value.field == "spec.placement.gpuProducts[1]"
    assert "did you mean H100" in err.value.message


@pytest.mark.parametrize("allocation", ["binpack", "spread", None])
def test_the_jobs_allocation_reaches_the_request(allocation: str | None) -> None:
    placement = {"allocation": allocation} if allocation else {}
    req = placement_request(gpujob(batch_job(8), placement=placement), submitted_at=0)
    assert req.allocation == allocation


async def one_job(products: list[str]) -> tuple[Any, list[Any]]:
    """One GPUJob asking for ``products`` through intake and a scheduling cycle, on one idle
    H100 member: (its JobState, what the member's agent was sent)."""
    t = Term()
    t.member("m1", hgx_node("n1"))
    s = t.connect("m1")
    sent(s)
    obj: dict[str, Any] = gpujob_obj("j", "u1")
    obj["spec"]["placement"] = {"gpuProducts": products}
    t.kube.objects["gpujobs"].append(obj)
    t.ctrl.intake.on_job_event(WatchEvent("ADDED", obj))
    await settle()
    await t.ctrl.scheduler.cycle()
    await settle()
    return t.ctrl.state.jobs["u1"], sent(s)


async def test_a_short_name_is_placed_and_status_shows_the_product() -> None:
    job, _ = await one_job(["H100"])
    assert job.status.phase == "Placed"
    assert job.status.placement is not None
    assert job.status.placement.gpu_product == "NVIDIA-H100-80GB-HBM3"


async def test_an_unknown_name_fails_the_job_with_a_valid_condition() -> None:
    job, to_member = await one_job(["H10O"])
    assert job.status.phase == "Failed"
    cond = next(c for c in job.status.conditions if c.type == "Valid")
    assert cond.status == "False"
    assert cond.message.startswith("spec.placement.gpuProducts[0]: unknown GPU 'H10O'")
    assert "did you mean H100" in cond.message
    assert to_member == []
